"""Where a quantized mode loses accuracy: its tensors against float32's, layer by layer.

Both models run on the same samples with every intermediate tensor kept
(LiteRT's `experimental_preserve_all_tensors`); tensors are matched by name
(the converter names a tensor after the Keras ops it computes, the same in
every mode), and each matched tensor of MODE is dequantized with its own
`(scale, zero_point)` and compared with float32's:

- `rel_rmse`: RMSE / RMS of the float tensor (0 = identical, 1 = as large as the signal),
- `max_abs`: max |Δ| over every sample and element,
- `rmse_quanta`: RMSE in units of the tensor's scale (rounding alone gives ~0.29).

A tensor with a head axis (a non-batch axis of size `num_heads`, the only
one) also gets one row per head. `float_ops` lists the ops of a mode that
should be integer (int8, int16x8) but compute in float. Rows come worst
first. Intermediate tensors exist only without the XNNPACK delegate, so the
debugger runs LiteRT's builtin kernels: its final outputs can differ from the
parity run's by a quantum. A deploy file with its names stripped cannot be
matched: debug the named file.

A dynamic-length model (input `[1, -1]`: token ids, an embedding bundle's
`dynamic_length`) runs each sample at its own length, as the device does
(`EdgeModel.own_lengths`: up to its last id that is not the pad id). Its tensors' shapes
then differ between samples: the errors are over every sample's values
(flattened, concatenated), a row's shape has -1 (`?` in the table) in each
dim that changes with the length, and those dims are never the head axis.
A fixed-shape model's samples are stacked and compared as one array.

numpy and LiteRT only; `debug_mode` is what `keras-mha-edge BUNDLE --debug MODE` runs (cli.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from bundle_contract.tensors import TensorSpec

from ..runtimes.model import EdgeModel
from ..tables import format_table

INTEGER_MODES = ("int8", "int16x8")


@dataclasses.dataclass(frozen=True)
class DebugRow:
    """One matched tensor (or one head of it): MODE's error against float32."""

    name: str  # the tensor's name (its first ';'-part), without the model's prefix
    op: str  # the op that computes it ("input" for a graph input)
    head: int | None  # None: the whole tensor
    shape: tuple[int, ...]  # -1: a dim that changes with a dynamic-length model's length
    dtype: str  # MODE's dtype
    scale: float | None  # MODE's scale (None: not quantized)
    rel_rmse: float
    max_abs: float
    rmse_quanta: float | None

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["shape"] = list(self.shape)
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in data.items()
        }


def _interpreter(content: bytes):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(
        model_content=content,
        num_threads=1,
        experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interpreter.allocate_tensors()
    return interpreter


def _signature(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """One shape for a tensor seen at several lengths: -1 in each dim that changes."""
    first = shapes[0]
    if any(len(s) != len(first) for s in shapes):
        return (-1,) * len(first)
    return tuple(d if all(s[a] == d for s in shapes) else -1 for a, d in enumerate(first))


def _trace(
    content: bytes, x: np.ndarray, pad_id: int = 0
) -> tuple[dict, dict[int, list[np.ndarray]], dict[int, str], dict[int, str], dict]:
    """Run every sample with all tensors kept.

    Returns (details by index, values by index, producing op by index, role by
    index, shape by index). Values are lists of arrays whose first axis is the
    sample: a fixed-shape model's activations are one array stacked over the
    samples `(N, ...)`. A dynamic-length model (input `[1, -1]`, token ids)
    runs each sample at its own length (`EdgeModel.own_lengths`), as the
    device does, and keeps one `(1, ...)` array per sample; its shapes have
    -1 in each dim that changes with the length (seen over the samples and
    one extra run at another length, so one sample is enough). Float
    constants and float16 weights expanded by DEQUANTIZE ("const" role) are
    stored once as `[(1, ...)]`.
    """
    interpreter = _interpreter(content)
    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    all_ops = interpreter._get_ops_details()
    producers = {int(t): op for op in all_ops for t in op["outputs"]}
    consumed = {int(t) for op in all_ops for t in op["inputs"]}
    (entry,) = interpreter.get_input_details()
    signature = list(entry.get("shape_signature", []))
    dynamic = len(signature) == 2 and signature[1] == -1

    def role(index: int) -> str:
        op = producers.get(index)
        if op is None:
            if index == entry["index"]:
                return "act"
            # a constant operand; a tensor no op reads is a kernel's scratch space
            return "const" if index in consumed else "scratch"
        if op["op_name"] == "DEQUANTIZE" and all(
            role(int(t)) == "const" for t in op["inputs"] if t >= 0
        ):
            return "const"
        return "act"

    roles = {i: role(i) for i in details}
    ops = {i: producers[i]["op_name"] if i in producers else "input" for i in details}
    for i in details:
        if i not in producers and i != entry["index"]:
            ops[i] = "const"
    acts = [i for i in details if roles[i] == "act"]
    consts = [
        i for i in details if roles[i] == "const" and np.dtype(details[i]["dtype"]).kind == "f"
    ]
    shapes = {i: tuple(int(d) for d in details[i]["shape"]) for i in details}
    prepared = TensorSpec.from_detail(entry).quantize(x)
    lengths = EdgeModel.own_lengths(prepared, pad_id) if dynamic else None
    allocated = int(entry["shape"][-1])

    def invoke(row: np.ndarray) -> None:
        nonlocal allocated
        if dynamic and row.shape[-1] != allocated:  # both resize and re-plan the arena
            interpreter.resize_tensor_input(entry["index"], (1, row.shape[-1]))
            interpreter.allocate_tensors()
            allocated = row.shape[-1]
        interpreter.set_tensor(entry["index"], row[None])
        interpreter.invoke()

    values: dict[int, list[np.ndarray]] = {i: [] for i in acts}
    kept: dict[int, list[np.ndarray]] = {}
    for n, sample in enumerate(prepared):
        invoke(sample if lengths is None else sample[: lengths[n]])
        for i in acts:
            values[i].append(interpreter.get_tensor(i).copy())
        if n == 0:
            kept.update({i: [interpreter.get_tensor(i)[None].copy()] for i in consts})
    if lengths is None:
        kept.update({i: [np.stack(v)] for i, v in values.items()})
        return details, kept, ops, roles, shapes
    first = int(lengths[0])
    other = np.zeros(first - 1 if first > 1 else 2, prepared.dtype)
    other[: min(first, other.size)] = prepared[0, : min(first, other.size)]
    invoke(other)
    for i in acts:
        seen = [v.shape for v in values[i]]
        shapes[i] = _signature([*seen, interpreter.get_tensor(i).shape])
        kept[i] = [v[None] for v in values[i]]
    return details, kept, ops, roles, shapes


def _by_name(details: dict, indices, roles: dict[int, str]) -> dict[tuple[str, str, int], int]:
    """(name, role, n-th tensor of that name and role) -> index: repeats match in order."""
    seen: dict[tuple[str, str], int] = {}
    keyed = {}
    for index in sorted(indices):
        name = (details[index]["name"], roles[index])
        keyed[(*name, seen.get(name, 0))] = index
        seen[name] = seen.get(name, 0) + 1
    return keyed


def _short(name: str) -> str:
    first = name.split(";")[0]
    parts = first.split("/")
    return "/".join(parts[1:]) if len(parts) > 2 else first


def _head_axis(shape: tuple[int, ...], num_heads: int | None) -> int | None:
    """The only non-batch axis of size `num_heads` (never a -1 dim: it changes with the length)."""
    if not num_heads or num_heads < 2 or len(shape) < 3:
        return None
    axes = [a for a in range(1, len(shape)) if shape[a] == num_heads]
    return axes[0] if len(axes) == 1 else None


def _joined(parts: Sequence[np.ndarray], pick: tuple = ()) -> np.ndarray:
    """Every part's values at `pick`: one part (a fixed-shape model's stack) as it is,
    several (a dynamic-length model's samples, each its own length) flattened and
    concatenated."""
    if len(parts) == 1:
        return parts[0][pick]
    return np.concatenate([part[pick].ravel() for part in parts])


def _errors(
    ours: np.ndarray, ref: np.ndarray, scale: float | None
) -> tuple[float, float, float | None]:
    delta = ours.astype(np.float64) - ref.astype(np.float64)
    rmse = float(np.sqrt(np.mean(delta**2)))
    rms = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
    rel = rmse / rms if rms > 0 else (0.0 if rmse == 0 else math.inf)
    return rel, float(np.abs(delta).max()), (rmse / scale if scale else None)


def debug_mode(
    float_bytes: bytes,
    mode_bytes: bytes,
    inputs: np.ndarray,
    num_heads: int | None = None,
    pad_id: int = 0,
) -> list[DebugRow]:
    """Per-tensor (and per-head) error of a mode against float32, worst first.

    Args:
        float_bytes: the float32 model.
        mode_bytes: the model to debug (any mode, float32 included).
        inputs: samples `(N, ...)` as eval.npz holds them (floats or token ids).
        num_heads: attention heads per layer, for per-head rows (None: none).
        pad_id: what pads token ids (a dynamic-length model runs rows without it).

    Raises:
        ValueError: no tensor names match (e.g. a stripped deploy file).
    """
    x = np.asarray(inputs)
    f_details, f_values, _, f_roles, _ = _trace(float_bytes, x, pad_id)
    m_details, m_values, producers, m_roles, m_shapes = _trace(mode_bytes, x, pad_id)
    float_keys = _by_name(f_details, f_values, f_roles)
    rows = []
    for key, index in _by_name(m_details, m_values, m_roles).items():
        ref_index = float_keys.get(key)
        if ref_index is None:
            continue
        ref, ours = f_values[ref_index], m_values[index]
        if (
            len(ref) != len(ours)
            or any(a.shape != b.shape for a, b in zip(ref, ours))
            or np.dtype(f_details[ref_index]["dtype"]).kind != "f"
            or not any(a.size for a in ref)
        ):
            continue
        spec = TensorSpec.from_detail(m_details[index])
        ours = [spec.dequantize(part) for part in ours]
        shape = m_shapes[index]
        common = dict(
            name=_short(key[0]),
            op=producers[index],
            shape=shape,
            dtype=spec.dtype,
            scale=spec.scale,
        )
        errors = _errors(_joined(ours), _joined(ref), spec.scale)
        rows.append(
            DebugRow(
                head=None, **common, **dict(zip(("rel_rmse", "max_abs", "rmse_quanta"), errors))
            )
        )
        axis = _head_axis(shape, num_heads)
        for head in range(shape[axis] if axis is not None else 0):
            pick = (slice(None),) * (axis + 1) + (head,)  # +1: the sample axis
            errors = _errors(_joined(ours, pick), _joined(ref, pick), spec.scale)
            rows.append(
                DebugRow(
                    head=head, **common, **dict(zip(("rel_rmse", "max_abs", "rmse_quanta"), errors))
                )
            )
    if not rows:
        raise ValueError(
            "no tensor of the model matches the float32 model by name "
            "(a deploy file without names cannot be debugged: debug the named file)"
        )
    rows.sort(
        key=lambda r: (
            -r.rel_rmse if math.isfinite(r.rel_rmse) else -math.inf,
            r.name,
            r.head or -1,
        )
    )
    return rows


def float_ops(mode_bytes: bytes) -> list[str]:
    """Ops computing in float32 in a model that should be integer ("INDEX OP_NAME").

    A QUANTIZE right after a float graph input and a DEQUANTIZE right before a
    float graph output are the model's boundary, not an island, and are left out.
    """
    interpreter = _interpreter(mode_bytes)
    inputs = {d["index"] for d in interpreter.get_input_details()}
    outputs = {d["index"] for d in interpreter.get_output_details()}
    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    found = []
    for op in interpreter._get_ops_details():
        tensors = [int(t) for t in (*op["inputs"], *op["outputs"]) if t >= 0]
        if not any(np.dtype(details[t]["dtype"]) == np.float32 for t in tensors if t in details):
            continue
        if op["op_name"] == "QUANTIZE" and set(map(int, op["inputs"])) <= inputs:
            continue
        if op["op_name"] == "DEQUANTIZE" and set(map(int, op["outputs"])) <= outputs:
            continue
        found.append(f"{op['index']} {op['op_name']}")
    return found


def format_debug_table(
    rows: Sequence[DebugRow], limit: int | None = None, floats: Sequence[str] = (), more: str = ""
) -> str:
    """The rows as a text table (the first `limit`), then the float ops if any.

    `more` follows the count of rows left out (where the rest can be found).
    """
    headers = ["tensor", "op", "head", "shape", "dtype", "rel RMSE", "max|Δ|", "RMSE/q"]
    shown = list(rows)[:limit] if limit else list(rows)
    body = [
        [
            r.name,
            r.op,
            "all" if r.head is None else str(r.head),
            "x".join("?" if d < 0 else str(d) for d in r.shape),
            r.dtype,
            f"{r.rel_rmse:.3g}",
            f"{r.max_abs:.3g}",
            "-" if r.rmse_quanta is None else f"{r.rmse_quanta:.2f}",
        ]
        for r in shown
    ]
    lines = [format_table(headers, body, right={5, 6, 7})]
    if limit and len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows{more}")
    if floats:
        lines.append(f"ops computing in float: {', '.join(floats)}")
    return "\n".join(lines)
