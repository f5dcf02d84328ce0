"""An imported checkpoint's outputs on this interpreter's Keras backend.

Runs in a backend venv (.venv-jax, .venv-torch; KERAS_BACKEND set, the
repository on PYTHONPATH); tests/test_pretrained.py compares what it writes
with transformers' reference.

    python tests/oracle/backend_outputs.py MODEL_DIR REF.npz OUT.npz [--max-length 64]
    python tests/oracle/backend_outputs.py LLAMA_DIR_OR_GGUF REF.npz OUT.npz --decoder
        [--new-tokens 16] [--implementation fused]
    python tests/oracle/backend_outputs.py serve   (commands as JSON lines on stdin)

OUT.npz: `vectors` (the encoder's outputs on REF.npz's input_ids) and `a0`,
`a1`, ... (every layer's attention weights). With --decoder (a Llama folder or a .gguf file,
keras_mha.decoder, REF.npz from tests/oracle/llama_oracle.py): for each
prompt n, `logits_n`, `attention_n_l` and `generated_n` (greedy, the KV
cache). The last line printed is
{"backend": NAME}, the backend that computed them.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backend_outputs.py")
    parser.add_argument("model_dir")
    parser.add_argument("ref")
    parser.add_argument("out")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--decoder", action="store_true")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--implementation", default="fused")
    parser.add_argument("--stop-at-eos", action="store_true")
    args = parser.parse_args(argv)
    if args.decoder:
        return decoder_outputs(args)

    import keras
    import numpy as np

    from keras_mha.pretrained import load

    keras.backend.clear_session()  # a served process: each model as in a process of its own
    encoder = load(args.model_dir, max_length=args.max_length)
    with np.load(args.ref) as ref:
        ids = ref["input_ids"]
    vectors = encoder.embed_ids(ids)
    attention = encoder.attention(ids)
    np.savez(args.out, vectors=vectors, **{f"a{i}": a for i, a in enumerate(attention)})
    print(json.dumps({"backend": keras.backend.backend()}))
    return 0


def decoder_outputs(args) -> int:
    import keras
    import numpy as np

    from keras_mha import decoder

    keras.backend.clear_session()
    model = decoder.load(args.model_dir, implementation=args.implementation)
    with np.load(args.ref) as ref:
        prompts = [ref[k] for k in sorted((k for k in ref.files if k.startswith("ids_")),
                                          key=lambda k: int(k.split("_")[1]))]  # fmt: skip
    arrays = {}
    for n, ids in enumerate(prompts):
        logits, scores = model.logits(ids[None], return_attention_scores=True)
        arrays[f"logits_{n}"] = logits[0]
        arrays.update({f"attention_{n}_{i}": s[0] for i, s in enumerate(scores)})
        # as the oracle's generate: min_new_tokens=new_tokens, or --stop-at-eos
        done = model.generate_ids(ids, args.new_tokens, stop_at_eos=args.stop_at_eos)
        arrays[f"generated_{n}"] = np.asarray(done.new_ids)
    np.savez(args.out, **arrays)
    print(json.dumps({"backend": keras.backend.backend()}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        import serving  # beside this file: the script's folder is on sys.path

        sys.exit(serving.serve(main))
    sys.exit(main())
