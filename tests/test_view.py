"""The attention page (edge_demo.view.page), in Python and in a real browser.

The browser tests open the page in headless Chromium (Debian's chromium and
chromium-driver, installed by `make browser`; Selenium from the `test`
extra), with a fresh profile and no network, take a screenshot, and check
the drawn DOM and a click. Where no browser can be had they skip, saying why.
Attention arrays here are synthetic (random softmax rows): the page only
draws what it is given.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import shutil
import tempfile

import numpy as np
import pytest

from edge_demo.view.page import ViewData, page_data, render_html, write_html

pytest_plugins = ["edge_fixtures"]  # the session's digits bundle

WORDS = "the model didn't work with the laptop because it was too complex for the small team today".split()
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1100",
)
PANEL_BORDER = (176, 184, 196)  # .panel's border colour (--panel: #b0b8c4)


def _attention(layers: int, heads: int, t: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(layers):
        s = rng.normal(size=(heads, t, t)) * 2.0
        e = np.exp(s - s.max(-1, keepdims=True))
        out.append(e / e.sum(-1, keepdims=True))
    return out


def digits_data(**overrides) -> ViewData:
    device = _attention(2, 4, 8, seed=0)
    reference = [a + 0.001 for a in device]
    values = dict(
        tokens=[f"row {i}" for i in range(8)],
        device=device,
        reference=reference,
        labels=[str(i) for i in range(10)],
        probs=np.full(10, 0.01) + np.eye(10)[3] * 0.9,
        reference_probs=np.full(10, 0.01) + np.eye(10)[3] * 0.9,
        input_kind="pixels",
        pixels=np.random.default_rng(1).integers(0, 17, size=(8, 8)),
        mode="int8",
        title="digits: eval sample 0",
        true_label="3",
    )
    values.update(overrides)
    return ViewData(**values)


def text_data(**overrides) -> ViewData:
    t = 16  # the pronouns model's length, all layers x heads: the largest page we ship
    device = _attention(2, 4, t, seed=2)
    values = dict(
        tokens=WORDS[:t],
        device=device,
        reference=[a.copy() for a in device],
        labels=["first noun", "second noun"],
        probs=[0.8, 0.2],
        input_kind="text",
        text=" ".join(WORDS),
        dropped=WORDS[t:],
        mode="float32",
        title="pronouns",
        initial_query=WORDS.index("it"),
    )
    values.update(overrides)
    return ViewData(**values)


def embedded(page: str) -> dict:
    match = re.search(
        r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S
    )
    assert match, "no attention-data script"
    return json.loads(match.group(1))


# --- Python side ------------------------------------------------------------------


def test_page_embeds_the_data_and_loads_nothing_from_elsewhere():
    page = render_html(text_data())
    data = embedded(page)
    assert data["tokens"] == WORDS[:16] and data["dropped"] == ["today"]
    assert data["heads"] == [4, 4] and data["initial_query"] == 8
    np.testing.assert_allclose(data["device"][1], text_data().device[1], atol=5e-5)
    assert data["parity"][0]["max_abs_diff"] == 0.0 and data["parity"][0]["argmax_agreement"] == 1.0
    assert data["prediction"] == {"index": 0, "label": "first noun", "confidence": 0.8}
    # No network: no link/src/url() to anything; the only URI is SVG's namespace.
    assert not re.search(r"<link|\ssrc=|url\(|@import", page)
    assert set(re.findall(r"https?://[^\s\"']+", page)) == {"http://www.w3.org/2000/svg"}


def test_digits_page_crops_padding_and_reports_parity():
    data = page_data(
        digits_data(device=_attention(2, 4, 10, 0), reference=None, reference_probs=None)
    )
    assert data["padding"] == 2 and np.asarray(data["device"][0]).shape == (4, 8, 8)
    assert data["parity"] is None and data["reference"] is None
    full = page_data(digits_data())
    assert [round(row["max_abs_diff"], 6) for row in full["parity"]] == [0.001, 0.001]
    assert np.asarray(full["input"]["pixels"]).max() == 1.0  # scaled to 0..1


def test_text_cannot_end_the_script_element():
    page = render_html(text_data(tokens=["</script>", *WORDS[1:16]], title="<b>x</b>"))
    assert embedded(page)["tokens"][0] == "</script>"
    assert "<title>&lt;b&gt;x&lt;/b&gt;</title>" in page


@pytest.mark.parametrize(
    "overrides, argument",
    [
        (dict(tokens=[]), "tokens"),
        (dict(device=[np.zeros((4, 8, 7))]), "device[0]"),
        (dict(device=_attention(1, 2, 4, 0)), "device[0]"),  # fewer positions than tokens
        (dict(device=[np.full((4, 8, 8), np.nan)]), "device[0]"),
        (dict(reference=_attention(2, 3, 8, 0)), "reference[0]"),
        (dict(probs=[0.5, 0.5]), "probs"),
        (dict(pixels=np.zeros((7, 8))), "pixels"),
        (dict(input_kind="image"), "input_kind"),
        (dict(initial_query=8), "initial_query"),
        (dict(initial_layer=2), "initial_layer"),
        (dict(labels=["one"], probs=[1.0]), "labels"),
        (dict(joined=[False] * 7), "joined"),  # 8 tokens
        (dict(joined=[True] + [False] * 7), "joined"),  # the first token joins nothing
        (dict(named_head=(0, 4)), "named_head"),  # 4 heads: 0..3
        (dict(named_head=(2, 0)), "named_head"),  # 2 layers
        (dict(named_head=(-1, 0)), "named_head"),
        (dict(named_head="L0-H1"), "named_head"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_input_is_one_clear_line(overrides, argument, tmp_path):
    target = tmp_path / "view.html"
    with pytest.raises(ValueError, match=re.escape(f"argument `{argument}`")) as error:
        write_html(target, digits_data(**overrides))
    assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temp file


def test_the_named_head_opens_its_layer_unless_told_otherwise():
    caption = "layer 1 head 2: the best coreference head"
    data = page_data(text_data(named_head=(1, 2), named_head_caption=caption))
    assert data["named_head"] == {"layer": 1, "head": 2, "caption": caption}
    assert data["initial_layer"] == 1
    assert page_data(text_data(named_head=(1, 2), initial_layer=0))["initial_layer"] == 0
    plain = page_data(text_data())
    assert plain["named_head"] is None and plain["initial_layer"] == 0
    assert plain["joined"] == [False] * 16


# A Subwords vocabulary with the lesson's words, a word in three pieces and "it" inside one.
PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "animal", "didn", "'", "t", "ex", "##it",
          ",", "it", "was", "un", "##believ", "##able", "."]  # fmt: skip


def test_word_pieces_are_shown_as_typed_and_the_pronoun_is_a_whole_word():
    from test_edge_embedding import tokenizer_json

    from bundle_contract.subwords import Subwords
    from edge_demo.view.page import initial_query

    pieces = Subwords.from_bytes(
        tokenizer_json({t: i for i, t in enumerate(PIECES)}), 32, "tokenizer.json"
    )
    text = "The animal didn't EXIT, it was unbelievable. Zebra"
    ids = pieces.encode([text])[0][0]
    tokens, joined = pieces.typed(text, ids)
    assert pieces.pieces(text)[0][5:8] == ["t", "ex", "##it"]  # what the tokenizer wrote
    assert tokens == ["[CLS]", "The", "animal", "didn", "'", "t", "EX", "IT", ",", "it", "was",
                      "un", "believ", "able", ".", "[UNK]", "[SEP]"]  # fmt: skip
    assert [tokens[i] for i, j in enumerate(joined) if j] == ["'", "t", "IT", ",", "believ",
                                                               "able", "."]  # fmt: skip
    assert initial_query(tokens, joined) == 9  # "it", not the "IT" of "EXIT"
    assert initial_query(tokens) == 7  # without the flags, any piece reading "it"
    assert initial_query(["[CLS]", "it", "'", "s", "[SEP]"], [False, False, True, True, False]) == 1
    assert initial_query(["it", "self"], [False, True]) is None
    assert pieces.typed(text, ids[:-1]) is None  # not the ids the model ran


def test_write_html_replaces_atomically(tmp_path):
    target = tmp_path / "view.html"
    target.write_text("old")
    write_html(target, digits_data())
    assert embedded(target.read_text(encoding="utf-8"))["mode"] == "int8"
    assert [p.name for p in tmp_path.iterdir()] == ["view.html"]


# --- in headless Chromium -----------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium driven by Selenium; `missing(...)` (skip, strict: fail) if none."""
    from environment import missing

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        missing("Debian's chromium and chromium-driver (make browser installs them as root)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium (pip install -e '.[test]'; make install)")
    os.environ.setdefault("SE_AVOID_STATS", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="keras-mha-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _open(driver, path: pathlib.Path):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return document.body.dataset.ready === '1'")
    )


def _screenshot(driver, path: pathlib.Path) -> np.ndarray:
    from PIL import Image

    png = driver.get_screenshot_as_png()
    path.write_bytes(png)
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int16)


def _panels_in(image: np.ndarray) -> int:
    """Panels drawn: connected outlines of the panel border colour, each at least 150x60 px."""
    from scipy import ndimage

    border = np.abs(image - np.array(PANEL_BORDER)).max(-1) <= 12
    labels, count = ndimage.label(ndimage.binary_dilation(border, iterations=2))
    boxes = ndimage.find_objects(labels)
    return sum(1 for b in boxes if b[0].stop - b[0].start >= 60 and b[1].stop - b[1].start >= 150)


def _lines(driver) -> list[dict]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#head-view line.attn-line')).map(l => ({"
        "head: +l.dataset.head, key: +l.dataset.key, query: +l.dataset.query, weight: +l.dataset.weight,"
        "source: l.dataset.source, y1: +l.getAttribute('y1')}))"
    )


def _check_lines(driver, data: dict, layer: int, query: int, source: str = "device") -> None:
    lines = [line for line in _lines(driver) if line["source"] == source]
    n = len(data["tokens"])
    assert len(lines) == data["heads"][layer] * n
    for line in lines:
        assert line["query"] == query
        expected = data[source][layer][line["head"]][query][line["key"]]
        assert abs(line["weight"] - expected) <= 1e-4


def test_digits_page_renders_and_reacts_to_a_click(browser, tmp_path):
    from selenium.webdriver.common.by import By

    page = write_html(tmp_path / "digits.html", digits_data())
    data = embedded(page.read_text(encoding="utf-8"))
    _open(browser, page)
    image = _screenshot(browser, tmp_path / "digits.png")
    assert image.std() > 20, "the screenshot is blank"
    assert _panels_in(image) == 4  # input, head view, model view, parity
    assert len(browser.find_elements(By.CSS_SELECTOR, "section.panel")) == 4
    maps = browser.find_elements(By.CSS_SELECTOR, "#model-view canvas.map")
    assert len(maps) == sum(data["heads"]) and all(m.size["width"] > 20 for m in maps)
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#pixels text.token")]
    assert labels == data["tokens"]
    _check_lines(browser, data, layer=0, query=0)
    before = {line["y1"] for line in _lines(browser)}

    browser.find_element(
        By.CSS_SELECTOR, '#head-view text[data-side="query"][data-index="5"]'
    ).click()
    assert browser.execute_script("return document.body.dataset.query") == "5"
    _check_lines(browser, data, layer=0, query=5)
    assert {line["y1"] for line in _lines(browser)} != before  # the lines now start at row 5

    browser.find_element(By.CSS_SELECTOR, '#layer-buttons button[data-layer="1"]').click()
    _check_lines(browser, data, layer=1, query=5)
    browser.find_element(By.CSS_SELECTOR, '#source-buttons button[data-source="both"]').click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#model-view canvas.map")) == 2 * sum(
        data["heads"]
    )
    _check_lines(browser, data, layer=1, query=5, source="reference")
    rows = browser.find_elements(By.CSS_SELECTOR, "#parity-table tr[data-layer]")
    assert [r.text.split()[:3] for r in rows] == [
        ["layer", "0", "1.00e-3"],
        ["layer", "1", "1.00e-3"],
    ]


def test_text_page_opens_on_the_pronoun_and_says_it_was_truncated(browser, tmp_path):
    from selenium.webdriver.common.by import By

    page = write_html(tmp_path / "pronouns.html", text_data())
    data = embedded(page.read_text(encoding="utf-8"))
    _open(browser, page)
    image = _screenshot(browser, tmp_path / "pronouns.png")
    assert image.std() > 20, "the screenshot is blank"
    assert _panels_in(image) == 4
    banner = browser.find_element(By.ID, "truncated")
    assert banner.is_displayed() and "truncated" in banner.text and "today" in banner.text
    words = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#sentence span")]
    assert words == data["tokens"]
    selected = browser.find_element(By.CSS_SELECTOR, "#sentence span.selected")
    assert selected.text == "it"
    _check_lines(browser, data, layer=0, query=data["initial_query"])
    assert len(browser.find_elements(By.CSS_SELECTOR, "#model-view canvas.map")) == 8

    browser.find_element(By.CSS_SELECTOR, '#sentence span[data-index="1"]').click()
    _check_lines(browser, data, layer=0, query=1)
    browser.find_element(By.CSS_SELECTOR, '#head-toggles .head-toggle[data-head="2"]').click()
    heads = {line["head"] for line in _lines(browser)}
    assert heads == {0, 1, 3}  # head 2 hidden


@pytest.mark.slow
def test_device_and_keras_pages_render(browser, digits_bundle, digits_run, tmp_path):
    """The page as the two commands write it: from the device's int8 model, and from Keras."""
    from edge_demo.app.cli import main as edge_main
    from keras_mha.heads.cli import main as heads_main

    device, keras_page = tmp_path / "device.html", tmp_path / "keras.html"
    assert edge_main([str(digits_bundle), "--sample", "3", "--view", str(device)]) == 0
    assert heads_main(["view", str(digits_run), "--sample", "3", "--out", str(keras_page)]) == 0
    pages = {}
    # the device page has the float reference beside it, so a parity panel too
    for page, panels in ((device, 4), (keras_page, 3)):
        data = pages[page.stem] = embedded(page.read_text(encoding="utf-8"))
        _open(browser, page)
        image = _screenshot(browser, tmp_path / f"{page.stem}.png")
        assert image.std() > 20, f"{page.name}: the screenshot is blank"
        assert _panels_in(image) == panels, page.name
        _check_lines(browser, data, layer=0, query=0)
    assert pages["device"]["mode"] == "int8" and pages["keras"]["mode"] == "keras"
    # The device page's reference is the Keras model's attention (4 decimals in each page).
    for ref, keras_layer in zip(pages["device"]["reference"], pages["keras"]["device"]):
        np.testing.assert_allclose(np.array(ref), np.array(keras_layer), atol=2e-4)


def _encoder_data(**overrides) -> ViewData:
    """MiniLM's shape, synthetic: 6 layers x 12 heads over 19 word pieces."""
    device = _attention(6, 12, 19, seed=4)
    values = dict(
        tokens=["[CLS]", *WORDS, "[SEP]"],
        device=device,
        labels=[],
        probs=None,
        input_kind="text",
        text=" ".join(WORDS),
        mode="dynamic",
        title="72 heads",
        initial_query=WORDS.index("it") + 1,
        named_head=(3, 1),
        named_head_caption="layer 3 head 1: the best coreference head, 0.702 (0.662-0.742)",
    )
    values.update(overrides)
    return ViewData(**values)


def _overflow(driver) -> dict:
    return driver.execute_script(
        "const m = document.getElementById('model-view');"
        "return {page: document.documentElement.scrollWidth, window: window.innerWidth,"
        "right: m.getBoundingClientRect().right, scroll: m.scrollWidth, client: m.clientWidth,"
        "sizes: Array.from(document.querySelectorAll('#model-view canvas.map')).map(c => {"
        "const r = c.getBoundingClientRect(); return [r.width, r.height]; })}"
    )


def test_72_maps_stay_readable_inside_the_window(browser, tmp_path):
    """6 x 12 heads in a 1400 px window: every map at least 70 px a side (48 side by side),
    nothing past the window's edge; in a 1000 px window the model view scrolls inside its
    panel, the maps keeping their 48 px."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = write_html(tmp_path / "encoder.html", _encoder_data())
    _open(browser, page)
    found = _overflow(browser)
    assert len(found["sizes"]) == 72
    assert min(min(size) for size in found["sizes"]) >= 70  # room for 12 in a row of 1400 px
    assert found["page"] <= found["window"] and found["right"] <= found["window"]
    assert found["scroll"] <= found["client"]  # all 12 heads of a layer fit: no scrolling
    grid = browser.find_element(By.ID, "map-grid").rect
    first = browser.find_element(By.CSS_SELECTOR, 'canvas.map[data-layer="0"][data-head="11"]')
    assert first.rect["y"] < grid["y"] + 20 + first.rect["height"]  # head 11 on layer 0's row

    both = write_html(tmp_path / "both.html", _encoder_data(reference=_attention(6, 12, 19, 5)))
    _open(browser, both)
    browser.find_element(By.CSS_SELECTOR, '#source-buttons button[data-source="both"]').click()
    found = _overflow(browser)
    assert len(found["sizes"]) == 144
    assert min(min(size) for size in found["sizes"]) >= 48
    assert found["page"] <= found["window"] and found["right"] <= found["window"]
    browser.set_window_size(1000, 1100)
    try:  # redrawn for the narrower window: the panel scrolls, not the page
        wait = WebDriverWait(browser, 10)
        wait.until(lambda d: _overflow(d)["scroll"] > _overflow(d)["client"])
        found = _overflow(browser)
        assert found["window"] == 1000 and min(min(size) for size in found["sizes"]) >= 48
        assert found["page"] <= found["window"] and found["right"] <= found["window"]
    finally:
        browser.set_window_size(1400, 1100)


def _opacity(driver, head: int) -> float:
    """The largest stroke-opacity of a head's lines in the head view."""
    from selenium.webdriver.common.by import By

    lines = driver.find_elements(By.CSS_SELECTOR, f'#head-view line.attn-line[data-head="{head}"]')
    return max(float(e.get_attribute("stroke-opacity")) for e in lines)


def test_the_named_head_is_captioned_opened_and_drawn_over_the_others(browser, tmp_path):
    from selenium.webdriver.common.by import By

    data = page_data(_encoder_data())
    page = write_html(tmp_path / "named.html", _encoder_data())
    _open(browser, page)
    caption = browser.find_element(By.ID, "named-caption").text
    assert caption == "\u2605 layer 3 head 1: the best coreference head, 0.702 (0.662-0.742)"
    on = browser.find_elements(By.CSS_SELECTOR, "#layer-buttons button.on")
    assert [b.get_attribute("data-layer") for b in on] == ["3"]
    named = browser.find_elements(By.CSS_SELECTOR, "#head-toggles .head-toggle.named")
    assert [t.get_attribute("data-head") for t in named] == ["1"]
    maps = browser.find_elements(By.CSS_SELECTOR, "#model-view canvas.map.named")
    assert [(m.get_attribute("data-layer"), m.get_attribute("data-head")) for m in maps] == [
        ("3", "1")
    ]
    _check_lines(browser, data, layer=3, query=data["initial_query"])
    # Head 1's lines keep their opacity (0.04 + weight, at most 1); the others' are faded.
    row = np.asarray(data["device"][3])[:, data["initial_query"]]
    assert _opacity(browser, 1) == pytest.approx(min(1, 0.04 + row[1].max()), abs=2e-3)
    assert _opacity(browser, 0) == pytest.approx(0.2 * min(1, 0.04 + row[0].max()), abs=2e-3)
    lines = browser.find_elements(By.CSS_SELECTOR, "#head-view line.attn-line")
    n = len(data["tokens"])
    assert {e.get_attribute("data-head") for e in lines[-n:]} == {"1"}  # drawn last: on top
    assert "1" not in {e.get_attribute("data-head") for e in lines[:-n]}

    browser.find_element(By.ID, "focus-toggle").click()  # off: every head as usual
    assert _opacity(browser, 0) == pytest.approx(min(1, 0.04 + row[0].max()), abs=2e-3)
    browser.find_element(By.CSS_SELECTOR, '#layer-buttons button[data-layer="0"]').click()
    browser.find_element(By.ID, "named-show").click()  # back to it, highlighted
    assert browser.execute_script("return document.body.dataset.layer") == "3"
    assert _opacity(browser, 0) == pytest.approx(0.2 * min(1, 0.04 + row[0].max()), abs=2e-3)


LESSON = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """The fast tests' tiny random BERT (tests/test_pretrained.py: 3 layers x 4 heads) imported
    as an embedding run, probed by `keras-mha-heads coref` (RUN/heads/coref.json) and
    exported in float32."""
    from edge_bundle import export_bundle

    from keras_mha.heads.cli import main as heads_main
    from keras_mha.pretrained.cli import import_run
    from tests.test_pretrained import SHAPE, oracle, torch_python

    root = tmp_path_factory.mktemp("view-bert")
    options = [f"--{k}={v}" for k, v in SHAPE.items()]
    oracle(torch_python(), "tiny", root / "model", *options, "--seed", 7)
    import_run(str(root / "model"), root / "run", max_length=64, log=lambda line: None)
    argv = ["coref", str(root / "run"), "--sentences", "40", "--bootstrap", "100"]
    assert heads_main(argv) == 0
    export_bundle(root / "run", root / "bundle", "float32")
    return root / "run", root / "bundle", SHAPE


@pytest.mark.slow
def test_encoder_pages_show_pieces_as_typed_and_open_on_the_coref_head(
    browser, tiny_encoder, tmp_path
):
    """The lesson's sentence on the tiny BERT's device bundle and from Keras: word pieces as
    typed, the query on "it", the best coreference head (coref.json -> the manifest)
    captioned with its layer selected, one map per layer x head."""
    from selenium.webdriver.common.by import By

    from bundle_contract.files import sha256_file
    from edge_demo.app.cli import main as edge_main
    from keras_mha.heads.cli import main as heads_main

    run, bundle, shape = tiny_encoder
    record = json.loads((run / "heads" / "coref.json").read_text())
    assert record["model_sha256"] == sha256_file(run / "model.keras")
    best = record["heads"][0]
    coref = {k: best[k] for k in ("layer", "head", "accuracy", "ci95")} | {"sentences": 40}
    assert json.loads((bundle / "manifest.json").read_text())["coref_head"] == coref
    low, high = best["ci95"]
    caption = (
        f"layer {best['layer']} head {best['head']}: the best coreference head, "
        f"{best['accuracy']:.3f} ({low:.3f}-{high:.3f}) of 40 generated pronoun sentences, "
        "keras-mha-heads coref"
    )
    device, keras_page = tmp_path / "device.html", tmp_path / "keras.html"
    argv = [str(bundle), "--quant", "float32", "--text", LESSON, "--view", str(device)]
    assert edge_main(argv) == 0
    assert heads_main(["view", str(run), "--text", LESSON, "--out", str(keras_page)]) == 0
    pages = {}
    for page in (device, keras_page):
        data = pages[page.stem] = embedded(page.read_text(encoding="utf-8"))
        _open(browser, page)
        spans = browser.find_elements(By.CSS_SELECTOR, "#sentence span")
        words = [e.text for e in spans]
        assert words == ["[CLS]", "The", "animal", "didn", "'", "t", "cross", "the", "street",
                         "because", "it", "was", "too", "tired", ".", "[SEP]"]  # fmt: skip
        joined = [i for i, e in enumerate(spans) if "joined" in e.get_attribute("class")]
        assert joined == [4, 5, 14]  # "'" and "t" of "didn't", the full stop
        typed = "".join(("" if i in joined else " ") + w for i, w in enumerate(words[1:-1], 1))
        assert typed.strip() == LESSON  # the pieces as typed give the sentence back
        labels = browser.find_elements(By.CSS_SELECTOR, '#head-view text[data-side="key"]')
        assert [e.text for e in labels[3:6]] == ["didn", "\u00b7'", "\u00b7t"]
        selected = browser.find_element(By.CSS_SELECTOR, "#sentence span.selected")
        assert selected.text == "it" and data["initial_query"] == 10
        assert browser.find_element(By.ID, "named-caption").text == "\u2605 " + caption
        on = browser.find_elements(By.CSS_SELECTOR, "#layer-buttons button.on")
        assert [b.get_attribute("data-layer") for b in on] == [str(best["layer"])]
        named = browser.find_elements(By.CSS_SELECTOR, "#head-toggles .head-toggle.named")
        assert [t.get_attribute("data-head") for t in named] == [str(best["head"])]
        _check_lines(browser, data, layer=best["layer"], query=10)
        maps = browser.find_elements(By.CSS_SELECTOR, "#model-view canvas.map")
        assert len(maps) == shape["layers"] * shape["heads"] == sum(data["heads"])
        assert all(m.size["width"] >= 48 and m.size["height"] >= 48 for m in maps)
        assert _screenshot(browser, tmp_path / f"{page.stem}.png").std() > 20
    assert pages["device"]["mode"] == "float32" and pages["keras"]["mode"] == "keras"
    # Typed text has no reference on the device; the two pages' weights agree (float32).
    for ours, keras_layer in zip(pages["device"]["device"], pages["keras"]["device"]):
        np.testing.assert_allclose(np.array(ours), np.array(keras_layer), atol=2e-4)

    # An eval sentence (`--sample 3`): the Keras page's weights are the bundle's reference.
    sentence = json.loads((run / "texts.json").read_text())[3]
    keras_sample, device_sample = tmp_path / "keras3.html", tmp_path / "device3.html"
    assert heads_main(["view", str(run), "--sample", "3", "--out", str(keras_sample)]) == 0
    argv = [str(bundle), "--quant", "float32", "--sample", "3", "--view", str(device_sample)]
    assert edge_main(argv) == 0
    ours = embedded(keras_sample.read_text(encoding="utf-8"))
    theirs = embedded(device_sample.read_text(encoding="utf-8"))
    assert ours["tokens"] == theirs["tokens"] and ours["input"]["text"] == sentence
    assert ours["tokens"][1] == sentence.split()[0]  # as typed: the first word, case kept
    assert ours["named_head"] == theirs["named_head"] and ours["named_head"]["caption"] == caption
    for keras_layer, reference in zip(ours["device"], theirs["reference"]):
        np.testing.assert_allclose(np.array(keras_layer), np.array(reference), atol=2e-4)
