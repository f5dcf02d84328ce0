"""Running a bundle's models: the TFLite runtimes and the one model wrapper.

`runtime` (RUNTIMES, `select_runtime`: imported only when a model is about to
run), `model` (`EdgeModel`), `policy` (which file a runtime runs: the named
model or the deploy file), `probe` (a crash-safe first load in a child
process), `micro` and `micro_footprint` (TensorFlow Lite Micro, and what a
part is sized by), `score` (`run_mode`: one mode against the reference, as
the device's parity run and export's verification both call it).

Imports `contract` and `errors` only. The exporter may import these modules.
"""
