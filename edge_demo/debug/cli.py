"""`keras-mha-edge BUNDLE --debug MODE [--sample N]`: where MODE loses accuracy (debugger.py).

Runs the bundle's float32 model and MODE's named model (never the deploy
file: it has no tensor names) on the eval samples, or on sample N alone,
through LiteRT's builtin kernels, and prints the worst 30 tensors (`--json FILE`:
every row, as JSON) (per head
where a tensor has the head axis), then the ops that compute in float in an
integer mode. The head count comes from the attention signature's outputs
`(1, heads, T, T)` when the bundle has one.

A dynamic-length model (an embedding bundle's `dynamic_length`) runs each
sentence at its own length, as the device does, and keeps every tensor of
every sentence: by default only its first `DYNAMIC_SAMPLES` eval sentences
(the header says so; `--sample N` debugs any one).
"""

from __future__ import annotations

import pathlib

from bundle_contract.bundle import Bundle, open_bundle
from bundle_contract.errors import UsageError, shown
from bundle_contract.manifest import Manifest

from ..runtimes.probe import probe_model
from ..runtimes.runtime import RUNTIMES, select_runtime

ROWS_SHOWN = 30
DYNAMIC_SAMPLES = 32  # a dynamic-length model's default: its first 32 eval sentences


def check_debug_runtime(choice: str) -> None:
    """The debugger needs LiteRT (intermediate tensors): `--runtime auto` or `litert`."""
    if choice not in ("auto", "litert"):
        raise UsageError(
            f"the debugger runs on {RUNTIMES['litert'].name} (intermediate tensors), "
            f"not {choice}; use --runtime litert",
            "--debug",
        )


def _num_heads(bundle: Bundle, mode: str) -> int | None:
    entry = bundle.manifest.models[mode]
    for signature in entry.signatures.values():
        shapes = {spec.shape for spec in signature.outputs.values()}
        if shapes and all(len(s) == 4 and s[2] == s[3] for s in shapes):
            heads = {s[1] for s in shapes}
            if len(heads) == 1:
                return heads.pop()
    return None


def run_debug(
    bundle_path,
    mode: str,
    sample: int | None,
    runtime_choice: str = "auto",
    json_path: pathlib.Path | None = None,
    dynamic_samples: int | None = DYNAMIC_SAMPLES,
) -> int:
    """Print MODE's error table against float32 (`json_path`: every row as JSON too).

    Without `sample`, every eval sample; a dynamic-length model's first
    `dynamic_samples` (None: all). UsageError (exit 2) on bad input.
    """
    from bundle_contract.files import check_output, write_json_atomic

    from . import debugger

    check_debug_runtime(runtime_choice)
    models = Manifest.read(bundle_path).models
    if mode not in models:
        raise UsageError(
            f"mode {mode!r} is not in this bundle (it has: {', '.join(models)})", "--debug"
        )
    if "float32" not in models:
        raise UsageError(
            "needs the bundle's float32 model as the reference; it has none", "--debug"
        )
    bundle = open_bundle(bundle_path, ",".join(sorted({"float32", mode})))
    if bundle.task.generates:  # two signatures and a cache: not a one-input model
        raise UsageError(
            "has no per-tensor debugger for a language model's bundle yet; its parity run "
            "compares every next token with the float model's",
            "--debug",
        )
    samples = bundle.manifest.eval.samples
    if sample is not None and not 0 <= sample < samples:
        raise UsageError(
            f"{sample} is out of range: eval.npz has samples 0..{samples - 1}", "--sample"
        )
    if json_path is not None:
        check_output(json_path, "--json", protected=bundle.root)
    runtime = select_runtime("litert")
    dynamic = any(bundle.manifest.models[name].dynamic_length for name in ("float32", mode))
    own = ", each at its own length" if dynamic else ""
    if sample is not None:
        x, used = bundle.eval.x[sample : sample + 1], [sample]
        what = f"eval sample {sample}{' at its own length' if dynamic else ''}"
    elif dynamic and dynamic_samples is not None and samples > dynamic_samples:
        x, used = bundle.eval.x[:dynamic_samples], list(range(dynamic_samples))
        what = f"the first {dynamic_samples} of {samples} eval samples{own}"
    else:
        x, used, what = bundle.eval.x, samples, f"all {samples} eval samples{own}"
    # Each model's first load, with the debugger's own interpreter options, in
    # a child process: a malformed model crashes there, not here.
    for name in sorted({"float32", mode}):
        entry = bundle.manifest.models[name]
        try:
            first = entry.input.quantize(x[:1])
        except ValueError:
            first = None
        probe = probe_model(
            runtime, bundle.model_bytes[name], bundle.path(entry.file), first, debug=True
        )
        if not probe.ok:
            raise UsageError(probe.reason, bundle.path(entry.file))
        probe.check_manifest(entry, bundle.path(entry.file))
    heads = _num_heads(bundle, mode)
    print(
        f"bundle   {shown(bundle.root)}: {mode} against float32 on {what}; "
        f"{runtime.name} {runtime.version} builtin kernels; heads {heads or '?'}",
        flush=True,
    )
    try:
        rows = debugger.debug_mode(
            bundle.model_bytes["float32"],
            bundle.model_bytes[mode],
            x,
            num_heads=heads,
            pad_id=bundle.pad_id,
        )
        floats = (
            debugger.float_ops(bundle.model_bytes[mode]) if mode in debugger.INTEGER_MODES else ()
        )
    except (ValueError, RuntimeError, KeyError, IndexError) as exc:
        if isinstance(exc, UsageError):
            raise
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise UsageError(
            f"the debugger cannot run it ({detail})", bundle.path(bundle.manifest.models[mode].file)
        ) from None
    where = (
        f" (all {len(rows)} in {shown(json_path)})"
        if json_path
        else " (--json FILE writes every row)"
    )
    print(debugger.format_debug_table(rows, limit=ROWS_SHOWN, floats=floats, more=where))
    if json_path is not None:
        write_json_atomic(
            json_path,
            flag="--json",
            protected=bundle.root,
            data={
                "bundle": str(bundle.root.resolve()),
                "mode": mode,
                "reference": "float32",
                "samples": used,
                "runtime": f"{runtime.name} {runtime.version} builtin kernels",
                "rows": [row.to_json() for row in rows],
                "float_ops": list(floats),
            },
        )
        print(f"wrote {shown(json_path)}")
    return 0
