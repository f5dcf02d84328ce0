"""What each lever does to a sentence encoder's full-integer int8 (docs/quantization.md).

For an embedding run (keras-mha-import), every lever is applied to the
encoder, the result exported in int8 by keras-mha-export (each calibration
sentence at its own length, as the device runs it) and scored by the device's
own code against the run's float vectors: min and mean cosine, top-1 and
top-5 nearest-neighbour agreement, the share of attention rows off by more
than 0.25 (worst layer), the op count. One row per lever:

- `ptq`: plain post-training int8 (min/max ranges from the calibration);
- `rescale a=A`: keras_mha.pretrained.rescale with alpha A, FFN outliers
  left in place (`ffn_ratio` 0); alpha 0 changes only how the LayerNorms
  compute their variance (a dot product per token);
- `+ ffn split`: and the FFN outlier units in their own Dense pair;
- `+ per-head graph`: and the attention computed head by head
  (`implementation="per_head"`), so each head's scores get their own scale;
- `+ ranges`, `+ mse ranges`: and every point of keras_mha.qat given its
  min/max range, or the range with the smallest squared rounding error
  (ranges.json, which the export passes to the converter as FakeQuant
  ranges);
- `+ qat N`: and N steps of quantization-aware distillation
  (`keras-mha-qat`, about 3.5 s a step here).

Each row takes about 2 minutes on 2 cores for all-MiniLM-L6-v2.

    python benchmarks/int8_levers.py RUN_DIR [--json OUT] [--work DIR] [--levers ptq,0.75,...]
    make int8-levers   # runs/minilm, imported first if missing
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _util import write_json_atomic  # noqa: E402  (benchmarks/ is the script directory)

from edge_demo.tables import format_table  # noqa: E402

LEVERS = {
    "ptq": None,
    "rescale a=0": {"alpha": 0.0, "ffn_ratio": 0.0},
    "rescale a=0.25": {"alpha": 0.25, "ffn_ratio": 0.0},
    "rescale a=0.5": {"alpha": 0.5, "ffn_ratio": 0.0},
    "rescale a=0.75": {"alpha": 0.75, "ffn_ratio": 0.0},
    "rescale a=1": {"alpha": 1.0, "ffn_ratio": 0.0},
    "rescale a=0.75 + ffn split": {"alpha": 0.75, "ffn_ratio": 4.0},
    "rescale a=0.75 + per-head graph": {"alpha": 0.75, "ffn_ratio": 0.0, "per_head": True},
    "rescale a=0.75 + ffn split + ranges": {"alpha": 0.75, "ffn_ratio": 4.0, "ranges": "minmax"},
    "rescale a=0.75 + ffn split + mse ranges": {"alpha": 0.75, "ffn_ratio": 4.0, "ranges": "mse"},
    "rescale a=0.75 + ffn split + qat 150": {"alpha": 0.75, "ffn_ratio": 4.0, "qat": 150},
}


def _per_head(run_dir: pathlib.Path) -> None:
    """Rewrite the run's model with every block's attention computed head by head."""
    import keras

    from keras_mha.rundir.reading import load_keras_model

    model = load_keras_model(run_dir / "model.keras")
    config = model.get_config()
    for layer in config["layers"]:
        if layer["class_name"] == "TransformerEncoderBlock":
            layer["config"]["implementation"] = "per_head"
    rebuilt = keras.Model.from_config(config)
    rebuilt.set_weights(model.get_weights())
    rebuilt.save(run_dir / "model.keras")


def _ranges(run_dir: pathlib.Path, rule: str) -> None:
    """ranges.json in the run: each point's range by `rule`, from its calibration sentences."""
    from bundle_contract.arrays import own_lengths
    from keras_mha import qat
    from keras_mha.rundir.embedding import read_embedding_run

    run = read_embedding_run(run_dir)
    recorder = qat.record(run.load_model(), run.calibration, lengths=own_lengths(run.calibration))
    qat.save_ranges(qat.choose_ranges(recorder, rule), run_dir / "ranges.json", rule=rule)


def run_lever(run_dir: pathlib.Path, name: str, work: pathlib.Path) -> dict:
    from keras_mha.pretrained.rescale import rescale_run
    from keras_mha_export.bundle import export_bundle

    settings = LEVERS[name]
    source = run_dir
    if settings is not None:
        source = work / "run"
        rescale_run(
            run_dir,
            source,
            settings["alpha"],
            settings["ffn_ratio"],
            overwrite=True,
            log=lambda line: None,
        )
        if settings.get("per_head"):
            _per_head(source)
        if settings.get("ranges"):
            _ranges(source, settings["ranges"])
        if settings.get("qat"):
            from keras_mha.qat.train import distill_encoder

            distilled = work / "qat"
            distill_encoder(
                source, distilled, steps=settings["qat"], overwrite=True, log=lambda line: None
            )
            source = distilled
    started = time.perf_counter()
    manifest = export_bundle(
        source, work / "bundle", "int8", overwrite=True, allow_parity_failure=True, log=lambda _: 0
    )
    entry = manifest.models.get("int8")
    failure = manifest.failed.get("int8")
    parity = entry.parity if entry is not None else (failure.parity if failure else None)
    row = {"lever": name, "seconds": round(time.perf_counter() - started, 1)}
    if parity is None:
        row["failed"] = "; ".join(failure.reasons) if failure else "no int8 model"
        return row
    row.update(
        min_cosine=round(parity.min_cosine, 6),
        mean_cosine=round(parity.mean_cosine, 6),
        top1=round(parity.top1, 4),
        top5=round(parity.top5, 4),
        ops=sum(entry.ops.values()) if entry is not None else None,
        bytes=entry.bytes if entry is not None else None,
        verified=bool(entry is not None and entry.verified),
    )
    check = entry.attention if entry is not None else None
    if check is not None and check.parity is not None:
        row["attention_rows_off"] = round(check.parity.tail_share, 4)
        row["attention_argmax_agreement"] = round(check.parity.argmax_agreement, 4)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--work", type=pathlib.Path)
    parser.add_argument("--levers", default=",".join(LEVERS), help="comma list of lever names")
    args = parser.parse_args()
    names = [n.strip() for n in args.levers.split(",") if n.strip()]
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        parser.error(f"unknown lever {unknown[0]!r}; expected some of {list(LEVERS)}")
    from keras_mha.quiet_tensorflow import import_tensorflow

    import_tensorflow()
    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-levers-", dir=args.work) as scratch:
        for name in names:
            rows.append(run_lever(args.run_dir, name, pathlib.Path(scratch) / "lever"))
            print(json.dumps(rows[-1]), flush=True)
    columns = [
        "lever",
        "min_cosine",
        "mean_cosine",
        "top1",
        "top5",
        "attention_rows_off",
        "ops",
        "seconds",
    ]
    print()
    print(format_table(columns, [[r.get(c, "-") for c in columns] for r in rows]))
    if args.json:
        write_json_atomic(args.json, {"run": str(args.run_dir), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
