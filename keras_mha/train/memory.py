"""Will a model fit in memory? Estimated from its configuration, before it is built.

`--d-model 100000` would ask for ~10^11 parameters; building it ends in an
out-of-memory traceback (or the kernel's OOM killer) long after the start.
The estimate counts float32 weights, their gradients and Adam's two moments
(16 bytes per parameter) and the activations one training batch keeps for
the backward pass; it is refused when it exceeds the memory available.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING

from bundle_contract.errors import UsageError

if TYPE_CHECKING:
    from keras_mha.model import ModelConfig

BYTES_PER_PARAMETER = 16  # float32 weight + gradient + Adam's m and v
BYTES_PER_ACTIVATION = 4


def estimate_params(config: ModelConfig) -> int:
    """The classifier's parameter count (`build_classifier(config).count_params()`)."""
    d, t, f = config.d_model, config.sequence_length, config.ff_dim
    if config.input_kind == "tokens":
        total = config.feature_dim * d
    else:
        total = config.feature_dim * d + d
    if config.positional == "learned":
        total += t * d
    for heads in config.heads_per_layer():
        d_k = config.key_dim or d // heads
        total += 3 * (d * heads * d_k + heads * d_k)  # W^Q, W^K, W^V and biases
        total += heads * d_k * d + d  # W^O and its bias
        total += 2 * d * f + f + d  # the feed-forward network
        total += 4 * d  # two LayerNorms
    pooled = t * d if config.pooling == "flatten" else d
    return total + pooled * config.num_classes + config.num_classes


def estimate_training_bytes(config: ModelConfig, batch_size: int) -> int:
    """Parameters with their optimizer state, plus one batch's activations."""
    d, t, f = config.d_model, config.sequence_length, config.ff_dim
    per_example = t * d  # the embedding
    for heads in config.heads_per_layer():
        # q, k, v, Concat, W^O's output, two sums and norms, FFN in/out; scores and weights
        per_example += t * (9 * d + 2 * f) + 2 * heads * t * t
    activations = BYTES_PER_ACTIVATION * batch_size * per_example
    return BYTES_PER_PARAMETER * estimate_params(config) + activations


def _read_int(path: str) -> int | None:
    try:
        text = pathlib.Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_bytes() -> int | None:
    """Memory this process can still get: MemAvailable, capped by a cgroup limit."""
    known = []
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                known.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 1 << 60:
            known.append(max(0, cap - used))
    if not known and hasattr(os, "sysconf"):
        try:
            known.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            pass
    return min(known) if known else None


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PB"


def check_fits(config: ModelConfig, batch_size: int, available: int | None = None) -> None:
    """Refuse a model whose training would not fit in the memory available.

    Raises:
        UsageError: naming the size options, the estimate and what is free.
    """
    available = available_bytes() if available is None else available
    if available is None:
        return
    need = estimate_training_bytes(config, batch_size)
    if need > available:
        raise UsageError(
            f"model too large to train here: d_model {config.d_model}, ff_dim {config.ff_dim}, "
            f"{config.num_layers} layer(s), batch {batch_size} -> {estimate_params(config):,} "
            f"parameters, ~{_size(need)} to train; {_size(available)} of memory is available "
            "(try a smaller --d-model, --ff-dim, --num-layers or --batch-size)"
        )
