"""Rescaling an encoder's residual stream for int8: the same function, smaller outliers.

    keras-mha-rescale RUN_DIR --out RESCALED_RUN [--alpha 0.75] [--ffn-ratio 4] [--overwrite]

(the command: keras_mha/pretrained/cli.py, `rescale_main`).

A post-LN BERT carries a few huge channels in its residual stream: in
all-MiniLM-L6-v2 the sums that feed the FFN LayerNorms reach |x| = 224 on
one channel while the median channel stays under 2.5. Full-integer int8 has
one scale per tensor, so a typical value there is a fraction of a quantum
(docs/quantization.md). This is SmoothQuant's idea (Xiao et al. 2022)
carried through a post-LN network, where it can be folded exactly:

- every LayerNorm k gets a per-channel output scale b_k: it writes h / b_k
  (gamma and beta divided by b_k) and the next LayerNorm reads the residual
  sum divided by the same b_k (`LayerNorm(input_scale=True)` with s = b_k);
- the Dense layers that read h / b_k take b_k into their input rows (Q, K,
  V and the FFN's first layer), and those that write into the sum divided by
  b_k take 1 / b_k into their output columns and bias (W^O, FFN out);
- the embedding LayerNorm reads the embedding sum divided by a_0, folded
  into the word, position and type tables;
- the last LayerNorm keeps b = 1, so pooling and the unit-norm output are
  untouched.

The FFN's hidden layer has outliers of its own after GELU (one unit of
MiniLM's first block reaches 24.7 where the median unit's maximum is 1.3),
and no scale can be folded through GELU. The units above `ffn_ratio` x the
median's maximum move, unchanged, into a second Dense pair of the block
(`TransformerEncoderBlock(ffn_outliers=k)`), whose output is added: int8
then has one scale for them and another for the rest.

In float the rescaled encoder computes the same vectors (tested to 1e-5).
b_k = (m_j / median_j m_j) ** alpha per channel j, where m is the largest
|value| the calibration sentences give on that channel of LayerNorm k's
output or of the sum the next LayerNorm reads; alpha = 0 is no rescaling,
1 makes every channel's maximum the median's (the weights then carry all of
it), 0.5 splits it (SmoothQuant's default).
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from bundle_contract.arrays import own_lengths

DEFAULT_ALPHA = 0.75
DEFAULT_FFN_RATIO = 4.0


@dataclasses.dataclass(frozen=True)
class NormRange:
    """The largest |value| per channel over the calibration sentences, around one LayerNorm."""

    name: str  # the LayerNorm's path, e.g. "transformer_layer_0/ffn_norm"
    inputs: np.ndarray  # (d,) what it reads
    outputs: np.ndarray  # (d,) what it writes

    def describe(self) -> str:
        def part(m: np.ndarray) -> str:
            return f"max {m.max():.1f} / median channel {np.median(m):.2f}"

        return f"{self.name}: reads {part(self.inputs)}; writes {part(self.outputs)}"


def _embedding(model):
    """The encoder's BertEmbeddings layer; ValueError for any other model."""
    for layer in model.layers:
        if type(layer).__name__ == "BertEmbeddings":
            return layer
    raise ValueError(
        f"Model {model.name!r} is not an encoder from keras_mha.pretrained "
        "(no BertEmbeddings); expected a model from keras-mha-import."
    )


def _norms(model) -> list:
    """The encoder's LayerNorms in the order the residual stream meets them."""
    from keras_mha.model import encoder_blocks

    norms = [_embedding(model).norm]
    for block in encoder_blocks(model):
        norms += [block.attention_norm, block.ffn_norm]
    return norms


def norm_ranges(model, ids: np.ndarray) -> list[NormRange]:
    """Each LayerNorm's input and output channel maxima over `ids` (N, T), 0-padded."""
    return measure(model, ids)[0]


def measure(model, ids: np.ndarray) -> tuple[list[NormRange], list[np.ndarray]]:
    """(each LayerNorm's input and output channel maxima, each block's FFN hidden
    unit maxima after the activation) over `ids` (N, T), padded with the model's pad id.

    Every sentence runs at its own length, as the device runs it, so padding
    never enters the ranges. Sentences of one length run as one batch: a
    maximum over rows does not depend on how they are grouped (the maxima moved by
    5e-7 relatively), and all-MiniLM-L6-v2's 100 calibration sentences of 19
    lengths take 19 calls instead of 100: 2.8 CPU-s instead of 10.8 (Intel Xeon).
    """
    from keras import ops

    from keras_mha.model import encoder_blocks
    from keras_mha.pretrained.encoding import pad_id_of

    norms = _norms(model)
    hidden_layers = [block._ffn_in for block in encoder_blocks(model)]
    seen: dict[int, list[np.ndarray]] = {}
    hidden: dict[int, np.ndarray] = {}

    def recording_hidden(i: int, call):
        def wrapped(x, *args, **kwargs):
            y = call(x, *args, **kwargs)
            m = np.abs(ops.convert_to_numpy(y)).reshape(-1, y.shape[-1]).max(0)
            hidden[i] = m if i not in hidden else np.maximum(hidden[i], m)
            return y

        return wrapped

    def recording(i: int, call):
        def wrapped(x, *args, **kwargs):
            y = call(x, *args, **kwargs)
            d = x.shape[-1]
            a = np.abs(ops.convert_to_numpy(x)).reshape(-1, d).max(0)
            b = np.abs(ops.convert_to_numpy(y)).reshape(-1, d).max(0)
            old = seen.get(i)
            seen[i] = [a, b] if old is None else [np.maximum(old[0], a), np.maximum(old[1], b)]
            return y

        return wrapped

    for i, norm in enumerate(norms):  # instance attributes, removed below
        norm.call = recording(i, norm.call)
    for i, dense in enumerate(hidden_layers):
        dense.call = recording_hidden(i, dense.call)
    ids = np.asarray(ids)
    try:
        pad_id = pad_id_of(model)
        lengths = own_lengths(ids, pad_id)  # as the device and calibration cut them
        kept = (ids != pad_id).any(axis=1)  # an all-padding row has no sentence
        for n in np.unique(lengths[kept]):
            model(ids[kept & (lengths == n), : int(n)])
    finally:
        for layer in (*norms, *hidden_layers):
            del layer.call
    if len(seen) != len(norms):
        raise ValueError(f"Expected calibration token ids with a token per row; got {ids.shape}.")
    ranges = [NormRange(n.path, *seen[i]) for i, n in enumerate(norms)]
    return ranges, [hidden[i] for i in range(len(hidden_layers))]


def ffn_outlier_units(maxima: np.ndarray, ratio: float = DEFAULT_FFN_RATIO) -> np.ndarray:
    """The FFN hidden units whose largest activation exceeds `ratio` x the median unit's."""
    if ratio <= 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(maxima > ratio * np.median(maxima))


def channel_scales(ranges: list[NormRange], alpha: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """(a_0 for the embedding sum, b_k for each LayerNorm's output) from the ranges."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"Expected alpha in [0, 1]; received alpha={alpha!r}.")

    def scale(m: np.ndarray) -> np.ndarray:
        m = np.maximum(m.astype(np.float64), 1e-6)
        return (m / np.median(m)) ** alpha

    first = scale(ranges[0].inputs)
    outputs = [scale(np.maximum(r.outputs, nxt.inputs)) for r, nxt in zip(ranges[:-1], ranges[1:])]
    outputs.append(np.ones_like(first))  # the last LayerNorm writes the model's own values
    return first, outputs


def rescale_encoder(
    model, ids: np.ndarray, alpha: float = DEFAULT_ALPHA, ffn_ratio: float = DEFAULT_FFN_RATIO
):
    """A new encoder computing what `model` does, its residual stream divided per channel
    and each block's outlier FFN units in their own Dense pair (`ffn_ratio` <= 0: none).

    `ids`: calibration token ids (N, T), 0-padded. Returns `(model, ranges)`,
    the ranges measured on `model` (module docstring).
    """
    import keras

    from keras_mha.model import encoder_blocks

    ranges, hidden = measure(model, ids)
    first, scales = channel_scales(ranges, alpha)
    outliers = [ffn_outlier_units(m, ffn_ratio) for m in hidden]
    config = model.get_config()
    blocks = {b.name: i for i, b in enumerate(encoder_blocks(model))}
    for layer in config["layers"]:
        if layer["class_name"] in ("BertEmbeddings", "TransformerEncoderBlock"):
            layer["config"]["norm_input_scale"] = True
        if layer["class_name"] == "TransformerEncoderBlock":
            layer["config"]["ffn_outliers"] = int(len(outliers[blocks[layer["config"]["name"]]]))
    rescaled = keras.Model.from_config(config)

    values = {w.path: np.asarray(keras.ops.convert_to_numpy(w), np.float64) for w in model.weights}
    e = _embedding(model).path
    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        values[f"{e}/{table}"] = values[f"{e}/{table}"] / first

    def norm(path: str, reads: np.ndarray, writes: np.ndarray) -> None:
        values[f"{path}/input_scale"] = reads
        values[f"{path}/gamma"] = values[f"{path}/gamma"] * reads / writes
        values[f"{path}/beta"] = values[f"{path}/beta"] / writes

    norm(f"{e}/norm", first, scales[0])
    previous = scales[0]
    for i, block in enumerate(encoder_blocks(model)):
        p, attention = block.path, block.attention.path
        after_attention, after_ffn = scales[1 + 2 * i], scales[2 + 2 * i]
        for name in ("query", "key", "value"):  # kernels (d, h, d_k): input rows
            values[f"{attention}/{name}/kernel"] *= previous[:, None, None]
        values[f"{attention}/attention_output/kernel"] /= previous  # (h, d_v, d)
        values[f"{attention}/attention_output/bias"] /= previous
        norm(f"{p}/attention_norm", previous, after_attention)
        values[f"{p}/ffn_in/kernel"] *= after_attention[:, None]
        values[f"{p}/ffn_out/kernel"] /= after_attention
        values[f"{p}/ffn_out/bias"] /= after_attention
        norm(f"{p}/ffn_norm", after_attention, after_ffn)
        previous = after_ffn
        units = outliers[i]
        if len(units):  # the outlier units move, in order, to the second Dense pair
            rest = np.setdiff1d(np.arange(values[f"{p}/ffn_in/bias"].shape[0]), units)
            kernel_in, bias_in = values[f"{p}/ffn_in/kernel"], values[f"{p}/ffn_in/bias"]
            kernel_out = values[f"{p}/ffn_out/kernel"]
            values[f"{p}/ffn_in/kernel"], values[f"{p}/ffn_in/bias"] = (
                kernel_in[:, rest],
                bias_in[rest],
            )
            values[f"{p}/ffn_in_outliers/kernel"] = kernel_in[:, units]
            values[f"{p}/ffn_in_outliers/bias"] = bias_in[units]
            values[f"{p}/ffn_out/kernel"] = kernel_out[rest]
            values[f"{p}/ffn_out_outliers/kernel"] = kernel_out[units]
    missing = [w.path for w in rescaled.weights if w.path not in values]
    if missing:
        raise ValueError(f"The rescaled encoder has weights the encoder lacks: {missing[:3]}.")
    for w in rescaled.weights:
        w.assign(values[w.path].astype(w.dtype))
    return rescaled, ranges


def rescale_run(
    run_dir,
    out,
    alpha: float = DEFAULT_ALPHA,
    ffn_ratio: float = DEFAULT_FFN_RATIO,
    overwrite: bool = False,
    log=print,
):
    """An embedding run's encoder rescaled (`rescale_encoder`) as a new run at `out`.

    The eval reference stays the run's own vectors: int8 of the rescaled
    encoder is checked against the encoder as it was imported.
    """
    from keras_mha.model import encoder_blocks
    from keras_mha.pretrained.bert import encoder_forward
    from keras_mha.rundir.embedding import read_embedding_run, write_embedding_run
    from keras_mha.rundir.writing import check_out

    check_out(out, overwrite)
    run = read_embedding_run(run_dir)
    model = run.load_model()
    rescaled, ranges = rescale_encoder(model, run.calibration, alpha, ffn_ratio)
    x = run.eval.x[: min(64, len(run.eval.x))]
    before = np.asarray(encoder_forward(model, x))
    after = np.asarray(encoder_forward(rescaled, x))
    gap = float(np.abs(before - after).max())
    if gap > 1e-4:  # the folding is exact; float rounding alone stays near 1e-7
        raise ValueError(f"The rescaled encoder differs from the encoder by {gap:.2e} (> 1e-4).")
    metrics = {
        **run.metrics,
        "rescale": {
            "alpha": alpha,
            "ffn_ratio": ffn_ratio,
            "ffn_outliers": [int(b.ffn_outliers) for b in encoder_blocks(rescaled)],
            "float_max_abs_diff": gap,
            "largest_input_before": [round(float(r.inputs.max()), 3) for r in ranges],
        },
    }
    written = write_embedding_run(
        out,
        rescaled,
        metrics,
        run.eval.x,
        run.eval.probs,
        run.calibration,
        list(run.texts),
        (pathlib.Path(run.path) / "tokenizer.json").read_bytes(),
        overwrite=overwrite,
        y=run.gold_labels,
    )
    after_ranges = norm_ranges(rescaled, run.calibration)
    for old, new in zip(ranges, after_ranges):
        log(f"  {old.name}: reads max {old.inputs.max():.1f} -> {new.inputs.max():.1f}")
    log(f"{out}: rescaled (alpha {alpha}); float vectors within {gap:.1e} of {run_dir}'s")
    return written
