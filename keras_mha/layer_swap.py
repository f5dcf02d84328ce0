"""`keras_mha.convert(model)`: a Keras model on our layer, in one call.

A model built with `keras.layers.MultiHeadAttention`, or with keras-hub's
layers that hold one (`TransformerEncoder`, `TransformerDecoder` and its
`CachedMultiHeadAttention`, the Whisper and Moonshine attention subclasses),
becomes a copy whose attention layers are `keras_mha.MultiHeadAttention`:
same weights, same outputs, and the per-head tools (head_weights, pruned,
head_mask, the per-head path, return_attention_scores) on every one.

How (docs/layer.md, "Your model on our layer"):
1. The copy: the model's config with every Keras MultiHeadAttention in it
   (the layers a functional or Sequential model lists) named as ours, rebuilt
   by Keras (`deserialize_keras_object`, build config included), then the
   original's weights (`set_weights`: our variables are Keras's, in Keras's
   order).
2. The layers other layers create in their own `build` (keras-hub's) are
   found by walking every layer's attributes, and replaced where they sit,
   at the same place in the parent's sublayers (so the weight order stays).
   A subclass of Keras's layer becomes the same class on our base (its
   methods, with `super()` pointing along the new bases).
3. Every replaced layer that can be called as `layer(query, value)` is
   checked against the one it replaces on the same random input: outputs
   equal to 1e-5 (relative to their size) or the conversion stops with one
   line naming the layer. So does a subclass that reads an internal our
   layer does not have.
"""

from __future__ import annotations

import contextlib
import re
import types

import keras
import numpy as np

from keras_mha.attention import MultiHeadAttention

KerasMHA = keras.layers.MultiHeadAttention
_OURS = {
    "module": MultiHeadAttention.__module__,
    "class_name": "MultiHeadAttention",
    "registered_name": keras.saving.get_registered_name(MultiHeadAttention),
}
# Largest |ours - Keras's| on the check input, relative to max(1, max |Keras's|):
# float32 rounding of the same sums in another order (the tests' 1e-5).
TOLERANCE = 1e-5


def convert(model, implementation: str = "fused"):
    """A copy of `model` with every `keras.layers.MultiHeadAttention` (and
    subclass) replaced by `keras_mha.MultiHeadAttention`, weights carried.

    Args:
        model: a built `keras.Model` (functional, Sequential, or a subclass
            with `get_config`), or a single built layer.
        implementation: the new layers' `implementation` (`"fused"` or
            `"per_head"`, the lesson's loop).

    Returns:
        The copy; `model` is not changed.

    Raises:
        ValueError: one line naming what cannot be converted and why.
    """
    if not isinstance(model, keras.layers.Layer):
        raise ValueError(
            f"convert expects a Keras model or layer. Received: {type(model).__name__}"
        )
    if not model.built:
        raise ValueError(
            f"convert needs a built model: call '{model.name}' on an input first "
            "(its layers create their attention in build)."
        )
    if type(model) is KerasMHA:
        return MultiHeadAttention.from_keras(model, implementation=implementation)
    renamed = []
    copy = _copy(model, implementation, renamed)
    replaced = 0
    for parent in copy._flatten_layers(include_self=True, recursive=True):
        if isinstance(parent, MultiHeadAttention):
            continue
        for name, value in _attributes(parent):
            if _is_keras_attention(value):
                _replace(parent, name, value, _converted(value, implementation))
                replaced += 1
    left = keras_attention_layers(copy)
    if left:
        raise ValueError(
            f"convert cannot reach '{left[0].name}' ({type(left[0]).__qualname__}): its layer "
            "holds it in a list or dict, not an attribute; assign it to an attribute."
        )
    if not renamed and not replaced:
        raise ValueError(
            f"convert found no keras.layers.MultiHeadAttention in '{model.name}' "
            f"({type(model).__name__}); nothing to convert."
        )
    return copy


def _attributes(layer) -> list[tuple[str, object]]:
    """A layer's attributes by name (on PyTorch, sublayers sit in torch's
    `_modules`, not in the instance dict)."""
    found = dict(vars(layer))
    found.update(vars(layer).get("_modules") or {})
    return list(found.items())


def keras_attention_layers(model) -> list:
    """The `keras.layers.MultiHeadAttention` layers (Keras's, not ours) in `model`, at any depth."""
    return [layer for layer in model._flatten_layers(recursive=True) if _is_keras_attention(layer)]


def _is_keras_attention(value) -> bool:
    return isinstance(value, KerasMHA) and not isinstance(value, MultiHeadAttention)


# ------------------------------------------------------------------ the copy
def _copy(model, implementation: str, renamed: list):
    """Keras's own copy of `model` (config, build config, weights), its
    listed Keras MultiHeadAttention layers named as ours (each appended to
    `renamed`)."""
    try:
        config = keras.saving.serialize_keras_object(model)
    except Exception as exc:
        raise ValueError(
            f"convert cannot copy '{model.name}' ({type(model).__name__}): Keras could not "
            f"serialize it ({exc}); a subclassed model needs get_config()."
        ) from None
    config = _rename_attention(config, implementation, renamed)
    # The model's own classes, registered or not (a user's layers in a script).
    classes = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        classes[type(layer).__name__] = type(layer)
        classes[keras.saving.get_registered_name(type(layer))] = type(layer)
    classes.pop("MultiHeadAttention", None)  # Keras's: named as ours in the config
    try:
        copy = keras.saving.deserialize_keras_object(config, custom_objects=classes)
    except Exception as exc:
        raise ValueError(
            f"convert cannot copy '{model.name}' ({type(model).__name__}): Keras could not "
            f"rebuild it from its config ({exc})."
        ) from None
    if not copy.built:  # a subclassed model without a build config
        raise ValueError(
            f"convert cannot copy '{model.name}': its copy is not built (give the model a "
            "build config, or an Input)."
        )
    originals = model.weights
    if len(copy.weights) != len(originals):
        raise ValueError(
            f"convert cannot copy '{model.name}': its copy has {len(copy.weights)} "
            f"weights, the model {len(originals)}."
        )
    copy.set_weights([keras.ops.convert_to_numpy(w) for w in originals])
    return copy


def _rename_attention(config, implementation: str, renamed: list):
    """The config with each `keras.layers.MultiHeadAttention` entry ours."""
    if isinstance(config, dict):
        out = {k: _rename_attention(v, implementation, renamed) for k, v in config.items()}
        if (
            config.get("class_name") == "MultiHeadAttention"
            and str(config.get("module", "")).startswith("keras")
            and not config.get("registered_name")
        ):
            out.update(_OURS)
            inner = dict(out.get("config", {}))
            inner.pop("flash_attention", None)  # Keras's resolved flag; ours re-reads it
            out["config"] = {**inner, "implementation": implementation}
            renamed.append(inner.get("name"))
        return out
    if isinstance(config, list):
        return [_rename_attention(v, implementation, renamed) for v in config]
    return config


# ----------------------------------------------- layers created in build()
_REBASED: dict[type, type] = {}


def _rebase(cls: type) -> type:
    """`cls` (a subclass of keras.layers.MultiHeadAttention) with our layer
    where Keras's was among its bases; its methods' `super()` follows."""
    if cls is KerasMHA:
        return MultiHeadAttention
    if cls in _REBASED:
        return _REBASED[cls]
    bases = tuple(
        _rebase(b) if isinstance(b, type) and issubclass(b, KerasMHA) else b for b in cls.__bases__
    )
    namespace = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    new = type(MultiHeadAttention)(cls.__name__, bases, namespace)
    new.__qualname__ = cls.__qualname__
    new.__module__ = cls.__module__
    for name, value in namespace.items():  # zero-argument super(): the new class
        setattr(new, name, _with_class(value, cls, new))
    _REBASED[cls] = new
    return new


def _with_class(value, old: type, new: type):
    """A function (or property, classmethod, staticmethod) whose `__class__`
    cell (zero-argument super) points to `new` instead of `old`."""
    if isinstance(value, property):
        fget, fset, fdel = (_with_class(f, old, new) for f in (value.fget, value.fset, value.fdel))
        return property(fget, fset, fdel, value.__doc__)
    if isinstance(value, (classmethod, staticmethod)):
        return type(value)(_with_class(value.__func__, old, new))
    if not isinstance(value, types.FunctionType) or "__class__" not in value.__code__.co_freevars:
        return value
    cells = tuple(
        types.CellType(new) if name == "__class__" and cell.cell_contents is old else cell
        for name, cell in zip(value.__code__.co_freevars, value.__closure__)
    )
    copied = types.FunctionType(
        value.__code__, value.__globals__, value.__name__, value.__defaults__, cells
    )
    copied.__kwdefaults__ = value.__kwdefaults__
    copied.__qualname__, copied.__doc__ = value.__qualname__, value.__doc__
    copied.__dict__.update(value.__dict__)
    return copied


def _converted(old, implementation: str):
    """Ours for one built Keras attention layer (or subclass), checked."""
    where = f"'{old.name}' ({type(old).__qualname__})"
    if not old.built:
        raise ValueError(f"convert cannot convert {where}: it is not built.")
    with contextlib.ExitStack() as scopes:  # the variables' paths: the old ones'
        for name in _scope_of(old):
            scopes.enter_context(keras.name_scope(name))
        new = _built_like(old, where, implementation)
    _check(old, new, where)
    return new


def _scope_of(layer) -> list[str]:
    """The name scopes `layer` was built in: its parents' names, read off
    its first variable's path ("block_0/attention/query/kernel")."""
    if not layer.weights:
        return []
    head, found, _ = layer.weights[0].path.rpartition(f"{layer.name}/")
    return [part for part in head.split("/") if part] if found else []


def _built_like(old, where: str, implementation: str):
    """Ours (or old's class on our base), built as old is, old's weights."""
    if type(old) is KerasMHA:
        new = MultiHeadAttention.from_keras(old, implementation=implementation)
    else:
        try:
            config = {**old.get_config(), "implementation": implementation}
            new = _rebase(type(old)).from_config(config)
            new.build_from_config(old.get_build_config())
            new.set_weights(old.get_weights())
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(
                f"convert cannot convert {where}: it relies on what our layer does not "
                f"have ({type(exc).__name__}: {keras_error_line(exc)})."
            ) from None
    return new


def _check(old, new, where: str) -> None:
    """Outputs equal on a random input built from the build shapes, when
    the old layer can be called as `layer(query, value)`."""
    shapes = (old.get_build_config() or {}).get("shapes_dict", {})
    if "query_shape" not in shapes or "value_shape" not in shapes:
        return
    rng = np.random.default_rng(0)

    def sample(shape):  # None: batch 2, length 5
        dims = [(2 if i == 0 else 5) if d is None else d for i, d in enumerate(shape)]
        return rng.standard_normal(dims).astype("float32")

    query, value = sample(shapes["query_shape"]), sample(shapes["value_shape"])
    try:
        want = old(query, value)
    except Exception:  # called otherwise (XLNet's two streams): nothing to compare
        return
    try:
        got = new(query, value)
    except Exception as exc:
        raise ValueError(
            f"convert cannot convert {where}: our copy fails where Keras's runs "
            f"({type(exc).__name__}: {keras_error_line(exc)})."
        ) from None
    want = keras.ops.convert_to_numpy(want[0] if isinstance(want, (tuple, list)) else want)
    got = keras.ops.convert_to_numpy(got[0] if isinstance(got, (tuple, list)) else got)
    error = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
    if got.shape != want.shape or error > TOLERANCE:
        raise ValueError(
            f"convert cannot convert {where}: its outputs differ from Keras's "
            f"(relative error {error:.2g}, allowed {TOLERANCE:g})."
        )


def keras_error_line(exc: BaseException) -> str:
    """The error itself, without Keras's call report around it (colour
    codes, "Exception encountered when calling ...", the arguments)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    if len(lines) > 1 and lines[0].startswith("Exception encountered when calling"):
        return lines[1]
    return lines[0] if lines else type(exc).__name__


def _replace(parent, name: str, old, new) -> None:
    """`parent.<name> = new` in place of `old`, at old's place among the
    parent's tracked sublayers (so the parent's weight order is kept)."""
    layers = parent._layers
    index = next((i for i, layer in enumerate(layers) if layer is old), None)
    locked = parent._tracker.locked
    parent._tracker.unlock()
    try:
        if index is not None:
            parent._tracker.untrack(old)
        setattr(parent, name, new)
    finally:
        if locked:
            parent._tracker.lock()
    if index is not None:
        position = next(i for i, layer in enumerate(layers) if layer is new)
        layers.insert(index, layers.pop(position))
