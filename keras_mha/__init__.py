"""keras-mha: multi-head attention as the lesson writes it, ready for the edge.

Rooms (imports flow from the layer up; the layer imports nothing of the
device side, tests/test_import_graph.py):

    attention/            the layer: layer.py the lesson (`_per_head_attention`) and
                          the API; args, masks, weights, Keras's names, recording beside
    layer_swap.py         `convert(model)`: a Keras or keras-hub model on our layer
    layers.py             LayerNorm, positional encoding, the encoder block, poolings
    qat/                  quantization-aware training: points and ranges, the loop, keras-mha-qat
    model.py              the classifier, `forward`, `attention_model`
    data.py, train/       the datasets and keras-mha-train
    rundir/               the run directory and its tasks' readers
    heads/                head analysis (keras-mha-heads)
    pretrained/           checkpoints through the layer (keras-mha-import, keras-mha-rescale)
    plots.py, quiet_tensorflow.py    figures; TensorFlow imported without its noise

The names below load on first use (PEP 562), so that `python -m
keras_mha.train --help` answers without importing Keras and TensorFlow, and
importing the package changes nothing in the process (its environment
included). A `.keras` file with the package's layers still loads after a bare
`import keras_mha`: the layers are registered for `keras.saving.load_model`
as soon as Keras is imported, now if it already is, or else right after the
`import keras` that loads it (`_RegisterOnKerasImport`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys as _sys
import warnings as _warnings

__version__ = "0.3.0"

_LAZY = {
    "GroupQueryAttention": "keras_mha.attention",
    "GroupedQueryAttention": "keras_mha.attention",
    "MultiHeadAttention": "keras_mha.attention",
    "LayerNorm": "keras_mha.layers",
    "MaskedMeanPooling": "keras_mha.layers",
    "PositionalEncoding": "keras_mha.layers",
    "TransformerEncoderBlock": "keras_mha.layers",
    "ModelConfig": "keras_mha.model",
    "build_classifier": "keras_mha.model",
    "convert": "keras_mha.layer_swap",
}
__all__ = [*sorted(_LAZY), "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        # Any of these names registers all of the package's layers, so that
        # keras.saving.load_model finds them whichever one was imported.
        importlib.import_module("keras_mha.layers")
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_mha' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


def _register_layers() -> None:
    """Import keras_mha.layers: its classes (and MultiHeadAttention's)
    register themselves with `keras.saving.register_keras_serializable`."""
    importlib.import_module("keras_mha.layers")


# Keras imported first by keras_mha.attention itself (`from keras_mha.attention
# import MultiHeadAttention` before any `import keras`): keras_mha.layers cannot
# import the layer yet, so the attention package registers them once its names
# are bound (`register_deferred`, the last line of keras_mha/attention/__init__.py).
_deferred = False


def _attention_initializing() -> bool:
    module = _sys.modules.get("keras_mha.attention")
    spec = getattr(module, "__spec__", None)
    return module is not None and bool(getattr(spec, "_initializing", False))


def register_deferred() -> None:
    """Register the layers if `import keras` had to leave it to the attention package."""
    global _deferred
    if _deferred:
        _deferred = False
        _register_layers()


class _LoaderThenRegister(importlib.abc.Loader):
    """The `keras` module's own loader, registering our layers once it has
    run; anything else (resources, source) is the wrapped loader's."""

    def __init__(self, loader, spec, hook):
        self._loader, self._spec, self._hook = loader, spec, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        # keras is complete: put its own loader back, then register.
        self._spec.loader = self._loader
        module.__loader__ = self._loader
        self._hook.remove()
        if _attention_initializing():
            global _deferred
            _deferred = True
            return
        try:
            _register_layers()
        except Exception as exc:  # never break `import keras` for the user
            _warnings.warn(
                f"keras_mha could not register its layers with Keras ({exc!r}); "
                "import keras_mha.layers before loading a .keras file with them.",
                RuntimeWarning,
                stacklevel=2,
            )

    def __getattr__(self, name):
        if name.startswith("_"):  # ours (not yet set while copying), never the loader's
            raise AttributeError(name)
        return getattr(self._loader, name)


class _RegisterOnKerasImport(importlib.abc.MetaPathFinder):
    """A post-import hook for the top-level `keras` module.

    Sits first in `sys.meta_path`; for `keras` it asks the finders after it
    for the real spec and wraps its loader (`_LoaderThenRegister`), so that
    right after `keras` finishes importing, `keras_mha.layers` is imported.
    It then leaves `sys.meta_path`. A spec only looked up
    (`importlib.util.find_spec("keras")`) and never loaded leaves it in place.
    """

    keras_mha_hook = True  # one hook, even if this module is imported afresh

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras":
            return None
        for finder in list(_sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderThenRegister(spec.loader, spec, self)
                return spec
        return None

    def remove(self) -> None:
        while self in _sys.meta_path:
            _sys.meta_path.remove(self)


if "keras" in _sys.modules:  # Keras is loaded already: register the layers now
    _register_layers()
elif not any(getattr(f, "keras_mha_hook", False) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _RegisterOnKerasImport())
