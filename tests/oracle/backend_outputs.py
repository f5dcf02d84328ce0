"""An imported checkpoint's outputs on this interpreter's Keras backend.

Runs in a backend venv (.venv-jax, .venv-torch; KERAS_BACKEND set, the
repository on PYTHONPATH); tests/test_pretrained.py compares what it writes
with transformers' reference.

    python tests/oracle/backend_outputs.py MODEL_DIR REF.npz OUT.npz [--max-length 64]
    python tests/oracle/backend_outputs.py serve   (commands as JSON lines on stdin)

OUT.npz: `vectors` (the encoder's outputs on REF.npz's input_ids) and `a0`,
`a1`, ... (every layer's attention weights). The last line printed is
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
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        import serving  # beside this file: the script's folder is on sys.path

        sys.exit(serving.serve(main))
    sys.exit(main())
