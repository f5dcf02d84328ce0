"""keras-mha edge demo: run an exported bundle on a device, with no TensorFlow.

Depends on the standard library, numpy and one TFLite runtime: LiteRT
(`ai-edge-litert`) first, `tflite-runtime` as fallback. Nothing here imports
tensorflow, keras or keras_mha, and the runtime is imported only when a model
is about to run. A device copies this folder and the bundle contract's
(`DEVICE_PACKAGES`: edge_demo/ and bundle_contract/, nothing else).

    python -m edge_demo BUNDLE_DIR            # parity run, all modes
    keras-mha-edge BUNDLE_DIR --sample 3      # one eval sample, every mode

Sub-packages by job; imports flow one way, down this list
(tests/test_import_graph.py checks it):

    app/        the command line: cli, runs, head_view (--view), report
    debug/      the quantization debugger (--debug)
    view/       the head view page (also written by keras-mha-heads)
    runtimes/   the TFLite runtimes, EdgeModel, probe, TFLite Micro, score
    tables.py   plain text tables

Beside it, not in it: `bundle_contract` (the bundle's format, docs/artifacts.md,
and the error policy of every command), which the library, the exporter and
this app all import. From here the library imports only the head view page
(`view`, the page keras-mha-heads writes too); the exporter only `runtimes`, to
verify with the device's code.
"""

__version__ = "0.3.0"

# What a device copies: these folders of the repository (or installed packages),
# and a bundle. The edge README, the arm64 run (.ci/arm64/test.sh) and the tests'
# device folder (tests/edge_fixtures.py `app_dir`) all copy exactly these.
DEVICE_PACKAGES = ("edge_demo", "bundle_contract")
