"""A language model as a TFLite file with its KV cache outside (export/decoder.py), run
by the device's code (edge_demo/runtimes/generate.py): prefill and decode signatures,
the cache carried between calls, the same logits and greedy tokens as Keras."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_decoder import LOGIT_TOLERANCE, random_decoder

CONTEXT = 36  # of random_decoder's 40 positions: not a multiple of PREFILL
PREFILL = 8


@pytest.fixture(scope="module")
def decoder():
    return random_decoder()


@pytest.fixture(scope="module")
def converted(decoder):
    from keras_mha_export.decoder import convert_decoder

    return {
        mode: convert_decoder(decoder, mode, CONTEXT, PREFILL) for mode in ("float32", "float16")
    }


def on_device(content: bytes):
    from edge_demo.runtimes.generate import CachedDecoder
    from edge_demo.runtimes.runtime import select_runtime

    return CachedDecoder(select_runtime("litert"), content)


def keras_logits(model, ids) -> np.ndarray:
    from keras import ops

    return ops.convert_to_numpy(model(np.asarray(ids, np.int32)[None]))[0]


def spread_error(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours - theirs).max() / theirs.std())


@pytest.mark.slow
def test_the_file_has_prefill_and_decode_over_one_cache(decoder, converted):
    from keras_mha.decoder.heads import cache_bytes_per_token
    from keras_mha_export.decoder import cache_shape

    device = on_device(converted["float32"])
    c = decoder.decoder_config
    assert device.cache_shape == cache_shape(c, CONTEXT) == (2, 2, 1, CONTEXT, 2, 8)
    assert (device.chunk, device.context) == (PREFILL, CONTEXT)
    # GQA: 2 key/value heads for 4 query heads, half the cache of plain multi-head
    assert cache_bytes_per_token(c, 2 * 2) * 2 == cache_bytes_per_token(c, 2 * 4) == 512


@pytest.mark.slow
@pytest.mark.parametrize("length", [1, 7, 8, 21, CONTEXT])
def test_every_positions_logits_are_keras_s(decoder, converted, length):
    """Teacher-forced: prefill chunks of 8, a last chunk padded (21: chunks at 0, 8,
    then 16..20 padded to 23), and where a chunk would run past the context, one
    decode call a token (36: a chunk at 32 would need 40 positions).
    float32 on both sides, other kernels (XNNPACK's against TensorFlow's):
    measured 1.6e-6 to 5.4e-6 of the logits' spread (AMD EPYC); the bound is
    the project's for two float32 implementations (tests/test_decoder.py)."""
    ids = np.random.default_rng(length).integers(0, 50, length).tolist()
    theirs = keras_logits(decoder, ids)
    ours = on_device(converted["float32"]).logits(ids)
    assert ours.shape == theirs.shape == (length, 50)
    assert spread_error(ours, theirs) <= LOGIT_TOLERANCE


@pytest.mark.slow
def test_a_tail_past_the_last_chunk_goes_a_token_a_call(decoder, converted):
    """35 tokens: chunks at 0..31, then 32 + 8 > 36, so 32..34 one decode call each."""
    ids = np.random.default_rng(5).integers(0, 50, 35).tolist()
    device = on_device(converted["float32"])
    calls = []
    for name in ("prefill", "decode"):
        runner = getattr(device, name)
        setattr(
            device, name, lambda runner=runner, name=name, **kw: calls.append(name) or runner(**kw)
        )
    ours = device.logits(ids)
    assert calls == ["prefill"] * 4 + ["decode"] * 3
    assert spread_error(ours, keras_logits(decoder, ids)) <= LOGIT_TOLERANCE


@pytest.mark.slow
def test_greedy_tokens_are_keras_s_over_the_cache(decoder, converted):
    """The device's greedy loop (one decode call a token, the cache carried)
    against keras_mha.decoder.generate.greedy: the same tokens, where no step was
    a tie (top two within twice the logits' bound, either side's error)."""
    from keras_mha.decoder.generate import greedy

    prompt = np.random.default_rng(11).integers(0, 50, 5).tolist()
    theirs = greedy(decoder, prompt, 30)
    streamed = []
    ours = on_device(converted["float32"]).greedy(prompt, 30, on_token=streamed.append)
    spread = keras_logits(decoder, prompt).std()
    ties = [i for i, gap in enumerate(theirs.gaps) if gap <= 2 * LOGIT_TOLERANCE * spread]
    end = ties[0] if ties else 30
    assert ours.new_ids[:end] == theirs.new_ids[:end] and streamed == ours.new_ids
    assert len(ours.new_ids) == 30 and not ties  # decisive random weights: no tie met


@pytest.mark.slow
def test_float16_weights_stay_within_their_rounding(decoder, converted):
    """float16 weights: each rounded to 11 significant bits (relative error at most
    2^-11 = 4.9e-4); through two blocks and the tied head the logits move by a
    few times that of their spread (measured 1.9e-3, AMD EPYC); 1e-2 allows 20
    times the rounding."""
    ids = np.random.default_rng(3).integers(0, 50, 24).tolist()
    theirs = keras_logits(decoder, ids)
    assert spread_error(on_device(converted["float16"]).logits(ids), theirs) <= 1e-2


@pytest.mark.slow
def test_what_the_device_refuses_is_one_line(decoder, converted):
    from bundle_contract.errors import UsageError
    from keras_mha_export.decoder import convert_decoder

    device = on_device(converted["float32"])
    with pytest.raises(UsageError, match="exceed the file's context of 36") as info:
        device.greedy(list(range(35)), 6)
    assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match="is empty"):
        device.greedy([], 3)
    with pytest.raises(UsageError, match="between 2 and the model's 40 positions"):
        convert_decoder(decoder, "float32", 41)
    with pytest.raises(UsageError, match="not 'int8'"):
        convert_decoder(decoder, "int8", CONTEXT)


@pytest.mark.slow
def test_a_file_without_a_decode_signature_is_refused():
    """An ordinary one-signature file given as a language model: one line, naming what is missing."""
    import keras
    import tensorflow as tf

    from bundle_contract.errors import UsageError

    inputs = keras.Input((4,), batch_size=1)
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    blob = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    with pytest.raises(UsageError, match="has no prefill or decode signature") as info:
        on_device(blob)
    assert "\n" not in str(info.value)
