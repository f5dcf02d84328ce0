"""Quantization-aware training: int8's rounding in the loop, one room.

    points.py  where our layers round (`point`), the ranges (`record`,
               `choose_ranges`, `attach`), ranges.json; numpy only, imported
               by the layers themselves
    train.py   a run directory fine-tuned or distilled with the rounding
    cli.py     keras-mha-qat

`keras_mha.qat` is points.py's names (what the layers and export use); the
training loop is `keras_mha.qat.train`.
"""

from .points import (
    HOOK,
    LEVELS,
    RULES,
    SOFTMAX_RANGE,
    Recorder,
    attach,
    choose_ranges,
    detach,
    load_ranges,
    nudge,
    point,
    ranges_json,
    record,
    rounded,
    save_ranges,
    unused_ranges,
)

__all__ = [
    "HOOK",
    "LEVELS",
    "RULES",
    "SOFTMAX_RANGE",
    "Recorder",
    "attach",
    "choose_ranges",
    "detach",
    "load_ranges",
    "nudge",
    "point",
    "ranges_json",
    "record",
    "rounded",
    "save_ranges",
    "unused_ranges",
]
