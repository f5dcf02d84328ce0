"""Mutations of a bundle, as small JSON recipes applied to a fixture bundle (tests/fuzz/).

A recipe is a dict; `apply(bundle_dir, recipe)` edits a copy in place:

- `{"kind": "json", "file": F, "path": [k, ...], "value": V}`: set a field of a
  JSON file (`"delete": true` removes it); `{"kind": "raw_json", "file": F,
  "text": T}` replaces the whole file's text.
- `{"kind": "bytes", "file": F, "offset": i, "xor": b}`: flip bits of one byte;
  `{"kind": "truncate", "file": F, "size": n}`; `{"kind": "append", ...}`.
- `{"kind": "tflite", "file": F, "site": i, "value": V}`: a flatbuffer field of
  a model (`flatbuffer_sites`: signature subgraph indices, tensor indices of
  signatures, subgraphs and operators, tensor types and buffers, quantization
  scales and zero points, shapes, opcode indices), edited in place.
- `{"kind": "npz", "file": F, "member": M, "payload": "not-npy" | "bomb" |
  "bad-deflate" | "shape"}`: a hostile archive member.

Every recipe then sets the file's sha256 (and bytes) in manifest.json
(`"fix_sha": false` keeps the old one), so the mutation gets past the checksum
as an attacker's would. No binary is stored: recipes are replayed on the
fixture (tests/fuzz/regressions/*.json).
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import random
import struct
import zipfile

import numpy as np

HOSTILE_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1,
    5,
    1.5,
    -1e308,
    1e308,
    2**31,
    2**63,
    -(2**63),
    "10" * 40,
    "",
    "x" * 300,
    "\u001b[31mred\u001b[0m",
    "a\nb",
    "\ud800",
    "../etc/passwd",
    "/dev/zero",
    "manifest.json",
    [],
    {},
    [1] * 50,
    {"a": {"b": {"c": []}}},
    "NaN",
    [None],
    [0],
    [-1],
    [1, 8, 8],
    [10**7],
    "float32",
    "int8",
    "(a+)+b",
]
NUMBER_TEXTS = ["NaN", "Infinity", "-Infinity", "1" * 5000, "1e400", "1" * 25, "-0"]

# table field ids of the TFLite schema (tensorflow/lite/schema/schema.fbs)
MODEL_SUBGRAPHS, MODEL_SIGNATURES = 2, 7
SUBGRAPH_TENSORS, SUBGRAPH_INPUTS, SUBGRAPH_OUTPUTS, SUBGRAPH_OPERATORS = 0, 1, 2, 3
TENSOR_SHAPE, TENSOR_TYPE, TENSOR_BUFFER, TENSOR_QUANT = 0, 1, 2, 4
QUANT_SCALE, QUANT_ZERO = 2, 3
OP_OPCODE, OP_INPUTS, OP_OUTPUTS = 0, 1, 2
SIG_INPUTS, SIG_OUTPUTS, SIG_SUBGRAPH = 0, 1, 4
MAP_TENSOR = 1


class _Flat:
    def __init__(self, data: bytes):
        self.data = data

    def u32(self, at: int) -> int:
        return struct.unpack_from("<I", self.data, at)[0]

    def field(self, table: int, index: int) -> int | None:
        """Absolute offset of a table's field, or None when absent."""
        vtable = table - struct.unpack_from("<i", self.data, table)[0]
        size = struct.unpack_from("<H", self.data, vtable)[0]
        slot = 4 + 2 * index
        if slot + 2 > size:
            return None
        rel = struct.unpack_from("<H", self.data, vtable + slot)[0]
        return table + rel if rel else None

    def ref(self, at: int) -> int:
        return at + self.u32(at)

    def vector(self, table: int, index: int) -> tuple[int, int] | None:
        """(start of elements, length) of a vector field."""
        at = self.field(table, index)
        if at is None:
            return None
        vec = self.ref(at)
        return vec + 4, self.u32(vec)

    def tables(self, table: int, index: int) -> list[int]:
        found = self.vector(table, index)
        if found is None:
            return []
        start, n = found
        return [self.ref(start + 4 * i) for i in range(n)]


def flatbuffer_sites(data: bytes) -> list[dict]:
    """Editable scalar fields of a TFLite model: {"offset", "type", "what"}."""
    fb = _Flat(data)
    root = fb.u32(0)
    sites: list[dict] = []

    def add(at, kind, what):
        if at is not None:
            sites.append({"offset": at, "type": kind, "what": what})

    def ints(table, index, what, kind="i32"):
        found = fb.vector(table, index)
        if found:
            start, n = found
            for i in range(min(n, 16)):
                add(start + 4 * i, kind, f"{what}[{i}]")

    for s, sub in enumerate(fb.tables(root, MODEL_SUBGRAPHS)):
        ints(sub, SUBGRAPH_INPUTS, f"subgraph{s}.inputs")
        ints(sub, SUBGRAPH_OUTPUTS, f"subgraph{s}.outputs")
        for t, tensor in enumerate(fb.tables(sub, SUBGRAPH_TENSORS)[:64]):
            add(fb.field(tensor, TENSOR_TYPE), "i8", f"subgraph{s}.tensor{t}.type")
            add(fb.field(tensor, TENSOR_BUFFER), "u32", f"subgraph{s}.tensor{t}.buffer")
            ints(tensor, TENSOR_SHAPE, f"subgraph{s}.tensor{t}.shape")
            quant = fb.field(tensor, TENSOR_QUANT)
            if quant is not None:
                q = fb.ref(quant)
                found = fb.vector(q, QUANT_SCALE)
                if found and found[1]:
                    add(found[0], "f32", f"subgraph{s}.tensor{t}.scale")
                found = fb.vector(q, QUANT_ZERO)
                if found and found[1]:
                    add(found[0], "i64", f"subgraph{s}.tensor{t}.zero_point")
        for o, op in enumerate(fb.tables(sub, SUBGRAPH_OPERATORS)[:64]):
            add(fb.field(op, OP_OPCODE), "u32", f"subgraph{s}.op{o}.opcode_index")
            ints(op, OP_INPUTS, f"subgraph{s}.op{o}.inputs")
            ints(op, OP_OUTPUTS, f"subgraph{s}.op{o}.outputs")
    for g, sig in enumerate(fb.tables(root, MODEL_SIGNATURES)):
        add(fb.field(sig, SIG_SUBGRAPH), "u32", f"signature{g}.subgraph_index")
        for side, index in (("inputs", SIG_INPUTS), ("outputs", SIG_OUTPUTS)):
            for m, tmap in enumerate(fb.tables(sig, index)):
                add(fb.field(tmap, MAP_TENSOR), "u32", f"signature{g}.{side}{m}.tensor_index")
    return sites


_PACK = {"i8": "<b", "i32": "<i", "u32": "<I", "f32": "<f", "i64": "<q"}
SITE_VALUES = {
    "i8": [-1, 0, 1, 2, 3, 9, 17, 100, 127],
    "i32": [-1, -2, 0, 1, 2, 1000, 2**31 - 1],
    "u32": [0, 1, 2, 3, 1000, 2**31 - 1, 2**32 - 1],
    "f32": [float("nan"), float("inf"), -1.0, 0.0, 1e-30, 1e30, 1e-45, 3.0e38],
    "i64": [-1, 127, 128, -129, 2**31, -(2**63), 2**63 - 1],
}


def _set_path(data, path, value, delete=False):
    node = data
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _npz_member(kind: str, original: bytes, member: str | None = None) -> bytes:
    """The archive `original` with one real member (`member`, default its first)
    replaced by a hostile payload, the others kept: so the app refuses the
    payload itself, not a member name it does not know."""
    with zipfile.ZipFile(io.BytesIO(original)) as archive:
        kept = [(info.filename, archive.read(info)) for info in archive.infolist()]
    names = [name for name, _ in kept]
    if member is not None and f"{member}.npy" not in names:
        raise ValueError(f"no member {member!r} in the archive (it has {names})")
    target = names[0] if member is None else f"{member}.npy"
    if kind == "not-npy":
        payload = b"hello, not an array"
    elif kind == "bad-deflate":
        payload = _npy(np.arange(4096, dtype=np.float32))
    elif kind == "bomb":  # a valid header, then 64 MiB of zeros: ~64 KiB deflated
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f4", "fortran_order": False, "shape": (16 * 1024 * 1024,)}
        )
        payload = header.getvalue() + bytes(64 * 1024 * 1024)
    elif kind == "shape":
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)}
        )
        payload = header.getvalue() + b"\0" * 64
    else:
        raise ValueError(f"unknown npz payload {kind!r}")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in kept:
            archive.writestr(name, payload if name == target else data)
    data = bytearray(buffer.getvalue())
    if kind == "bad-deflate":  # flip 40 bytes inside that member's deflate stream
        with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
            info = archive.getinfo(target)
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        for i in range(start, min(start + 40, start + info.compress_size)):
            data[i] ^= 0xFF
    return bytes(data)


def apply(bundle: pathlib.Path, recipe: dict) -> None:
    """Apply one recipe to the bundle directory `bundle` (a private copy)."""
    kind, name = recipe["kind"], recipe.get("file", "manifest.json")
    path = bundle / name
    if kind == "json":
        data = json.loads(path.read_text())
        _set_path(data, recipe["path"], recipe.get("value"), recipe.get("delete", False))
        path.write_text(json.dumps(data))
    elif kind == "raw_json":
        path.write_text(recipe["text"], encoding="utf-8", errors="surrogatepass")
    elif kind == "bytes":
        data = bytearray(path.read_bytes())
        data[recipe["offset"] % len(data)] ^= recipe["xor"] or 1
        path.write_bytes(bytes(data))
    elif kind == "truncate":
        path.write_bytes(path.read_bytes()[: recipe["size"]])
    elif kind == "append":
        path.write_bytes(path.read_bytes() + bytes.fromhex(recipe["hex"]))
    elif kind == "tflite":
        data = bytearray(path.read_bytes())
        sites = flatbuffer_sites(bytes(data))
        named = [s for s in sites if s["what"] == recipe.get("what")]
        site = named[0] if named else sites[recipe["site"] % len(sites)]
        value = recipe["value"]
        fmt = _PACK[site["type"]]
        if site["type"] == "f32":
            value = float(value)
        else:
            bits = struct.calcsize(fmt) * 8
            low = -(2 ** (bits - 1)) if fmt[-1].islower() else 0
            value = max(low, min(int(value), low + 2**bits - 1))
        struct.pack_into(fmt, data, site["offset"], value)
        path.write_bytes(bytes(data))
    elif kind == "npz":
        path.write_bytes(_npz_member(recipe["payload"], path.read_bytes(), recipe.get("member")))
    else:
        raise ValueError(f"unknown recipe kind {kind!r}")
    if recipe.get("fix_sha", True) and name != "manifest.json" and path.exists():
        fix_checksum(bundle, name)


def fix_checksum(bundle: pathlib.Path, name: str) -> None:
    """Set every manifest entry naming `name` to its new sha256 (and bytes)."""
    manifest_path = bundle / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError:
        return
    data = (bundle / name).read_bytes()
    digest = hashlib.sha256(data).hexdigest()

    def walk(node):
        if isinstance(node, dict):
            if node.get("file") == name and "sha256" in node:
                node["sha256"] = digest
                if "bytes" in node:
                    node["bytes"] = len(data)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(manifest)
    manifest_path.write_text(json.dumps(manifest, indent=1))


def json_paths(data, prefix=()) -> list[list]:
    """Every path to a value in decoded JSON (dict keys and list indices)."""
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            found.append([*prefix, key])
            found.extend(json_paths(value, (*prefix, key)))
    elif isinstance(data, list):
        for i, value in enumerate(data[:4]):
            found.append([*prefix, i])
            found.extend(json_paths(value, (*prefix, i)))
    return found


def random_recipe(bundle: pathlib.Path, rng: random.Random) -> dict:
    """One random mutation of the fixture `bundle` (read, not changed)."""
    models = sorted(p.name for p in bundle.glob("*.tflite"))
    roll = rng.random()
    if roll < 0.3:
        name = rng.choice(["manifest.json"] * 6 + ["vocab.json", "labels.json"])
        if not (bundle / name).exists():
            name = "manifest.json"
        data = json.loads((bundle / name).read_text())
        paths = json_paths(data)
        if not paths:
            return {"kind": "raw_json", "file": name, "text": rng.choice(NUMBER_TEXTS)}
        return {
            "kind": "json",
            "file": name,
            "path": rng.choice(paths),
            "value": rng.choice(HOSTILE_VALUES),
            "delete": rng.random() < 0.1,
        }
    if roll < 0.4:
        name = rng.choice(["manifest.json", "vocab.json", "labels.json"])
        text = (bundle / name).read_text() if (bundle / name).exists() else "{}"
        edits = [
            lambda t: t.replace("0", rng.choice(NUMBER_TEXTS), 1),
            lambda t: "[" * 2000 + "]" * 2000,
            lambda t: t.replace("{", '{"format": 1, ', 1),  # a duplicate key
            lambda t: t.replace(":", ": " + "[" * 40, 1),
            lambda t: t.replace('"', '"\\ud800', 2),
            lambda t: t[: rng.randrange(len(t) + 1)],
        ]
        return {"kind": "raw_json", "file": name, "text": rng.choice(edits)(text)}
    if roll < 0.75 and models:
        name = rng.choice(models)
        sites = flatbuffer_sites((bundle / name).read_bytes())
        site = rng.randrange(len(sites))
        return {
            "kind": "tflite",
            "file": name,
            "site": site,
            "value": rng.choice(SITE_VALUES[sites[site]["type"]]),
            "what": sites[site]["what"],
        }
    if roll < 0.85:
        name = rng.choice([n for n in ("eval.npz", "attention.npz") if (bundle / n).is_file()])
        with zipfile.ZipFile(bundle / name) as archive:
            members = [n.removesuffix(".npy") for n in archive.namelist()]
        return {
            "kind": "npz",
            "file": name,
            "member": rng.choice(members),
            "payload": rng.choice(["not-npy", "bomb", "bad-deflate", "shape"]),
        }
    name = rng.choice(models + ["eval.npz", "attention.npz", "labels.json", "vocab.json"])
    size = (bundle / name).stat().st_size if (bundle / name).exists() else 1
    if rng.random() < 0.2:
        return {"kind": "truncate", "file": name, "size": rng.randrange(size)}
    return {
        "kind": "bytes",
        "file": name,
        "offset": rng.randrange(size),
        "xor": rng.randrange(1, 256),
    }


ARGUMENT_SETS = [
    [],
    ["--quant", "int8"],
    ["--sample", "0"],
    ["--sample", "1", "--quant", "int8"],
    ["--text", "the cat sat on a mat"],
    ["--text", "a" * 32],
    ["--sample", "0", "--view", "{tmp}/view.html"],
    ["--text", "the dog ran home", "--view", "{tmp}/view.html", "--quant", "int8"],
    ["--json", "{tmp}/report.json"],
    ["--debug", "int8", "--sample", "0"],
    ["--wide"],
    ["--generate", "the cat sat", "--max-new-tokens", "8"],  # a language model's bundle
    ["--chat", "hi", "--max-new-tokens", "4"],
]
HOSTILE_ARGUMENTS = [
    ["--json", "{bundle}/manifest.json"],
    ["--view", "{bundle}/model_int8.tflite", "--sample", "0"],
    ["--json", "/dev/null"],
    ["--json", "{tmp}/" + "n" * 300],
    ["--view", "{tmp}/" + "v" * 300 + ".html", "--sample", "0"],
    ["--text", "caf\udce9", "--view", "{tmp}/v.html"],
    ["--quant", "\u001b[31mint8"],
    ["--sample", "99999999999999999999"],
    ["--text", "x" * 100_001],
    ["--quant", ",,,"],
    ["--threads", "0"],
]
