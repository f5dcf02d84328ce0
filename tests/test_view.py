"""The attention page (keras_mha_edge.view.page), in Python and in a real browser.

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

from keras_mha_edge.view.page import ViewData, page_data, render_html, write_html

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
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_input_is_one_clear_line(overrides, argument, tmp_path):
    target = tmp_path / "view.html"
    with pytest.raises(ValueError, match=re.escape(f"argument `{argument}`")) as error:
        write_html(target, digits_data(**overrides))
    assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temp file


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
    from keras_mha.heads.cli import main as heads_main
    from keras_mha_edge.app.cli import main as edge_main

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
