"""manifest.json through bundle_contract.manifest, and docs/artifacts.md against the code."""

from __future__ import annotations

import json
import re

import pytest
from edge_bundle import REPO, example_manifest

from bundle_contract.attention import CorefHead
from bundle_contract.attention_parity import DEFAULT_THRESHOLDS as ATTENTION_THRESHOLDS
from bundle_contract.bundle import select_modes
from bundle_contract.entries import EvalSpec, ModelEntry, Signature
from bundle_contract.errors import UsageError
from bundle_contract.fields import Fields
from bundle_contract.manifest import MODES, Manifest
from bundle_contract.parity import default_thresholds
from bundle_contract.tasks.language_model import Generation
from bundle_contract.tensors import TensorSpec
from bundle_contract.vocab import Vocab

DOCS = REPO / "docs" / "artifacts.md"


def doc_examples() -> dict[str, object]:
    """The JSON blocks of docs/artifacts.md marked `<!-- example: NAME -->`."""
    text = DOCS.read_text()
    found = re.findall(r"<!-- example: (\w+) -->\s*```json\n(.*?)```", text, re.S)
    return {name: json.loads(block) for name, block in found}


def test_docs_examples_are_what_the_code_reads_and_writes():
    examples = doc_examples()
    assert set(examples) == {
        "manifest",
        "vocab",
        "thresholds",
        "attention_thresholds",
        "coref_head",
        "generation",
    }
    manifest = Manifest.from_json(examples["manifest"], "docs/artifacts.md")
    # Written back, the example is unchanged: the doc lists exactly the writer's fields.
    assert manifest.to_json() == examples["manifest"]
    assert manifest.verified == examples["manifest"]["verified"]
    vocab = Vocab.from_json(examples["vocab"], "docs/artifacts.md")
    assert vocab.to_json() == examples["vocab"]
    samples = examples["manifest"]["eval"]["samples"]  # the doc's 360 digits
    thresholds = {m: default_thresholds(m, samples).to_json() for m in MODES}
    assert thresholds == examples["thresholds"]
    assert manifest.models["int8"].thresholds == default_thresholds("int8", samples)
    assert set(examples["thresholds"]) == set(MODES)
    attention = {m: t.to_json() for m, t in ATTENTION_THRESHOLDS.items()}
    assert attention == examples["attention_thresholds"]
    entry = manifest.models["int8"]
    assert entry.attention.signature in entry.signatures
    assert manifest.attention.samples <= manifest.eval.samples
    # The classifier example names no coreference head, so the writer leaves the key out.
    assert manifest.coref_head is None and "coref_head" not in manifest.to_json()
    # MiniLM's best head, as the doc shows it: what CorefHead reads and writes.
    coref = CorefHead.from_json(Fields("docs/artifacts.md"), {"coref_head": examples["coref_head"]})
    assert coref == CorefHead(3, 1, 0.702, (0.662, 0.742), 500)
    assert coref.to_json() == examples["coref_head"]
    # A language model's `generation` entry, as the doc shows it (the test model's).
    generation = Generation.from_json(
        Fields("docs/artifacts.md"), {"generation": examples["generation"]},
        EvalSpec("eval.npz", "0" * 64, 58, (58, 127), "int32", 257, None, "language-model"),
    )  # fmt: skip
    assert generation.to_json() == examples["generation"]
    assert generation.cache_bytes_per_token * 2 == generation.cache_bytes_per_token_all_heads
    assert coref.caption() == (
        "layer 3 head 1: the best coreference head, 0.702 (0.662-0.742) of 500 generated "
        "pronoun sentences, keras-mha-heads coref"
    )


# The doc's manifest has one layer of 2 heads (int8's view signature).
COREF = {"layer": 0, "head": 1, "accuracy": 0.7, "ci95": [0.66, 0.74], "sentences": 500}


def test_coref_head_round_trips_after_attention():
    data = doc_examples()["manifest"]
    data["coref_head"] = dict(COREF)
    manifest = Manifest.from_json(data, "manifest.json")
    assert manifest.coref_head == CorefHead(0, 1, 0.7, (0.66, 0.74), 500)
    written = manifest.to_json()
    assert written == data
    keys = list(written)
    assert keys[keys.index("attention") + 1] == "coref_head"


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(layer="0"), "field 'coref_head.layer' must be an integer from 0 to 63, got '0'"),
        (dict(layer=-1), "field 'coref_head.layer' must be an integer from 0 to 63, got -1"),
        (
            dict(layer=1),
            "field 'coref_head.layer' is 1; the model has 1 layers (0..0) in models.int8",
        ),
        (dict(head=2), "field 'coref_head.head' is 2; layer 0 has 2 heads (0..1) in models.int8"),
        (dict(head=True), "field 'coref_head.head' must be an integer from 0"),
        (dict(head=1.0), "field 'coref_head.head' must be an integer from 0"),
        (dict(accuracy=1.5), "field 'coref_head.accuracy' must be in [0, 1], got 1.5"),
        (dict(accuracy=-0.1), "field 'coref_head.accuracy' must be in [0, 1], got -0.1"),
        (dict(accuracy="0.7"), "field 'coref_head.accuracy' must be a finite number, got '0.7'"),
        (dict(accuracy=None), "field 'coref_head.accuracy' must be a finite number, got None"),
        (dict(ci95=[0.8, 0.6]), "field 'coref_head.ci95' must be [low, high] with 0 <= low"),
        (dict(ci95=[0.6]), "field 'coref_head.ci95' must be [low, high]"),
        (dict(ci95=[0.6, 1.2]), "field 'coref_head.ci95' must be [low, high]"),
        (dict(ci95="0.66-0.74"), "field 'coref_head.ci95' must be [low, high]"),
        (dict(ci95=[True, 1]), "field 'coref_head.ci95' must be [low, high]"),
        (dict(sentences=0), "field 'coref_head.sentences' must be an integer from 1 to 1000000"),
        (dict(head=None), "field 'coref_head.head' must be an integer"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_coref_head_is_one_line_naming_its_field(change, message):
    data = doc_examples()["manifest"]
    data["coref_head"] = {**COREF, **change}
    with pytest.raises(UsageError) as info:
        Manifest.from_json(data, "manifest.json")
    assert str(info.value).startswith(f"manifest.json: {message}")
    assert "\n" not in str(info.value)


def test_a_coref_head_needs_a_head_to_name():
    data = doc_examples()["manifest"]
    data["coref_head"] = [0, 1]
    with pytest.raises(UsageError, match="field 'coref_head' must be an object, got list"):
        Manifest.from_json(data, "manifest.json")
    data["coref_head"] = {k: v for k, v in COREF.items() if k != "head"}
    with pytest.raises(UsageError, match="missing field 'coref_head.head'"):
        Manifest.from_json(data, "manifest.json")
    data["coref_head"] = dict(COREF)
    del data["models"]["int8"]["attention"], data["models"]["int8"]["signatures"]
    data["attention"] = None
    with pytest.raises(UsageError, match="names a head, but no model has an attention signature"):
        Manifest.from_json(data, "manifest.json")
    data["coref_head"] = None  # null is the same as absent
    assert Manifest.from_json(data, "manifest.json").coref_head is None


def test_example_manifest_round_trips():
    manifest = example_manifest()
    again = Manifest.from_json(json.loads(json.dumps(manifest.to_json())))
    assert again == manifest
    int8 = again.models["int8"]
    assert int8.input.scale == 0.0039 and int8.input.zero_point == -128
    assert int8.thresholds == default_thresholds("int8", 360)
    assert again.models["float32"].input.scale is None
    assert again.eval.x_shape == (360, 8, 8) and again.dataset == "digits"
    assert again.file("vocab") is None and again.verified == ["float32", "int8"]


def test_signatures_round_trip_for_more_entry_points():
    weights = TensorSpec("attention_0", (1, 2, 8, 8), "float32")
    manifest = example_manifest()
    entry = manifest.models["float32"]
    signature = Signature(inputs={"inputs": entry.input}, outputs={"layer_0": weights})
    models = {
        **manifest.models,
        "float32": ModelEntry(**{**entry.__dict__, "signatures": {"attention": signature}}),
    }
    data = json.loads(json.dumps(Manifest(**{**manifest.__dict__, "models": models}).to_json()))
    assert data["models"]["float32"]["signatures"]["attention"]["outputs"]["layer_0"]["shape"] == [
        1,
        2,
        8,
        8,
    ]
    assert Manifest.from_json(data).models["float32"].signatures == {"attention": signature}
    data["models"]["float32"]["signatures"]["attention"]["outputs"]["layer_0"]["dtype"] = "int4"
    with pytest.raises(
        UsageError, match="signatures.attention.outputs.layer_0.dtype' must be one of"
    ):
        Manifest.from_json(data)


def _drop(path: str):
    def edit(m):
        *parents, last = path.split(".")
        for key in parents:
            m = m[key]
        del m[last]

    return edit


def _set(path: str, value):
    def edit(m):
        *parents, last = path.split(".")
        for key in parents:
            m = m[key]
        m[last] = value

    return edit


@pytest.mark.parametrize(
    "edit,message",
    [
        (_drop("format"), "missing field 'format'"),
        (_set("format", "other"), "field 'format' is 'other'"),
        (_set("format_version", 2), "format_version' is 2"),
        (_drop("eval"), "missing field 'eval'"),
        (_drop("eval.sha256"), "missing field 'eval.sha256'"),
        (_set("eval.samples", "360"), "'eval.samples' must be an integer"),
        (_set("eval.x_shape", [100, 8, 8]), "eval.x_shape' starts with 100"),
        (_drop("labels"), "missing field 'labels'"),
        (_drop("vocab"), "missing field 'vocab'"),
        (_set("models", {}), "field 'models' is empty"),
        (_drop("models.int8.sha256"), "missing field 'models.int8.sha256'"),
        (_set("models.int8.sha256", "xyz"), "64 lowercase hex"),
        (_set("models.int8.bytes", 0), "'models.int8.bytes' must be an integer from 1 to"),
        (_set("models.int8.file", "../model.tflite"), "must name a file inside the bundle"),
        (_drop("models.int8.thresholds"), "missing field 'models.int8.thresholds'"),
        (_set("models.int8.thresholds", {"min_acc": 0.9}), "unknown key 'min_acc'"),
        (_set("models.int8.thresholds", {}), "field 'models.int8.thresholds' is empty"),
        (
            _set("models.int8.thresholds", {"min_agreement": None}),  # null is not "unchecked"
            "'models.int8.thresholds.min_agreement' must be a finite number, got None",
        ),
        (_set("models.int8.input.shape", [8, 8, 8]), "input.shape' must be [1, 8, 8]"),
        (_set("models.int8.output.shape", [1, 9]), "output.shape' must be [1, 10]"),
        (_set("models.int8.input.dtype", "int4"), "input.dtype' must be one of"),
        (_set("models.int8.input.zero_point", None), "must both be null or both be set"),
        (_set("models.float32.input.scale", 0.5), "must both be null or both be set"),
        (_set("models.int8.input.scale", -1.0), "input.scale' must be positive"),
        (_set("models.int8.runtimes", {"ai-edge-litert": "yes"}), "must map runtime names"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_from_json_refuses(edit, message):
    data = example_manifest().to_json()
    edit(data)
    with pytest.raises(UsageError) as info:
        Manifest.from_json(data, "manifest.json")
    assert message in str(info.value)
    assert str(info.value).startswith("manifest.json: ")


def test_from_json_refuses_a_list():
    with pytest.raises(UsageError, match="expected a JSON object, got list"):
        Manifest.from_json([], "manifest.json")


def test_read_and_write_through_the_bundle_directory(tmp_path):
    path = example_manifest().write(tmp_path)
    assert path == tmp_path / "manifest.json"
    assert Manifest.read(tmp_path) == example_manifest()
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "real.json").write_text(json.dumps(example_manifest().to_json()))
    (tmp_path / "manifest.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(UsageError, match="manifest.json: is a symbolic link"):
        Manifest.read(tmp_path)


def test_select_modes_order_subset_and_unknown():
    manifest = example_manifest()
    assert select_modes(manifest, "all") == ("float32", "int8")
    assert select_modes(manifest, "int8, float32") == ("float32", "int8")
    assert select_modes(manifest, "int8") == ("int8",)
    with pytest.raises(UsageError, match="'int4' is not a known mode"):
        select_modes(manifest, "int8,int4")
    with pytest.raises(UsageError, match="'float16' is not in this bundle"):
        select_modes(manifest, "float16")
    with pytest.raises(UsageError, match="no mode given"):
        select_modes(manifest, ",")


def test_a_model_larger_than_its_task_allows_is_refused_before_it_is_read():
    """A classifier's file is at most 256 MiB (its device's budget); a language model's
    may be larger (SmolLM2's float32 file is 652 MB), up to a flatbuffer's 2 GiB."""
    from bundle_contract.files import DEFAULT_FILE_BYTES, MAX_FILE_BYTES
    from bundle_contract.tasks import get

    data = example_manifest().to_json()
    data["models"]["int8"]["bytes"] = DEFAULT_FILE_BYTES + 1
    with pytest.raises(UsageError, match=r"'models.int8.bytes' is 268435457; a model of task "
                       r"'classification' has at most 268435456 bytes"):  # fmt: skip
        Manifest.from_json(data)
    data["models"]["int8"]["bytes"] = DEFAULT_FILE_BYTES
    assert Manifest.from_json(data).models["int8"].bytes == DEFAULT_FILE_BYTES
    assert get("language-model").max_model_bytes == MAX_FILE_BYTES == 2**31 - 1
