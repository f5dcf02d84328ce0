"""keras-mha edge demo: run an exported bundle on a device, with no TensorFlow.

Depends on the standard library, numpy and one TFLite runtime: LiteRT
(`ai-edge-litert`) first, `tflite-runtime` as fallback. Nothing here imports
tensorflow, keras or keras_mha, and the runtime is imported only when a model
is about to run. A device copies this folder alone.

    python -m edge_demo BUNDLE_DIR            # parity run, all modes
    keras-mha-edge BUNDLE_DIR --sample 3      # one eval sample, every mode

Sub-packages by job; imports flow one way, down this list
(tests/test_import_graph.py checks it):

    app/        the command line: cli, runs, head_view (--view), report
    debug/      the quantization debugger (--debug)
    view/       the head view page (also written by keras-mha-heads)
    runtimes/   the TFLite runtimes, EdgeModel, probe, TFLite Micro, score
    contract/   the bundle's format (docs/artifacts.md), owned here and used
                by export and training
    errors.py   the error policy of every keras-mha command (UsageError, run_main)
    tables.py   plain text tables

The library (keras_mha) imports only `errors`, `contract` and the head view
page from here; the exporter also `runtimes`, to verify with the device's code.
"""

__version__ = "0.2.0"
