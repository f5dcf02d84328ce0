"""Typed reading of a bundle's JSON: the one parser (`parse_json`) and field access (`Fields`).

Errors name the file and the dotted field. A bundle comes from anyone, so
`parse_json` refuses what Python's json module would accept but a reader
should not: duplicate keys (which one wins?), NaN and Infinity (not JSON),
integers of more than `MAX_INT_DIGITS` digits, nesting deeper than
`MAX_DEPTH`; and `Fields` bounds every number, length and string before use.
"""

from __future__ import annotations

import json
import math
import os
import re

from .errors import UsageError, safe

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_DEPTH = 32  # manifest.json nests 6 deep
MAX_INT_DIGITS = 20  # every integer of the format fits in int64
MAX_STRING = 1000  # characters of a string field the device uses
MAX_NAME_BYTES = 255  # a file name, as file systems bound it
MAX_RANK = 8
MAX_DIM = 1 << 24
MAX_ELEMENTS = 1 << 26  # of one tensor or array the manifest describes


def _max_depth(data: object) -> int:
    """Nesting depth of decoded JSON, without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                return depth
            stack.extend((v, depth + 1) for v in value)
    return deepest


def parse_json(data: bytes | str, where: str | os.PathLike) -> object:
    """Decode one JSON document from a bundle, strictly; UsageError naming `where`.

    Refuses invalid UTF-8, duplicate keys, NaN / Infinity, integers longer
    than `MAX_INT_DIGITS` digits, floats that overflow and nesting deeper
    than `MAX_DEPTH`. Size is bounded by the caller (`files.read_inside`).
    """

    def pairs(items: list[tuple[str, object]]) -> dict:
        found: dict = {}
        for key, value in items:
            if key in found:
                raise UsageError(f"not valid JSON: key {safe(key, 80)!r} appears twice", where)
            found[key] = value
        return found

    def constant(name: str):
        raise UsageError(f"not valid JSON: {name} is not a JSON number", where)

    def integer(text: str) -> int:
        if len(text.lstrip("-")) > MAX_INT_DIGITS:
            raise UsageError(
                f"integer of {len(text)} digits (at most {MAX_INT_DIGITS} are read)", where
            )
        return int(text)

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise UsageError(f"number {safe(text, 40)} is out of range", where)
        return value

    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError("not valid JSON (not UTF-8 text)", where) from None
    # Cheap bound before the decoder recurses: nesting needs an opening bracket per level.
    if data.count("[") + data.count("{") > MAX_DEPTH and _bracket_depth(data) > MAX_DEPTH:
        raise UsageError(f"not valid JSON here: nested more than {MAX_DEPTH} deep", where)
    try:
        decoded = json.loads(
            data,
            object_pairs_hook=pairs,
            parse_constant=constant,
            parse_int=integer,
            parse_float=number,
        )
    except json.JSONDecodeError as exc:
        raise UsageError(f"not valid JSON ({exc})", where) from None
    except (RecursionError, ValueError) as exc:  # ValueError: a surrogate, a huge exponent
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"not valid JSON ({type(exc).__name__})", where) from None
    if _max_depth(decoded) > MAX_DEPTH:
        raise UsageError(f"not valid JSON here: nested more than {MAX_DEPTH} deep", where)
    return decoded


def _bracket_depth(text: str) -> int:
    """The deepest bracket nesting of JSON text, strings skipped (linear, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    return deepest
        elif char in "]}":
            depth -= 1
    return deepest


def filename_problem(value: object) -> str | None:
    """Why `value` cannot be the name of a file directly inside a bundle, or None."""
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {kind(value)}"
    if "/" in value or "\\" in value or value in (".", "..") or "\0" in value:
        return f"must name a file inside the bundle, got {safe(value, 80)!r}"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
        return f"must not hold control characters, got {safe(value, 80)!r}"
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        return f"is not valid Unicode text, got {safe(value, 80)!r}"
    if len(encoded) > MAX_NAME_BYTES:
        return f"is {len(encoded)} bytes long; a file name has at most {MAX_NAME_BYTES}"
    return None


def kind(value: object) -> str:
    """A JSON value's type as a message names it."""
    return "null" if value is None else type(value).__name__


class Fields:
    """Field access for one JSON document.

    Args:
        where: the file, as messages name it.
    """

    def __init__(self, where: str | os.PathLike):
        self.where = where

    def fail(self, field: str, problem: str) -> UsageError:
        return UsageError(f"field '{field}' {problem}", self.where)

    def get(self, data: dict, key: str, prefix: str = ""):
        if key not in data:
            raise UsageError(f"missing field '{prefix}{key}'", self.where)
        return data[key]

    def obj(self, data: dict, key: str, prefix: str = "") -> dict:
        value = self.get(data, key, prefix)
        if not isinstance(value, dict):
            raise self.fail(prefix + key, f"must be an object, got {kind(value)}")
        return value

    def string(self, data: dict, key: str, prefix: str = "", limit: int = MAX_STRING) -> str:
        value = self.get(data, key, prefix)
        if not isinstance(value, str) or not value:
            raise self.fail(prefix + key, f"must be a non-empty string, got {kind(value)}")
        if len(value) > limit:
            raise self.fail(prefix + key, f"is {len(value)} characters long (at most {limit})")
        return value

    def integer(
        self,
        data: dict,
        key: str,
        prefix: str = "",
        minimum: int = 0,
        maximum: int = 2**31 - 1,
    ) -> int:
        value = self.get(data, key, prefix)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self.fail(
                prefix + key,
                f"must be an integer from {minimum} to {maximum}, got {safe(repr(value), 60)}",
            )
        return value

    def number(self, data: dict, key: str, prefix: str = "") -> float:
        value = self.get(data, key, prefix)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self.fail(prefix + key, f"must be a finite number, got {safe(repr(value), 60)}")
        return float(value)

    def numbers(
        self, data: dict, key: str, known: list[str], prefix: str = "", required: tuple = ()
    ) -> dict[str, float]:
        """`data[key]`: an object of finite numbers named in `known` (`required` ones present).

        A null is an error, like any other non-number. Used by the thresholds
        of both checks.
        """
        raw = self.obj(data, key, prefix)
        if not raw:
            raise self.fail(prefix + key, "is empty")
        for name in raw:
            if name not in known:
                raise self.fail(
                    prefix + key, f"has unknown key {safe(name, 60)!r} (known: {', '.join(known)})"
                )
        inner = f"{prefix}{key}."
        return {
            name: self.number(raw, name, inner) for name in known if name in required or name in raw
        }

    def shape(self, data: dict, key: str, prefix: str = "") -> tuple[int, ...]:
        value = self.get(data, key, prefix)
        if (
            not isinstance(value, list)
            or not 0 < len(value) <= MAX_RANK
            or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 < d <= MAX_DIM for d in value
            )
        ):
            raise self.fail(
                prefix + key,
                f"must be a list of 1 to {MAX_RANK} integers from 1 to {MAX_DIM}, "
                f"got {safe(repr(value), 80)}",
            )
        if math.prod(value) > MAX_ELEMENTS:
            raise self.fail(
                prefix + key, f"has {math.prod(value)} elements (at most {MAX_ELEMENTS})"
            )
        return tuple(value)

    def sha256(self, data: dict, key: str, prefix: str = "") -> str:
        value = self.string(data, key, prefix)
        if not _SHA256.match(value):
            raise self.fail(prefix + key, "must be 64 lowercase hex digits")
        return value

    def filename(self, data: dict, key: str, prefix: str = "") -> str:
        value = self.get(data, key, prefix)
        problem = filename_problem(value)
        if problem:
            raise self.fail(prefix + key, problem)
        return value

    def optional(self, data: dict, key: str, types: type | tuple[type, ...], prefix: str = ""):
        """`data[key]` if present and not null, else None; wrong type is an error."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)
        ):
            raise self.fail(prefix + key, f"must be {_names(types)}, got {safe(repr(value), 60)}")
        if not isinstance(value, types):
            raise self.fail(prefix + key, f"must be {_names(types)}, got {kind(value)}")
        return value


def lenient_figures(data: object, names: list[str]) -> list[float | None] | None:
    """Informative figures read leniently: the values of `names` (None where absent
    or null), or None when `data` is not an object or any of them is not a number."""
    if not isinstance(data, dict):
        return None
    values = [data.get(name) for name in names]
    if not all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values
    ):
        return None
    return values


def _names(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)
