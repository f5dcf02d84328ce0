"""keras-mha-export: quantized, verified, bundled TFLite models of a keras-mha model.

The model is a run directory's (a classifier, a sentence encoder, a text
classifier or a cross-encoder: bundle_contract/tasks/) or a user's
.keras file (`SourcePaths`).

The folder export/ installs as `keras_mha_export` (setup.cfg's one
package_dir entry): a top-level `export` would clash with other packages.

    from keras_mha_export import export_bundle, summary_table
    manifest = export_bundle("runs/digits", "runs/digits/bundle", "all", overwrite=True)
    print(summary_table(manifest))

Modes: float32, dynamic (int8 weights), float16, int8 (full integer) and
int16x8 (int16 activations). Every model has a fixed batch of 1, builtin ops
only, and is verified against the float Keras model on eval.npz with LiteRT
before it is listed in the manifest's `verified`: the staged bundle is opened
and scored by the edge demo's own code (edge_demo). See docs/artifacts.md for
the bundle format and `keras_mha_export.cli` for the command line.

Modules, in the order an export runs them (bundle.py names the steps):
`source` (the run or files, read and checked through keras_mha), `convert`
(SavedModels and the TFLite converter), `graph` and `entry` (each mode's
graph checked, its manifest entry), `deploy` and `devices` (TFLite Micro's
deploy file), `verify` (the device's loader and scorer on the staged
bundle), `summary` (what it prints), `bundle` (`export_bundle`), `cli`
(keras-mha-export).

Importing this package is cheap; TensorFlow is imported on first use.
"""

from bundle_contract.manifest import MODES

from .bundle import ExportFailed, export_bundle, parse_modes
from .convert import ConversionError
from .source import SourcePaths
from .summary import summary_table

__all__ = [
    "MODES",
    "ConversionError",
    "ExportFailed",
    "SourcePaths",
    "export_bundle",
    "parse_modes",
    "summary_table",
]
