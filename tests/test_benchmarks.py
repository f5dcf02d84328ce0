"""The benchmark scripts run and report ratios (no timing limits asserted)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_attention_benchmark_reports_ratios_against_keras(tmp_path):
    out = tmp_path / "attention.json"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/bench_attention.py"),
            "--shapes",
            "edge",
            "--repeats",
            "2",
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    report = json.loads(out.read_text())
    results = report["shapes"]["edge"]["results"]
    assert set(results) == {
        "keras.layers.MultiHeadAttention",
        "keras_mha fused",
        "keras_mha per_head",
    }
    assert results["keras.layers.MultiHeadAttention"]["forward_ratio"] == 1.0
    for r in results.values():
        assert r["forward_us"] > 0 and r["forward_backward_us"] > 0
        assert r["forward_ratio"] > 0
