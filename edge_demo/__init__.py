"""keras-mha edge demo: run an exported bundle on a device, with no TensorFlow.

Depends on the standard library, numpy and one TFLite runtime: LiteRT
(`ai-edge-litert`) first, `tflite-runtime` as fallback. Nothing here imports
tensorflow, keras or keras_mha, and the runtime is imported only when a model
is about to run.

    python -m edge_demo BUNDLE_DIR            # parity run, all modes
    keras-mha-edge BUNDLE_DIR --sample 3      # one eval sample, every mode

The format (docs/artifacts.md), owned here and used by export and training:
`manifest` and `entries` (manifest.json as dataclasses), `tensors` (TensorSpec, the one
quantize/dequantize), `parity` (figures, thresholds, the one threshold
check), `vocab` (vocab.json, the one Vocab), `arrays` (eval.npz and
calibration checks), `files` (atomic writes, in-bundle reads), `fields`
(typed JSON access). Running it: `bundle` (open and check a bundle),
`runtime` (runtimes, the model wrapper `EdgeModel`), `probe` (crash-safe first
load), `score` (one mode against the reference), `report` (tables), `app`
(the command line), `command` (the command-line policy of all four commands).
"""

__version__ = "0.1.0"
