"""Verified means the device passes: the staged bundle, scored by the device's own code.

`verify_staged(staging, runtime)` opens the staged bundle with the edge
demo's loader (`bundle_contract.bundle.open_bundle`: manifest, sha256,
headers, eval.npz, labels, vocab) and runs each mode through the edge demo's
model wrapper and scorer (`edge_demo.runtimes.score.run_mode`: the one
quantize, run loop, parity figures and threshold check). A mode export calls
verified therefore passes on the device, by construction.

The runtime is LiteRT's (`ai_edge_litert`), as on the device. Without LiteRT,
TensorFlow's own interpreter stands in, built with
`BUILTIN_WITHOUT_DEFAULT_DELEGATES`: its default XNNPACK delegate computes
wrong int8 results for these models (docs/field_notes.md). Only this module
(the export side) may import TensorFlow for it; the device code never does.
"""

from __future__ import annotations

import pathlib
import warnings

from bundle_contract.bundle import open_bundle
from bundle_contract.errors import UsageError
from edge_demo.runtimes.runtime import Runtime, select_runtime
from edge_demo.runtimes.score import ModeResult, run_mode

TENSORFLOW_RUNTIME = "tensorflow-builtin-without-default-delegates"


def tensorflow_runtime() -> Runtime:
    """`tf.lite.Interpreter` without default delegates, as a device Runtime."""
    from .convert import import_tensorflow

    tf = import_tensorflow()
    resolver = tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES

    def interpreter(**kwargs):
        with warnings.catch_warnings():  # "tf.lite.Interpreter is deprecated": we know
            warnings.simplefilter("ignore")
            return tf.lite.Interpreter(**kwargs, experimental_op_resolver_type=resolver)

    return Runtime(TENSORFLOW_RUNTIME, tf.__version__, "tensorflow.lite", interpreter)


def verification_runtime() -> Runtime:
    """LiteRT if it imports, else TensorFlow's interpreter without default delegates."""
    try:
        return select_runtime("litert")
    except UsageError:
        return tensorflow_runtime()


def verify_staged(staging: pathlib.Path, runtime: Runtime) -> dict[str, ModeResult]:
    """Each mode of the staged bundle -> the device's verdict on it.

    A model the runtime cannot load, or whose tensors differ from the
    manifest, is a failed result (its reason says so), not an exception.
    """
    bundle = open_bundle(staging)
    results = {}
    for mode in bundle.modes:
        try:
            results[mode] = run_mode(bundle, mode, runtime)
        except UsageError as error:
            results[mode] = ModeResult(
                mode,
                "failed",
                thresholds=bundle.manifest.models[mode].thresholds,
                failures=[f"{runtime.name} cannot run it: {error.problem}"],
            )
    return results
