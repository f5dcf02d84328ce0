"""The benchmark scripts run and report ratios (no timing limits asserted)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> None:
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        check=True,
        capture_output=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


@pytest.mark.slow  # runs a benchmark in a child
def test_attention_benchmark_reports_ratios_against_keras(tmp_path):
    out = tmp_path / "attention.json"
    _run("bench_attention.py", "--shapes", "edge", "--repeats", "2", "--json", str(out))
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


@pytest.mark.slow  # converts and runs int8 kernels in a child
def test_int8_kernels_benchmark_reports_which_matmuls_xnnpack_takes(tmp_path):
    """The reason full int8 does not pay for attention: XNNPACK takes a float
    BATCH_MATMUL and an int8 FULLY_CONNECTED with constant weights, but no
    int8 matmul whose operands are both activations (LiteRT 2.3)."""
    out = tmp_path / "kernels.json"
    _run("int8_kernels.py", "--lengths", "8", "--rounds", "2", "--calls", "2", "--json", str(out))
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["Q K^T (BATCH_MATMUL)"]["xnnpack_float32"] == "1/1"
    assert rows["Q K^T (BATCH_MATMUL)"]["xnnpack_int8"] == "0/1"
    assert rows["P V (BATCH_MATMUL)"]["xnnpack_int8"] == "0/1"
    assert rows["Q K^T per head (FULLY_CONNECTED)"]["xnnpack_int8"] == "0/12"
    assert rows["x W, the FFN (FULLY_CONNECTED)"]["xnnpack_int8"] == "1/1"
    for r in rows.values():
        assert r["length"] == 8 and r["float32_ms"] > 0 and r["int8_ms"] > 0


def test_communication_counts_what_each_collective_sends():
    """benchmarks/communication.py's reading of a compiled HLO module: each
    collective's arrays, its group and the bytes one device sends in a ring."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "communication", REPO / "benchmarks" / "communication.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hlo = """
  %all-reduce = f32[384,12,32]{2,1,0} all-reduce(f32[384,12,32]{2,1,0} %fusion.1), channel_id=1, replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=%add
  %all-reduce.1 = (f32[16]{0}, /*index=1*/f32[8,4]{1,0}) all-reduce(f32[16]{0} %a, f32[8,4]{1,0} %b), channel_id=2, replica_groups=[1,8]<=[8], to_apply=%add
  %all-gather = f32[8,6]{1,0} all-gather(f32[2,6]{1,0} %c), channel_id=3, replica_groups=[2,4]<=[8], dimensions={0}
  %collective-permute = f32[10]{0} collective-permute(f32[10]{0} %d), channel_id=4, source_target_pairs={{0,1},{1,0}}
  %add.3 = f32[10]{0} add(f32[10]{0} %d, f32[10]{0} %d)
  %all-reduce-start = bf16[4,2]{1,0} all-reduce-start(bf16[4,2]{1,0} %e), channel_id=5, replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add
  %all-gather-start = (f32[2]{0}, f32[8]{0}) all-gather-start(f32[2]{0} %f), channel_id=6, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %collective-permute-start = (f32[6]{0}, f32[6]{0}, u32[], u32[]) collective-permute-start(f32[6]{0} %g), channel_id=7, source_target_pairs={{0,1}}
"""  # noqa: E501
    found = module.collectives(hlo, 8)
    assert [(c["op"], c["group"], c["bytes"]) for c in found] == [
        ("all-reduce", 2, 384 * 12 * 32 * 4),
        ("all-reduce", 8, (16 + 32) * 4),
        ("all-gather", 4, 8 * 6 * 4),
        ("collective-permute", 8, 40),
        ("all-reduce", 2, 4 * 2 * 2),  # bfloat16; groups of 2 in the transposed iota form
        ("all-gather", 4, 8 * 4),  # async: the gathered result, not the operand too
        ("collective-permute", 8, 6 * 4),  # async: the operand, not the result and contexts
    ]
    sent = [c["sent"] for c in found]
    assert sent == [384 * 12 * 32 * 4, 2 * 7 / 8 * 192, 3 / 4 * 192, 40.0, 16.0, 24.0, 24.0]
    with pytest.raises(ValueError, match="does not size: token"):
        module.collectives("%x = token[] all-reduce(token[] %t)", 8)
