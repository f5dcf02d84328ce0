"""Regenerate the legacy `.keras` fixtures: files written by keras_mha 0.1.0.

keras_mha 0.1.0 (commit 588c9bd) stored the layer's weights on the layer
itself, per head first: `query_kernel` (h, d_model, d_k), ...,
`output_kernel` (h * d_v, d_out), and called the output size `output_dim`.
Today's layer keeps Keras's sublayer layout (docs/layer.md) and must still
load those files. This script takes attention.py and layers.py from that
commit with `git show`, saves two small models with them and records their
outputs on fixed inputs:

    .venv/bin/python tests/data/make_legacy_fixtures.py

    .venv/bin/python tests/data/make_legacy_fixtures.py [OUT_DIR]

Writes OUT_DIR/legacy_0.1.0_{mha,block}.keras and legacy_0.1.0.npz (OUT_DIR
defaults to .cache/legacy_fixtures). Model files are not committed: the tests
make them once from the git history (tests/test_attention_keras.py) with the
running Keras backend, and skip, saying why, where that history is missing.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
COMMIT = "588c9bd"

SCRIPT = r"""
import sys, numpy as np, keras
from keras_mha import MultiHeadAttention, TransformerEncoderBlock
out = sys.argv[1]
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 5, 8)).astype("float32")
m = rng.standard_normal((2, 3, 4)).astype("float32")
q_in = keras.Input((5, 8)); m_in = keras.Input((3, 4))
mha = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=4, output_dim=6, name="mha")
biasless = MultiHeadAttention(num_heads=4, use_bias=False, implementation="per_head", name="nobias")
y = mha(q_in, m_in)
model = keras.Model([q_in, m_in], [y, biasless(q_in)])
model.save(out + "/legacy_0.1.0_mha.keras")
b_in = keras.Input((5, 8))
block = keras.Model(b_in, TransformerEncoderBlock(num_heads=2, ff_dim=16, name="block")(b_in))
block.save(out + "/legacy_0.1.0_block.keras")
y1, y2 = model.predict([x, m], verbose=0)
np.savez(out + "/legacy_0.1.0.npz", x=x, m=m, mha=y1, nobias=y2,
         block=block.predict(x, verbose=0))
"""


CACHE = REPO / ".cache" / "legacy_fixtures"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = pathlib.Path(argv[0]) if argv else CACHE
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        package = pathlib.Path(tmp) / "keras_mha"
        package.mkdir()
        for name in ("attention.py", "layers.py"):
            source = subprocess.run(
                ["git", "show", f"{COMMIT}:keras_mha/{name}"],
                cwd=REPO,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            (package / name).write_text(source)
        (package / "__init__.py").write_text(
            "from keras_mha.attention import MultiHeadAttention\n"
            "from keras_mha.layers import TransformerEncoderBlock\n"
        )
        env = {**os.environ, "PYTHONPATH": tmp}
        subprocess.run(
            [sys.executable, "-c", SCRIPT, str(out.resolve())],
            env=env,
            check=True,
            cwd=tmp,
            capture_output=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
