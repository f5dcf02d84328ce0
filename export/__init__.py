"""keras-mha-export: quantized, verified, bundled TFLite models of a classifier.

    from keras_mha_export import export_bundle, summary_table
    manifest = export_bundle("runs/digits", "runs/digits/bundle", "all", overwrite=True)
    print(summary_table(manifest))

Modes: float32, dynamic (int8 weights), float16, int8 (full integer) and
int16x8 (int16 activations). Every model has a fixed batch of 1, builtin ops
only, and is verified against the float Keras model on eval.npz with LiteRT
before it is listed in the manifest's `verified`. See docs/artifacts.md for
the bundle format and `export.cli` for the command line.

Importing this package is cheap; TensorFlow is imported on first use.
"""

from .bundle import ExportFailed, export_bundle, parse_modes, summary_table
from .convert import MODES, ConversionError
from .source import InputError, SourcePaths

__all__ = [
    "MODES",
    "ConversionError",
    "ExportFailed",
    "InputError",
    "SourcePaths",
    "export_bundle",
    "parse_modes",
    "summary_table",
]
