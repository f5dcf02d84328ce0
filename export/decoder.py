"""A language model (keras_mha.decoder) as a TFLite file with its KV cache outside.

    prefill(ids (1, P) int32, cache (L, 2, 1, S, h_kv, d) float32, index (1,) int32)
        -> logits (1, P, V) float32, cache
    decode (ids (1, 1) int32, cache, index) -> logits (1, 1, V), cache

Both signatures are `Decoder.step` traced at fixed shapes over the same
weights (the converter stores them once): S, the context the device gets
(`context`), and P, how many prompt tokens one prefill call takes
(`prefill`). The cache is an input and an output, not a variable: the
device app carries it between calls (edge_demo/runtimes/generate.py), which
every TFLite runtime can, and one file serves any number of conversations.
Its size is the GQA saving made concrete: L x 2 x h_kv x d floats a token,
h / h_kv times fewer than a cache of every query head's keys and values.

Modes: float32, float16 (weights), dynamic (int8 weights, the activations
quantized on the fly): the cache stays float32 in all three.
"""

from __future__ import annotations

import pathlib
import tempfile

from bundle_contract.errors import UsageError

DECODER_MODES = ("float32", "float16", "dynamic")
PREFILL = 16  # prompt tokens a prefill call takes (keras_mha/decoder/generate.py's bucket)


def cache_shape(config, context: int) -> tuple[int, ...]:
    """`(L, 2, 1, S, h_kv, d)`: every layer's keys and values for `context` positions."""
    return (config.num_hidden_layers, 2, 1, int(context),
            config.num_key_value_heads, config.head_dim)  # fmt: skip


def check_sizes(config, context: int, prefill: int) -> None:
    """UsageError (one line) for a context or prefill length the model cannot take."""
    limit = config.max_position_embeddings
    if not 2 <= context <= limit:
        raise UsageError(f"must be between 2 and the model's {limit} positions, got {context}",
                         "--context")  # fmt: skip
    if not 1 <= prefill <= context:
        raise UsageError(f"must be between 1 and the context ({context}), got {prefill}",
                         "--prefill")  # fmt: skip


def write_decoder_saved_model(model, directory, context: int, prefill: int = PREFILL) -> None:
    """`model.step` traced as the prefill and decode signatures into a SavedModel."""
    import keras
    import tensorflow as tf

    from keras_mha.quiet_tensorflow import captured_output

    config = model.decoder_config
    check_sizes(config, context, prefill)
    layers = config.num_hidden_layers

    def step(ids, cache, index):
        caches = [(cache[i, 0], cache[i, 1]) for i in range(layers)]
        logits, caches = model.step(ids, caches, index[0])
        return {"logits": logits, "cache": tf.stack([tf.stack(kv) for kv in caches])}

    cache = tf.TensorSpec(cache_shape(config, context), tf.float32, name="cache")
    index = tf.TensorSpec((1,), tf.int32, name="index")  # (1,): a manifest shape has an axis
    archive = keras.export.ExportArchive()
    archive.track(model)
    for name, length in (("prefill", prefill), ("decode", 1)):
        ids = tf.TensorSpec((1, length), tf.int32, name="ids")
        archive.add_endpoint(name, step, [ids, cache, index])
    with captured_output():
        archive.write_out(str(directory), verbose=False)


def convert_decoder(model, mode: str, context: int, prefill: int = PREFILL) -> bytes:
    """The TFLite file of `model` in `mode` (DECODER_MODES) with both signatures."""
    from keras_mha.quiet_tensorflow import import_tensorflow

    from .convert import run_converter

    if mode not in DECODER_MODES:
        raise UsageError(
            f"a language model exports as {', '.join(DECODER_MODES)}, not {mode!r}", "--quant"
        )
    tf = import_tensorflow()
    with tempfile.TemporaryDirectory() as scratch:
        saved = pathlib.Path(scratch) / "decoder"
        write_decoder_saved_model(model, saved, context, prefill)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            str(saved), signature_keys=["prefill", "decode"]
        )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if mode != "float32":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if mode == "float16":
            converter.target_spec.supported_types = [tf.float16]
        return run_converter(converter)
