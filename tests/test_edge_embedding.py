"""The device contract's embedding task (a sentence encoder) on small synthetic inputs.

Parity figures and thresholds (bundle_contract.parity), the embedding
manifest (entries, manifest), eval.npz's embedding arrays (arrays), texts.json
(bundle), tokenizer.json (subwords) and the dynamic-length helper of
EdgeModel. No model is trained or exported: the vectors are unit vectors at
chosen angles in the plane, so every neighbour and cosine is known by hand.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from edge_bundle import example_manifest

from bundle_contract.arrays import EvalData
from bundle_contract.entries import EvalSpec, FileRef, ModelEntry
from bundle_contract.errors import UsageError
from bundle_contract.lists import MAX_TEXT, parse_texts, texts_json
from bundle_contract.manifest import Manifest
from bundle_contract.parity import (
    FLOAT_THRESHOLDS,
    Parity,
    Thresholds,
    changes_allowed,
    default_thresholds,
    nearest,
)
from bundle_contract.subwords import Subwords
from bundle_contract.tasks import TASKS
from bundle_contract.tasks.embedding import (
    EMBEDDING_MIN_COSINE,
    EMBEDDING_MIN_MEAN_COSINE,
    UNIT_NORM_TOLERANCE,
    check_embedding_eval,
    embedding_thresholds,
    measure_embeddings,
)
from bundle_contract.tensors import TensorSpec
from edge_demo.runtimes.model import EdgeModel

EMBEDDING_KEYS = {"min_cosine", "mean_cosine", "top1", "top5"}


def on_circle(degrees: list[float]) -> np.ndarray:
    """Unit vectors (N, 2) at the given angles: cosine similarity = cos(angle between)."""
    radians = np.radians(np.asarray(degrees, np.float64))
    return np.stack([np.cos(radians), np.sin(radians)], axis=1)


def refused(call, *fragments: str) -> str:
    """`call()` raises a one-line UsageError holding every fragment; its message."""
    with pytest.raises(UsageError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# 1. measure_embeddings and nearest ------------------------------------------------

# Six sentences. Circular distances (degrees) in the float model:
#   row 0: 1 at 10, 2 at 10.5 (a near tie)    -> nearest 1
#   row 4: 3 at 50, 5 at 50.5 (a near tie)     -> nearest 3
# (row 3's nearest is 4, at 50; rows 1, 2 and 5 have no near tie).
# The mode turns rows 2 and 5 by 1 degree each, flipping both ties (row 0 -> 2,
# row 4 -> 5) and nothing else; with 6 sentences the five nearest are all the
# others, so top-5 stays 1.
FLOAT_6 = [0.0, 10.0, -10.5, 100.0, 150.0, 200.5]
MODE_6 = [0.0, 10.0, -9.5, 100.0, 150.0, 199.5]


def test_identical_vectors_are_perfect_parity():
    reference = on_circle(FLOAT_6)
    parity = measure_embeddings(reference.copy(), reference)
    assert parity.min_cosine == pytest.approx(1.0, abs=1e-12)
    assert parity.mean_cosine == pytest.approx(1.0, abs=1e-12)
    assert parity.top1 == 1.0 and parity.top5 == 1.0 and parity.agreement == 1.0
    assert parity.max_abs_diff == 0.0 and parity.mean_abs_diff == 0.0
    assert math.isnan(parity.accuracy)  # no labels
    evaluation = EvalData(reference[:, :1], np.zeros(len(reference), np.int64), reference, False)
    assert TASKS["embedding"].measure(reference, evaluation) == parity  # what the device calls
    # The figures it writes: the four embedding keys, accuracy null.
    data = parity.to_json()
    assert EMBEDDING_KEYS <= set(data) and data["accuracy"] is None
    assert Parity.from_json(json.loads(json.dumps(data))) == parity


def test_swapping_near_tie_neighbours_changes_top1_not_top5():
    reference, vectors = on_circle(FLOAT_6), on_circle(MODE_6)
    assert nearest(reference)[:, 0].tolist() == [1, 0, 0, 4, 3, 4]
    assert nearest(vectors)[:, 0].tolist() == [2, 0, 0, 4, 5, 4]
    parity = measure_embeddings(vectors, reference)
    assert parity.top1 == 4 / 6 and parity.agreement == 4 / 6
    assert parity.top5 == 1.0
    one = math.cos(math.radians(1.0))  # rows 2 and 5 turned by 1 degree
    assert parity.min_cosine == pytest.approx(one, abs=1e-12)
    assert parity.mean_cosine == pytest.approx((4 + 2 * one) / 6, abs=1e-12)

    def sin(d):
        return math.sin(math.radians(d))

    def cos(d):
        return math.cos(math.radians(d))

    # Row 2: (cos, sin) from -10.5 to -9.5 degrees; row 5: 200.5 to 199.5.
    deltas = [
        cos(9.5) - cos(10.5),
        sin(10.5) - sin(9.5),
        cos(19.5) - cos(20.5),
        sin(20.5) - sin(19.5),
    ]
    assert parity.max_abs_diff == pytest.approx(sin(10.5) - sin(9.5), abs=1e-12)
    assert parity.mean_abs_diff == pytest.approx(sum(deltas) / 12, abs=1e-12)
    # Within every quantized mode's thresholds; an element moved 0.0172, more
    # than float32 (1e-5) or float16 (1e-2) may move one.
    for mode in ("dynamic", "int8", "int16x8"):
        assert embedding_thresholds(mode, 6).failures(parity, math.nan) == []
    assert embedding_thresholds("float16", 6).failures(parity, math.nan) == [
        "max |Δprob| 0.0172 > 0.01"
    ]
    assert embedding_thresholds("float32", 6).failures(parity, math.nan) == [
        "max |Δprob| 0.0172 > 1e-05"
    ]


def test_a_neighbour_leaving_the_first_five_lowers_top5():
    # Eight sentences; the float model's nearest: 0->1, 1->0, 2->3, 3->2, 4->3,
    # 5->6, 6->7, 7->6. The mode moves sentence 1 from 5 to 200 degrees: rows 0
    # and 1 lose each other from their five nearest (top-5 6/8); sentence 1 is
    # now nearest to rows 5 (10 away) and 6 (36 away), so top-1 keeps rows
    # 2, 3, 4, 7 only (4/8).
    reference = on_circle([0, 5, 52, 97, 143, 190, 236, 281])
    vectors = on_circle([0, 200, 52, 97, 143, 190, 236, 281])
    assert nearest(reference)[:, 0].tolist() == [1, 0, 3, 2, 3, 6, 7, 6]
    parity = measure_embeddings(vectors, reference)
    assert parity.top1 == 0.5 and parity.top5 == 0.75
    assert parity.min_cosine == pytest.approx(-math.cos(math.radians(15)), abs=1e-12)
    assert parity.mean_cosine == pytest.approx((7 - math.cos(math.radians(15))) / 8, abs=1e-12)
    failures = embedding_thresholds("int8", 8).failures(parity, math.nan)
    assert [f.split(" ")[0] for f in failures] == ["min", "mean", "top-5"]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_vector_makes_every_figure_nan_and_fails_every_threshold(bad):
    reference = on_circle(FLOAT_6)
    vectors = reference.copy()
    vectors[3, 1] = bad
    parity = measure_embeddings(vectors, reference)
    values = [getattr(parity, f) for f in Parity.__dataclass_fields__]
    assert len(values) == 11 and all(math.isnan(v) for v in values)  # a language model's 3 too
    failures = embedding_thresholds("float32", 6).failures(parity, math.nan)
    assert len(failures) == 4
    assert failures[0].startswith("max |Δprob| nan > 1e-05")
    assert failures[1:] == [
        "min cosine nan < 0.980000",
        "mean cosine nan < 0.995000",
        "top-5 neighbour agreement nan < 0.833333",  # 6 sentences: 1 change allowed
    ]
    # Written as nulls, read back as NaN: not a pass.
    assert all(v is None for v in parity.to_json().values())


def test_nearest_excludes_self_and_breaks_ties_by_index():
    # Rows 1, 2 and 3 are one vector: each one's nearest is the lowest other index.
    # Row 0 is orthogonal to all the others (exact zeros): by index again.
    vectors = np.array([[0, 1], [1, 0], [1, 0], [1, 0], [-1, 0]], np.float32)
    assert nearest(vectors, 1)[:, 0].tolist() == [1, 2, 1, 1, 0]
    assert nearest(vectors, 4).tolist() == [
        [1, 2, 3, 4],
        [2, 3, 0, 4],
        [1, 3, 0, 4],
        [1, 2, 0, 4],
        [0, 1, 2, 3],
    ]
    assert nearest(vectors, 2).shape == (5, 2)
    # Cosine, not distance: scaling a row changes nothing.
    assert nearest(vectors * [[1], [3], [0.5], [2], [7]], 4).tolist() == (
        nearest(vectors, 4).tolist()
    )


# 2. thresholds ----------------------------------------------------------------------


def test_embedding_thresholds_per_mode():
    n = 389
    allowed = changes_allowed(n)
    assert allowed == 9  # P(Binomial(389, 1 %) > 9) <= 1 %
    top5 = (n - allowed) / n
    assert top5 == 380 / 389 and round(top5, 6) == 0.976864
    assert embedding_thresholds("float32", n).max_abs_diff == 1e-5
    assert embedding_thresholds("float16", n).max_abs_diff == 1e-2
    for mode in ("float32", "float16", "dynamic", "int8", "int16x8"):
        t = embedding_thresholds(mode, n)
        if mode not in ("float32", "float16"):
            assert t.max_abs_diff is None
        assert (t.min_cosine, t.min_mean_cosine, t.min_top5) == (0.98, 0.995, top5)
        assert t.min_agreement is None and t.max_accuracy_drop is None  # no labels
        assert TASKS["embedding"].thresholds(mode, n) == t
        assert Thresholds.from_json(_fields(), {"t": t.to_json()}, "t") == t
    assert (EMBEDDING_MIN_COSINE, EMBEDDING_MIN_MEAN_COSINE) == (0.98, 0.995)
    # A classifier's thresholds are as they were.
    assert default_thresholds("float32", n) == FLOAT_THRESHOLDS["float32"]
    assert default_thresholds("int8", n).min_top5 is None
    assert embedding_thresholds("int8", n).describe() == ("cos≥0.98, mean cos≥0.995, top5≥0.9769")
    with pytest.raises(ValueError, match="unknown mode 'int4'"):
        embedding_thresholds("int4", n)


def _fields():
    from bundle_contract.fields import Fields

    return Fields("manifest.json")


def _embedding_parity(min_cosine=1.0, mean_cosine=1.0, top5=1.0) -> Parity:
    return Parity(math.nan, 1.0, 0.0, 0.0, min_cosine, mean_cosine, 1.0, top5)


@pytest.mark.parametrize(
    ("figure", "bound", "message"),
    [
        ("min_cosine", 0.98, "min cosine 0.979990 < 0.980000"),
        ("mean_cosine", 0.995, "mean cosine 0.994990 < 0.995000"),
        ("top5", 380 / 389, "top-5 neighbour agreement 0.974293 < 0.976864"),
    ],
)
def test_each_embedding_bound_fails_below_and_passes_at_it(figure, bound, message):
    thresholds = embedding_thresholds("int8", 389)
    below = 379 / 389 if figure == "top5" else bound - 1e-5  # one more sentence lost
    assert thresholds.failures(_embedding_parity(**{figure: below}), math.nan) == [message]
    assert thresholds.failures(_embedding_parity(**{figure: bound}), math.nan) == []
    # A bound computed another way (float rounding) is met within the slack.
    assert thresholds.failures(_embedding_parity(**{figure: bound - 1e-12}), math.nan) == []


# 3. the manifest ------------------------------------------------------------------

SAMPLES, LENGTH, DIMS, MAX_LENGTH = 6, 16, 384, 128


def embedding_manifest() -> Manifest:
    def entry(mode: str) -> ModelEntry:
        return ModelEntry(
            mode=mode,
            file=f"model_{mode}.tflite",
            sha256="a" * 64,
            bytes=23_000_000,
            input=TensorSpec("input_ids", (1, LENGTH), "int32"),
            output=TensorSpec("embedding", (1, DIMS), "float32"),
            thresholds=embedding_thresholds(mode, SAMPLES),
            runtimes={"ai-edge-litert": True},
            verified=True,
            parity=Parity(math.nan, 5 / 6, 0.004, 0.0003, 0.991, 0.998, 5 / 6, 1.0),
            ops={"FULLY_CONNECTED": 36},
            dynamic_length=True,
        )

    return Manifest(
        eval=EvalSpec(
            "eval.npz", "c" * 64, SAMPLES, (SAMPLES, LENGTH), "int32", DIMS, None, "embedding"
        ),
        files={
            "texts": FileRef("texts.json", "d" * 64),
            "tokenizer": FileRef("tokenizer.json", "e" * 64),
        },
        models={"int8": entry("int8"), "float32": entry("float32")},
        created_by={"keras_mha": "0.1.0"},
        source_model=FileRef("model.safetensors", "b" * 64),
        max_length=MAX_LENGTH,
    )


def embedding_json() -> dict:
    return json.loads(json.dumps(embedding_manifest().to_json()))


def test_embedding_manifest_round_trips():
    manifest = embedding_manifest()
    data = embedding_json()
    again = Manifest.from_json(data, "manifest.json")
    assert again == manifest
    assert again.task is TASKS["embedding"] and again.eval.float_accuracy is None
    assert again.file("labels") is None and again.max_length == 128
    assert again.file("tokenizer") == FileRef("tokenizer.json", "e" * 64)
    assert again.models["int8"].dynamic_length is True
    assert again.models["int8"].parity.top5 == 1.0
    assert math.isnan(again.models["int8"].parity.accuracy)
    # What the file says.
    assert data["eval"]["task"] == "embedding"
    assert data["eval"]["float_accuracy"] is None
    assert data["labels"] is None
    assert data["texts"] == {"file": "texts.json", "sha256": "d" * 64}
    assert data["tokenizer"] == {"file": "tokenizer.json", "sha256": "e" * 64, "max_length": 128}
    for mode in ("int8", "float32"):
        model = data["models"][mode]
        assert model["dynamic_length"] is True
        assert EMBEDDING_KEYS <= set(model["parity"])
        assert model["parity"]["accuracy"] is None
    assert data["models"]["int8"]["thresholds"] == {
        "min_cosine": 0.98,
        "min_mean_cosine": 0.995,
        "min_top5": 5 / 6,
    }
    # A float accuracy in an embedding manifest is not read.
    data["eval"]["float_accuracy"] = 0.5
    assert Manifest.from_json(data).eval.float_accuracy is None


def test_a_classification_manifest_is_format_1_unchanged():
    data = json.loads(json.dumps(example_manifest().to_json()))
    assert "task" not in data["eval"] and data["eval"]["float_accuracy"] == 0.98
    assert "texts" not in data and "tokenizer" not in data
    for model in data["models"].values():
        assert set(model["parity"]) == {"accuracy", "agreement", "max_abs_diff", "mean_abs_diff"}
        assert "dynamic_length" not in model
        assert not {"min_cosine", "min_mean_cosine", "min_top5"} & set(model["thresholds"])
    again = Manifest.from_json(data)
    assert again.eval.task == "classification" and again.task is TASKS["classification"]
    assert again.file("texts") is None and again.file("tokenizer") is None
    assert again.max_length is None and set(again.files) == {"labels"}
    # Saying "classification" is the same as saying nothing.
    data["eval"]["task"] = "classification"
    assert Manifest.from_json(data) == again


def _edit(data: dict, path: str, value=None, delete: bool = False) -> dict:
    *parents, key = path.split(".")
    node = data
    for name in parents:
        node = node[name]
    if delete:
        del node[key]
    else:
        node[key] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "fragments"),
    [
        ("eval.task", "ranking", ["'eval.task'", "classification, embedding", "'ranking'"]),
        ("eval.task", 3, ["'eval.task'", "must be str, got int"]),
        ("texts", None, ["'texts'", "must be an object, got null"]),
        ("tokenizer.max_length", 1, ["'tokenizer.max_length'", "from 2 to 4096, got 1"]),
        ("tokenizer.max_length", 8, ["'eval.x_shape'", "T <= tokenizer.max_length 8"]),
        ("eval.x_shape", [6, 4, 4], ["'eval.x_shape'", "must be [samples, T]"]),
        ("models.float32.dynamic_length", 1, ["'models.float32.dynamic_length'", "bool"]),
        ("models.float32.dynamic_length", "true", ["'models.float32.dynamic_length'", "bool"]),
        (
            "models.float32.thresholds.min_top5",
            "high",
            ["'models.float32.thresholds.min_top5'", "finite number"],
        ),
    ],
)
def test_embedding_manifest_refusals_name_the_field(path, value, fragments):
    data = _edit(embedding_json(), path, value)
    refused(lambda: Manifest.from_json(data, "manifest.json"), "manifest.json: ", *fragments)


@pytest.mark.parametrize(
    ("path", "missing"),
    [
        ("texts", "'texts'"),
        ("tokenizer", "'tokenizer'"),
        ("tokenizer.max_length", "'tokenizer.max_length'"),
        ("tokenizer.sha256", "'tokenizer.sha256'"),
    ],
)
def test_embedding_manifest_without_its_text_side_is_refused(path, missing):
    data = _edit(embedding_json(), path, delete=True)
    refused(lambda: Manifest.from_json(data, "manifest.json"), f"missing field {missing}")


def test_dynamic_length_needs_token_ids():
    data = json.loads(json.dumps(example_manifest().to_json()))  # input [1, 8, 8]
    data["models"]["float32"]["dynamic_length"] = True
    refused(
        lambda: Manifest.from_json(data, "manifest.json"),
        "field 'models.float32.dynamic_length' needs an input of shape [1, T]",
    )
    data["models"]["float32"]["dynamic_length"] = False  # false is the default
    assert Manifest.from_json(data) == example_manifest()


# 4. eval.npz of an embedding model ------------------------------------------------


def token_ids(samples: int = SAMPLES) -> np.ndarray:
    x = np.zeros((samples, 5), np.int32)
    for row in range(samples):
        x[row, : 2 + row % 4] = np.arange(101, 103 + row % 4)  # [CLS]-like first, then 0s
    return x


def test_check_embedding_eval_accepts_and_gives_float_neighbours():
    x, vectors = token_ids(), on_circle(FLOAT_6)
    data = check_embedding_eval(x, vectors, "eval.npz")
    assert not data.labelled and data.x is x
    assert data.y.dtype == np.int64 and data.y.tolist() == [1, 0, 0, 4, 3, 4]
    assert data.probs.dtype == np.float32 and data.probs.shape == (6, 2)
    np.testing.assert_array_equal(data.probs, vectors.astype(np.float32))
    assert data.num_classes == 2 and math.isnan(data.float_accuracy)
    # Unsigned ids, interior zeros and a norm within the tolerance are fine.
    nudged = vectors * (1 + 0.9 * UNIT_NORM_TOLERANCE)
    x = token_ids().astype(np.uint16)
    x[0, 1] = 0
    assert check_embedding_eval(x, nudged, "eval.npz").y.tolist() == [1, 0, 0, 4, 3, 4]


def _with(array: np.ndarray, index, value) -> np.ndarray:
    array = array.copy()
    array[index] = value
    return array


@pytest.mark.parametrize(
    ("x", "vectors", "fragments"),
    [
        (
            token_ids().astype(np.float32),
            on_circle(FLOAT_6),
            ["x must be integer token ids of shape [N, T], got float32 [6, 5]"],
        ),
        (
            token_ids()[:, :, None],
            on_circle(FLOAT_6),
            ["x must be integer token ids of shape [N, T], got int32 [6, 5, 1]"],
        ),
        (token_ids()[:1], on_circle(FLOAT_6)[:1], ["x has 1 sentence(s)", "at least 2"]),
        (
            _with(token_ids(), 3, 0),
            on_circle(FLOAT_6),
            ["at least one token (not the pad id 0) per row"],
        ),
        (_with(token_ids(), (2, 0), -1), on_circle(FLOAT_6), ["ids >= 0"]),
        (
            token_ids(),
            _with(on_circle(FLOAT_6), 4, [0.6, 0.9]),  # norm 1.0817
            ["embeddings must have unit norm; row 4 has norm 1.08167"],
        ),
        (
            token_ids(),
            _with(on_circle(FLOAT_6), 1, 0.0),
            ["embeddings must have unit norm; row 1 has norm 0"],
        ),
        (
            token_ids(),
            on_circle(FLOAT_6)[:5],
            ["embeddings must be float of shape [6, d], got float64 [5, 2]"],
        ),
        (
            token_ids(),
            on_circle(FLOAT_6).astype(np.int64),
            ["embeddings must be float of shape [6, d], got int64 [6, 2]"],
        ),
        (
            token_ids(),
            on_circle(FLOAT_6)[:, 0],
            ["embeddings must be float of shape [6, d], got float64 [6]"],
        ),
        (
            token_ids(),
            _with(on_circle(FLOAT_6), (2, 1), math.nan),
            ["embeddings has 1 NaN or infinite value(s)"],
        ),
    ],
)
def test_check_embedding_eval_refusals(x, vectors, fragments):
    refused(lambda: check_embedding_eval(x, vectors, "eval.npz"), "eval.npz: ", *fragments)


# 5. texts.json ---------------------------------------------------------------------


def test_texts_round_trip():
    texts = ["The animal didn't cross the street.", "Un café ☕, s'il vous plaît", "a" * MAX_TEXT]
    data = texts_json(texts)
    assert data.endswith(b"\n") and "café ☕".encode() in data  # UTF-8, not \u escapes
    assert parse_texts(data, 3, "texts.json") == tuple(texts)


@pytest.mark.parametrize(
    ("texts", "samples", "fragment"),
    [
        (["one", "two"], 3, "has 2 sentences, manifest.json says 3"),
        (["one", 2, "three"], 3, "expected a JSON list of sentences"),
        ({"0": "one"}, 1, "expected a JSON list of sentences"),
        (["one", "two\nlines"], 2, "sentence 1 must be at most 2000 printable characters"),
        (["\x1b[31mred", "b"], 2, "sentence 0 must be at most 2000 printable characters"),
        (["a", "\u202eevil"], 2, "sentence 1 must be at most 2000 printable characters"),
        (["a", "b" * (MAX_TEXT + 1)], 2, "sentence 1 must be at most 2000 printable characters"),
    ],
)
def test_parse_texts_refusals(texts, samples, fragment):
    data = json.dumps(texts).encode()
    refused(lambda: parse_texts(data, samples, "texts.json"), "texts.json: ", fragment)


def test_parse_texts_refuses_bad_json_in_one_line():
    refused(lambda: parse_texts(b'["a",\n"b"', 2, "texts.json"), "texts.json: not valid JSON")
    refused(lambda: parse_texts(b"\xff\xfe", 1, "texts.json"), "not UTF-8")


# 6. tokenizer.json ------------------------------------------------------------------

VOCAB = {
    "[PAD]": 0,
    "[UNK]": 1,
    "[CLS]": 2,
    "[SEP]": 3,
    "the": 4,
    "cat": 5,
    "sat": 6,
    "on": 7,
    "mat": 8,
    "play": 9,
    "##ing": 10,
    ".": 11,
}


def tokenizer_json(vocab: dict[str, int] = VOCAB, padding: int | None = None) -> bytes:
    """A BERT-style tokenizer.json like a checkpoint's (MiniLM's pads to 128 by itself)."""
    import tokenizers  # a dependency of the edge extra and the main venv
    from tokenizers import models, normalizers, pre_tokenizers, processors

    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    if padding is not None:
        tokenizer.enable_padding(length=padding, pad_id=vocab["[PAD]"], pad_token="[PAD]")
    return tokenizer.to_str().encode("utf-8")


@pytest.mark.parametrize("padding", [None, 128])
def test_wordpiece_encodes_unpadded_lengths_padded_to_the_longest(padding):
    pieces = Subwords.from_bytes(tokenizer_json(padding=padding), 16, "tokenizer.json")
    assert pieces.vocab_size == 12 and pieces.max_length == 16
    ids, lengths = pieces.encode(["The CAT sat.", "Playing", "dog"])
    assert ids.dtype == np.int32 and ids.shape == (3, 6)  # the longest, not 128
    assert ids.tolist() == [
        [2, 4, 5, 6, 11, 3],
        [2, 9, 10, 3, 0, 0],
        [2, 1, 3, 0, 0, 0],  # an unknown word
    ]
    assert lengths.tolist() == [6, 4, 3]
    assert EdgeModel.own_lengths(ids).tolist() == [6, 4, 3]
    wide, same = pieces.encode(["Playing"], length=8)
    assert wide.tolist() == [[2, 9, 10, 3, 0, 0, 0, 0]] and same.tolist() == [4]
    refused(
        lambda: pieces.encode(["the cat sat on the mat"], length=4),
        "--text: a sentence has 8 word pieces; the array holds 4",
    )
    empty, none = pieces.encode([])
    assert empty.shape == (0, 1) and none.tolist() == []


def test_wordpiece_truncates_at_max_length_keeping_sep_last(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(tokenizer_json(padding=128))
    pieces = Subwords.load(path, max_length=5)
    ids, lengths = pieces.encode(["the cat sat on the mat", "the cat"])
    assert ids.tolist() == [[2, 4, 5, 6, 3], [2, 4, 5, 3, 0]]
    assert lengths.tolist() == [5, 4]
    tokens, _ = pieces.pieces("the cat sat on the mat")
    assert tokens == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    refused(lambda: Subwords.load(tmp_path / "absent.json", 5), "absent.json: cannot read it")


def test_wordpiece_pieces_give_offsets():
    pieces = Subwords.from_bytes(tokenizer_json(), 16, "tokenizer.json")
    tokens, offsets = pieces.pieces("The cat playing")
    assert tokens == ["[CLS]", "the", "cat", "play", "##ing", "[SEP]"]
    assert offsets == [(0, 0), (0, 3), (4, 7), (8, 12), (12, 15), (0, 0)]


def test_wordpiece_refuses_a_pad_that_is_not_zero():
    swapped = {**VOCAB, "[PAD]": 11, ".": 0}
    refused(
        lambda: Subwords.from_bytes(tokenizer_json(swapped), 16, "tokenizer.json"),
        "tokenizer.json: pad id 0 is '.', not a padding token ([PAD], <pad>); the model masks id 0",
    )


@pytest.mark.parametrize(
    "data",
    [b"\xff\xfe\x00garbage", b'{"version": "1.0",\n"model": 3}', b"[1, 2]", b"not json\n\n"],
)
def test_wordpiece_refuses_garbage_in_one_line(data):
    pytest.importorskip("tokenizers")
    refused(
        lambda: Subwords.from_bytes(data, 16, "tokenizer.json"),
        "tokenizer.json: not a tokenizers JSON file (",
    )


@pytest.mark.parametrize("max_length", [1, True, 16.0, None])
def test_wordpiece_refuses_a_bad_max_length(max_length):
    refused(
        lambda: Subwords.from_bytes(b"{}", max_length, "tokenizer.json"),
        "max_length must be an integer >= 2",
    )


# 7. EdgeModel.own_lengths ----------------------------------------------------------


def test_own_lengths_trims_trailing_padding_only():
    ids = np.array(
        [
            [101, 7, 102, 0, 0],  # trailing zeros trimmed
            [0, 0, 0, 0, 0],  # nothing: length 1 (one pad token runs)
            [101, 0, 9, 102, 0],  # an interior zero is kept
            [101, 5, 6, 7, 102],  # full
            [0, 0, 0, 0, 4],  # only the last
        ],
        np.int32,
    )
    assert EdgeModel.own_lengths(ids).tolist() == [3, 1, 4, 5, 5]
    assert EdgeModel.own_lengths(ids[:, :1]).tolist() == [1, 1, 1, 1, 1]


def test_an_empty_task_and_a_tokenizer_without_pad_are_refused():
    """Review findings: "" is not "classification"; no [PAD] at all is not [PAD] = 0."""
    data = embedding_json()
    data["eval"]["task"] = ""
    with pytest.raises(UsageError, match="eval.task"):
        Manifest.from_json(data)
    vocab = {k: v for k, v in VOCAB.items() if k != "[PAD]"}
    vocab["padding"] = 0  # id 0 is an ordinary word piece
    with pytest.raises(UsageError, match="pad id 0 is 'padding', not a padding token"):
        Subwords.from_bytes(tokenizer_json(vocab), 16, "tokenizer.json")


# 8. A pad id other than 0 (RoBERTa's and XLM-R's <pad> is 1) -------------------------

ROBERTA_VOCAB = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "the": 4, "cat": 5, "sat": 6}


def roberta_tokenizer_json() -> bytes:
    """A word-level tokenizer with RoBERTa's specials: <s>=0, <pad>=1, </s>=2."""
    import tokenizers
    from tokenizers import models, pre_tokenizers, processors

    tokenizer = tokenizers.Tokenizer(models.WordLevel(ROBERTA_VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    return tokenizer.to_str().encode("utf-8")


def test_a_pad_id_of_one_pads_cuts_and_checks_with_one():
    pieces = Subwords.from_bytes(roberta_tokenizer_json(), 8, "tokenizer.json", pad_id=1)
    ids, lengths = pieces.encode(["the cat sat", "cat"])
    assert ids.tolist() == [[0, 4, 5, 6, 2], [0, 5, 2, 1, 1]]  # <s> is 0: not padding
    assert lengths.tolist() == [5, 3]
    assert EdgeModel.own_lengths(ids, 1).tolist() == [5, 3]
    assert EdgeModel.own_lengths(ids).tolist() == [5, 5]  # 0 as the pad would cut nothing
    vectors = on_circle([0.0, 90.0])
    assert check_embedding_eval(ids, vectors, "eval.npz", pad_id=1).x is ids
    refused(
        lambda: check_embedding_eval(np.array([[0, 2], [1, 1]]), vectors, "eval.npz", pad_id=1),
        "at least one token (not the pad id 1) per row",
    )
    # the pad id must be the padding token: RoBERTa's <s> (0) is not
    refused(
        lambda: Subwords.from_bytes(roberta_tokenizer_json(), 8, "tokenizer.json", pad_id=0),
        "tokenizer.json: pad id 0 is '<s>', not a padding token",
    )
    refused(
        lambda: Subwords.from_bytes(roberta_tokenizer_json(), 8, "tokenizer.json", pad_id=99),
        "tokenizer.json: pad id 99 is no token, not a padding token",
    )


def test_the_manifest_carries_a_pad_id_and_reads_its_absence_as_zero():
    manifest = dataclasses.replace(embedding_manifest(), pad_id=1)
    data = json.loads(json.dumps(manifest.to_json()))
    assert data["tokenizer"]["pad_id"] == 1
    assert Manifest.from_json(data).pad_id == 1
    assert "pad_id" not in embedding_json()["tokenizer"]  # BERT's bundles as they were
    assert Manifest.from_json(embedding_json()).pad_id == 0
    for bad in (-1, "1", True, 2**40):
        data["tokenizer"]["pad_id"] = bad
        refused(lambda: Manifest.from_json(data), "field 'tokenizer.pad_id' must be an integer")
