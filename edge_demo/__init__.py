"""keras-mha edge demo: run an exported bundle on a device, with no TensorFlow.

Depends on the standard library, numpy and one TFLite runtime: LiteRT
(`ai-edge-litert`) first, `tflite-runtime` as fallback. Nothing here imports
tensorflow, keras or keras_mha, and the runtime is imported only when a model
is about to run.

    python -m edge_demo BUNDLE_DIR            # parity run, all modes
    keras-mha-edge BUNDLE_DIR --sample 3      # one eval sample, every mode

Modules: `bundle` (manifest and file validation), `runtime` (runtime choice,
crash-safe probing, the inference wrapper), `text` (on-device tokenizer),
`parity` (metrics and thresholds), `report` (tables, pictures, JSON), `app`
(the command line).
"""

__version__ = "0.1.0"
