"""Typed reading of a decoded JSON object; errors name the file and the dotted field."""

from __future__ import annotations

import math
import os
import re

from ..errors import UsageError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


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

    def string(self, data: dict, key: str, prefix: str = "") -> str:
        value = self.get(data, key, prefix)
        if not isinstance(value, str) or not value:
            raise self.fail(prefix + key, f"must be a non-empty string, got {kind(value)}")
        return value

    def integer(self, data: dict, key: str, prefix: str = "", minimum: int = 0) -> int:
        value = self.get(data, key, prefix)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(prefix + key, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def number(self, data: dict, key: str, prefix: str = "") -> float:
        value = self.get(data, key, prefix)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self.fail(prefix + key, f"must be a finite number, got {value!r}")
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
                    prefix + key, f"has unknown key {name!r} (known: {', '.join(known)})"
                )
        inner = f"{prefix}{key}."
        return {
            name: self.number(raw, name, inner) for name in known if name in required or name in raw
        }

    def shape(self, data: dict, key: str, prefix: str = "") -> tuple[int, ...]:
        value = self.get(data, key, prefix)
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)
        ):
            raise self.fail(prefix + key, f"must be a list of positive integers, got {value!r}")
        return tuple(value)

    def sha256(self, data: dict, key: str, prefix: str = "") -> str:
        value = self.string(data, key, prefix)
        if not _SHA256.match(value):
            raise self.fail(prefix + key, "must be 64 lowercase hex digits")
        return value

    def filename(self, data: dict, key: str, prefix: str = "") -> str:
        value = self.string(data, key, prefix)
        if "/" in value or "\\" in value or value in (".", "..") or "\0" in value:
            raise self.fail(prefix + key, f"must name a file inside the bundle, got {value!r}")
        return value

    def optional(self, data: dict, key: str, types: type | tuple[type, ...], prefix: str = ""):
        """`data[key]` if present and not null, else None; wrong type is an error."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)
        ):
            raise self.fail(prefix + key, f"must be {_names(types)}, got {value!r}")
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
