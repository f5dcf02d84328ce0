"""The paired bootstrap of an accuracy drop, and per-cue accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from keras_mha import heads


def test_paired_drop_counts_and_bootstraps():
    before = np.array([True] * 90 + [False] * 10)
    after = before.copy()
    after[:4] = False  # 4 lost
    after[95] = True  # 1 gained
    drop = heads.paired_drop(before, after)
    assert drop["points"] == pytest.approx(3.0)
    assert (drop["lost"], drop["gained"], drop["examples"]) == (4, 1, 100)
    low, high = drop["ci95_points"]
    # Normal approximation: sd of the mean difference = sqrt((0.05 - 0.03**2) / 100).
    half = 1.96 * 100 * np.sqrt((0.05 - 0.03**2) / 100)  # 4.3 points
    assert low == pytest.approx(3.0 - half, abs=1.0) and high == pytest.approx(3.0 + half, abs=1.0)
    assert low < 0.0  # 4 lost against 1 gained of 100 is not enough to call it a drop
    assert heads.paired_drop(before, after) == drop  # seeded
    same = heads.paired_drop(before, before)
    assert (same["points"], same["ci95_points"]) == (0.0, [0.0, 0.0])
    with pytest.raises(ValueError, match="same, non-zero length"):
        heads.paired_drop(before, after[:-1])


def test_cue_accuracy():
    probs = np.eye(3)[[0, 1, 2, 0]]
    y = np.array([0, 1, 0, 1])
    cues = np.array(["number", "number", "both", "semantic"])
    assert heads.cue_accuracy(probs, y, cues) == {"both": 0.0, "number": 1.0, "semantic": 0.0}
