"""The demo page in a real headless Chromium (Debian's chromium + chromium-driver): type, click, read, screenshot."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from midlens.demo.views import KEY_MARK, MAX_SHADE, example_questions
from tests.test_demo import JARGON, served

pytestmark = pytest.mark.browser

SCREENSHOT = Path(__file__).resolve().parent.parent / "artifacts" / "demo_browser.png"
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
PAGE_WIDTH, WINDOW_HEIGHT = 1280, 2600  # the width the side-by-side view must be readable at
REVIEW_DIR = Path("/tmp/demo_shots")  # copies of every screenshot, kept after pytest's tmp dirs are gone


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver)) if not path]
        pytest.skip(
            f"{' and '.join(missing)} not found on PATH; install Debian's browser with "
            "`apt-get install -y chromium chromium-driver` (.ci/run does) to run the page test."
        )
    return chromium, driver


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    # One browser for the page tests, each opening its own page on its own server: Chromium starts once.
    binary, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={PAGE_WIDTH},{WINDOW_HEIGHT}")
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium):
    chromium.set_window_size(PAGE_WIDTH, WINDOW_HEIGHT)  # a test's screenshot grows the window to its page
    yield chromium


def _save_screenshot(driver, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".png")
    os.close(fd)
    try:
        if not driver.save_screenshot(tmp):
            raise AssertionError("chromium did not write the screenshot")
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; it is meant to be viewed
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# What the page shows of each plot, read from the SVG vega draws: legend entries, axis labels, and whether each
# text lies inside the block that clips the plot (a fixed-height block cut off the legend and x labels).
PLOT_TEXTS = """
const block = document.getElementById(arguments[0]);
const box = block.getBoundingClientRect();
const texts = (selector) => [...block.querySelectorAll(selector)].map(t => t.textContent);
const clipped = [...block.querySelectorAll('svg.marks text')].filter(t => {
  const r = t.getBoundingClientRect();
  return t.textContent.trim() && (r.bottom > box.bottom + 0.5 || r.right > box.right + 0.5 || r.left < box.left - 0.5);
}).map(t => t.textContent);
return {
  legend: texts('.role-legend .role-legend-label text'),
  legend_title: texts('.role-legend .role-legend-title text'),
  y_labels: texts('.role-axis[aria-label^="Y-axis"] .role-axis-label text'),
  axis_titles: texts('.role-axis-title text'),
  clipped: clipped,
};
"""

# Header words of the scores table that the browser broke across lines ("positi|on"): a word whose text range
# has more than one line box.
BROKEN_HEADER_WORDS = r"""
const broken = [];
for (const span of document.querySelectorAll('#scores-table th .header')) {
  const node = span.firstChild;
  if (!node || node.nodeType !== Node.TEXT_NODE) continue;
  const text = node.textContent;
  let at = 0;
  for (const word of text.split(/\s+/).filter(Boolean)) {
    const start = text.indexOf(word, at);
    at = start + word.length;
    const range = document.createRange();
    range.setStart(node, start);
    range.setEnd(node, at);
    const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
    if (lines.size > 1) broken.push(word);
  }
}
return broken;
"""


# The scores table as the reader sees it (Gradio draws its body as ARIA grid rows of divs, not <td>s).
TABLE = """
const table = document.getElementById('scores-table');
const texts = (nodes) => [...nodes].map(c => c.innerText.trim());
const rows = [...table.querySelectorAll('[role="row"][data-index]')];
return {headers: texts(table.querySelectorAll('th[role="columnheader"]')),
        data: rows.map(r => texts(r.querySelectorAll('[role="gridcell"]')))};
"""

# The passages' shading: the alpha of each text span's background, in prompt order.
SHADES = """
return [...document.querySelectorAll(arguments[0] + ' [style*="background-color"]')]
  .filter(e => e.innerText.trim())
  .map(e => { const m = getComputedStyle(e).backgroundColor.match(/rgba?\\(([^)]*)\\)/)[1].split(',');
              return m.length === 4 ? parseFloat(m[3]) : 1; });
"""


def _shot(driver, tmp_path: Path, name: str) -> Path:
    """A screenshot under pytest's tmp dir, and a copy in REVIEW_DIR to look at."""
    path = tmp_path / f"{name}.png"
    _save_screenshot(driver, path)
    REVIEW_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, REVIEW_DIR / path.name)
    return path


def _visible_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _open_details(driver, wait) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, "//*[@id='details']//button[contains(., 'Details (scores)')]").click()
    wait.until(lambda d: d.find_element(By.ID, "scores-table").is_displayed())


def _full_page(driver) -> None:
    """Grow the window to the page's height, so the screenshot holds everything from the question to the table."""
    driver.set_window_size(PAGE_WIDTH, 900)  # measured from a short window: the page stretches to a tall one
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(PAGE_WIDTH, height + 120)


def test_page_answers_and_highlights_passages(browser, pipeline, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    question = example_questions()[0][0]  # the gold passage sits mid-prompt (position 3 of 5)
    expected = [p.title for p in pipeline.retrieve(question, pipeline.options.top_k)]
    wait = WebDriverWait(browser, 90)
    with served(pipeline.with_method("ms-poe")) as url:
        browser.get(url)
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "Ready"))

        # An empty question is refused with a message in the page.
        browser.find_element(By.CSS_SELECTOR, "#ask").click()
        wait.until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), "The question is empty"))
        # Dismissed as a reader would, so the message does not cover the page in the screenshot below.
        browser.find_element(By.CSS_SELECTOR, "[data-testid='toast-close']").click()
        wait.until(lambda d: "The question is empty" not in d.find_element(By.TAG_NAME, "body").text)

        # Each example shows its whole question and note, and clicking it fills the question box.
        buttons = browser.find_elements(By.CSS_SELECTOR, "#examples button.example")
        assert [b.text for b in buttons] == [f"{q} — {note}" for q, note in example_questions()]
        buttons[0].click()
        box = browser.find_element(By.CSS_SELECTOR, "#question textarea")
        wait.until(lambda _: box.get_attribute("value") == question)
        compare = browser.find_element(By.XPATH, "//label[contains(., 'Side by side')]//input[@type='checkbox']")
        compare.click()
        browser.find_element(By.CSS_SELECTOR, "#restack input[type='checkbox']").click()
        browser.find_element(By.CSS_SELECTOR, "#ask").click()

        wait.until(ec.text_to_be_present_in_element((By.ID, "baseline-passages"), f"[{len(expected)}] "))
        passages = browser.find_element(By.ID, "passages").text
        for i, title in enumerate(expected, start=1):
            assert f"[{i}] {title}" in passages
        assert KEY_MARK in passages
        assert browser.find_element(By.ID, "answer").text.startswith("Answer (ms-poe, smollm2-135m):")
        assert browser.find_element(By.ID, "baseline-answer").text.startswith("Answer (baseline, smollm2-135m):")
        # Re-ordered for the chosen method only; the side-by-side baseline reads the passages as retrieved.
        assert "re-ordered before it answered" in browser.find_element(By.ID, "answer").text
        assert "re-ordered" not in browser.find_element(By.ID, "baseline-answer").text
        # The heat scale: each passage's text carries a background colour from its score; headers do not.
        shaded = browser.execute_script(
            "return [...document.querySelectorAll('#passages [style*=\"background-color\"]')]"
            ".filter(e => e.innerText.trim() && getComputedStyle(e).backgroundColor !== 'rgba(0, 0, 0, 0)').length"
        )
        assert shaded == len(expected), f"{shaded} shaded spans for {len(expected)} passages"

        # Both plots, under Details: legends and axis labels drawn whole, inside their blocks; a shared quantity
        # starts at zero.
        _open_details(browser, wait)
        wait.until(ec.text_to_be_present_in_element((By.ID, "ranks"), "rank under baseline"))
        wait.until(lambda d: len(d.execute_script(PLOT_TEXTS, "position-plot")["legend"]) == 2)
        _full_page(browser)
        position = browser.execute_script(PLOT_TEXTS, "position-plot")
        assert sorted(position["legend"]) == ["baseline", "ms-poe"] and position["legend_title"] == ["method"]
        assert position["axis_titles"] == ["prompt position", "calibrated evidence"]
        assert float(position["y_labels"][0]) <= 0.0, f"evidence axis starts at {position['y_labels'][0]}"
        assert position["clipped"] == []
        attribution = browser.execute_script(PLOT_TEXTS, "attribution-plot")
        assert attribution["clipped"] == []
        assert attribution["axis_titles"] == ["prompt position", "share of the answer's attention"]
        assert float(attribution["y_labels"][0]) == 0.0
        # Legend text is in the page, not only in the SVG's DOM: it is visible to a reader.
        legend_text = browser.find_element(By.ID, "position-plot").text
        assert "ms-poe" in legend_text and "baseline" in legend_text
        assert browser.execute_script(BROKEN_HEADER_WORDS) == []

        browser.execute_script("window.scrollTo(0, 0)")
        _save_screenshot(browser, SCREENSHOT)
        _shot(browser, tmp_path, "side_by_side")
    assert SCREENSHOT.stat().st_size > 10_000


def test_first_screen_reads_in_plain_words(browser, pipeline, tmp_path):
    """Before a question: no table, no plot, no jargon. After one: the answer, the passage read most and a trust
    line in plain words, a legend whose two numbers are the range of the scores in the Details table, and the
    darkest passage the one the answer names."""
    import re

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 90)
    with served(pipeline) as url:
        browser.get(url)
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "Ready"))
        shown_headers = "return [...document.querySelectorAll('th')].filter(e => e.getClientRects().length).length"
        assert browser.execute_script(shown_headers) == 0, "a table shows before any question"
        assert not [e for e in browser.find_elements(By.ID, "results") if e.is_displayed()]  # hidden: not drawn
        assert not [w for w in JARGON if w in _visible_text(browser).lower()]
        _shot(browser, tmp_path, "first_screen_before")

        browser.find_elements(By.CSS_SELECTOR, "#examples button.example")[0].click()
        browser.find_element(By.CSS_SELECTOR, "#ask").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "passages"), "[5] "))
        wait.until(ec.text_to_be_present_in_element((By.ID, "answer"), "the most."))
        answer = browser.find_element(By.ID, "answer").text
        assert answer.startswith("Answer (baseline, smollm2-135m):")
        assert re.search(VERDICT, answer), answer
        assert "The dataset's answer to this example: Brea, California" in answer
        named = int(re.search(r"It read passage (\d), .+, the most\.", answer)[1])
        assert not [w for w in JARGON if w in _visible_text(browser).lower()]
        assert browser.execute_script(shown_headers) == 0  # the table waits, closed, under Details

        # The shading runs from none (least read) to MAX_SHADE (read most): the passage the answer names.
        shades = browser.execute_script(SHADES, "#passages")
        assert len(shades) == 5 and min(shades) == 0.0 and max(shades) == pytest.approx(MAX_SHADE, abs=0.01)
        assert shades.index(max(shades)) == named - 1
        legend = browser.find_element(By.ID, "heat-legend")
        assert "read least" in legend.text and "read most" in legend.text and "score" not in legend.text
        # The raw scores stay out of the words; the legend's ends carry them for the Details comparison below.
        lo, hi = (
            float(legend.find_element(By.CLASS_NAME, c).get_attribute("data-score")) for c in ("legend-lo", "legend-hi")
        )
        _full_page(browser)
        _shot(browser, tmp_path, "first_screen_answer")

        # One click away: the numbers, and the legend's two ends are their range.
        _open_details(browser, wait)
        table = wait.until(lambda d: (t := d.execute_script(TABLE))["data"] and t)
        evidence = [float(row[table["headers"].index("baseline evidence")]) for row in table["data"]]
        assert (lo, hi) == (pytest.approx(min(evidence), abs=1e-4), pytest.approx(max(evidence), abs=1e-4))
        assert "calibrated" in _visible_text(browser).lower()
        _full_page(browser)
        _shot(browser, tmp_path, "first_screen_details")


# The verdict line's opening words, one per band of the support score and per citation check.
VERDICT = r"(✓ Backed|✓ Likely supported|⚠ Uncertain|⚠ Check this answer|⚠ No answer)[^:]*: "

# The passage sentences marked for the answer sentence pointed at, and the ids that sentence cites.
MARKED = """
const [cls, sentence] = [arguments[0], arguments[1]];
return {
  marked: [...document.querySelectorAll('#passages .psent.' + cls)].map(e => e.dataset.sid),
  cited: (sentence.dataset.cites || '').split(' ').filter(Boolean),
  background: [...document.querySelectorAll('#passages .psent.' + cls)].map(e => getComputedStyle(e).backgroundColor),
  plain: [...document.querySelectorAll('#passages .psent:not(.cite-hl):not(.cite-picked)')]
    .map(e => getComputedStyle(e).backgroundColor)[0],
};
"""
# How each kind of citation marker and answer sentence is drawn: underline style and colour.
CITE_STYLES = """
const look = (e) => { const s = getComputedStyle(e);
  return [s.borderBottomStyle, s.borderBottomColor, s.color, s.textDecorationStyle].join(' '); };
const out = {};
for (const kind of ['cite-ok', 'cite-shapes', 'cite-unchecked', 'cite-failed']) {
  const marker = document.querySelector('#answer sup.cite.' + kind);
  out[kind] = marker ? look(marker) : null;
}
out.sentences = [...document.querySelectorAll('#answer .asent')].map(e => [e.className, look(e)]);
out.markers = [...document.querySelectorAll('#answer .asent ~ sup.cite, #answer .asent + sup.cite')]
  .filter(e => !e.closest('.cite-legend')).map(e => e.className);
return out;
"""


def _ask_example(browser, wait, check: bool) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    box = browser.find_element(By.ID, "check-citations").find_element(By.CSS_SELECTOR, "input[type='checkbox']")
    if box.is_selected() != check:
        box.click()
    browser.find_element(By.CSS_SELECTOR, "#ask").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "passages"), "[5] "))
    wait.until(ec.text_to_be_present_in_element((By.ID, "answer"), "the most."))
    legend = "failed the check" if check else "not checked"
    wait.until(ec.text_to_be_present_in_element((By.ID, "answer"), legend))


def test_citations_point_at_passage_sentences(browser, pipeline, tmp_path):
    """Pointing at an answer sentence marks the passage sentences it cites, clicking keeps them marked; with
    "Check citations" on, checked, unchecked and failed citations are drawn differently and the legend says which
    is which."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 180)
    with served(pipeline) as url:
        browser.get(url)
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "Ready"))
        assert not browser.find_element(By.ID, "check-citations").find_element(By.TAG_NAME, "input").is_selected()
        browser.find_elements(By.CSS_SELECTOR, "#examples button.example")[0].click()
        _ask_example(browser, wait, check=False)

        sentence = next(
            s for s in browser.find_elements(By.CSS_SELECTOR, "#answer .asent") if s.get_attribute("data-cites")
        )
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", sentence)
        ActionChains(browser).move_to_element(sentence).perform()
        hovered = browser.execute_script(MARKED, "cite-hl", sentence)
        assert hovered["marked"] and sorted(hovered["marked"]) == sorted(hovered["cited"]), hovered
        assert all(b != hovered["plain"] for b in hovered["background"]), hovered  # the mark is visible
        _full_page(browser)
        _shot(browser, tmp_path, "cite_hover")

        ActionChains(browser).move_to_element(browser.find_element(By.ID, "status")).perform()
        assert browser.execute_script(MARKED, "cite-hl", sentence)["marked"] == []  # pointing away unmarks
        sentence.click()
        ActionChains(browser).move_to_element(browser.find_element(By.ID, "status")).perform()
        picked = browser.execute_script(MARKED, "cite-picked", sentence)
        assert sorted(picked["marked"]) == sorted(picked["cited"]), picked  # a click keeps them marked
        assert "cite-selected" in sentence.get_attribute("class")
        styles = browser.execute_script(CITE_STYLES)
        assert styles["markers"] and set(styles["markers"]) == {"cite cite-unchecked"}
        browser.execute_script("window.scrollTo(0, 0)")
        _shot(browser, tmp_path, "cite_click")

        _ask_example(browser, wait, check=True)
        styles = browser.execute_script(CITE_STYLES)
        checked_kinds = {"cite cite-ok", "cite cite-shapes", "cite cite-failed"}
        assert styles["markers"] and set(styles["markers"]) <= checked_kinds, styles
        kinds = [styles[k] for k in ("cite-ok", "cite-shapes", "cite-unchecked", "cite-failed")]
        assert None not in kinds and len(set(kinds)) == 4, kinds  # the legend draws each kind as the answer does
        # A passage a flagged sentence needs is drawn apart from a check that backs it (issue 83 A): not green.
        assert [k.split()[0] for k in kinds] == ["solid", "double", "dashed", "dotted"]
        answer = browser.find_element(By.ID, "answer").text
        assert "checked: removing this passage changes the answer" in answer and "not checked" in answer
        assert re.search(VERDICT, answer), answer
        assert not [w for w in JARGON if w in _visible_text(browser).lower()]
        _full_page(browser)
        _shot(browser, tmp_path, "cite_checked")


# The check tab's passage sentences marked for the answer sentence pointed at, and the ids that sentence cites.
CHECK_MARKED = """
const sentence = arguments[0];
return {
  marked: [...document.querySelectorAll('#checked-passages .psent.cite-hl')].map(e => e.dataset.sid),
  cited: (sentence.dataset.cites || '').split(' ').filter(Boolean),
  elsewhere: document.querySelectorAll('#passages .psent.cite-hl').length,
};
"""


def test_check_tab_links_a_pasted_answers_sentences_to_passages(browser, pipeline, tmp_path):
    """The "Check an answer" tab: the example fills the form, Check reads the answer, and pointing at its first
    sentence marks, in the passages below it, the passage sentence it rests on (the example's middle paragraph)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 180)
    with served(pipeline) as url:
        browser.get(url)
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "Ready"))
        browser.find_element(By.XPATH, "//button[@role='tab' and contains(., 'Check an answer')]").click()
        browser.find_element(By.ID, "check-example").click()
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#check-answer textarea").get_attribute("value"))
        browser.find_element(By.ID, "check-button").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "checked-answer"), "may not rest on the passages"))
        answer = browser.find_element(By.ID, "checked-answer").text
        assert answer.startswith("Checked answer (read by baseline, smollm2-135m):") and "Support:" in answer
        assert "[2✓]" in answer  # the first sentence needs the middle paragraph
        first = browser.find_elements(By.CSS_SELECTOR, "#checked-answer .asent")[0]
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", first)
        ActionChains(browser).move_to_element(first).perform()
        hovered = browser.execute_script(CHECK_MARKED, first)
        assert hovered["marked"] and sorted(hovered["marked"]) == sorted(hovered["cited"]), hovered
        assert any(sid.startswith("c-2-") for sid in hovered["marked"]) and hovered["elsewhere"] == 0
        assert "Brea Mall in Brea, California" in " ".join(
            e.text for e in browser.find_elements(By.CSS_SELECTOR, "#checked-passages .psent.cite-hl")
        )
        _full_page(browser)
        _shot(browser, tmp_path, "check_tab")
