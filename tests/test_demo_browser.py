"""The demo page in a real headless Chromium (Debian's chromium + chromium-driver): type, click, read, screenshot."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from demo.views import example_questions
from tests.test_demo import served

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
    "--window-size=1440,2600",
)


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


@pytest.fixture
def browser(tmp_path):
    chromium, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


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


def test_page_answers_and_highlights_passages(browser, pipeline):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    question = example_questions()[0][0]  # the gold passage sits mid-prompt (position 3 of 5)
    expected = [p.title for p in pipeline.retrieve(question, pipeline.top_k)]
    wait = WebDriverWait(browser, 90)
    with served(pipeline.with_method("ms-poe")) as url:
        browser.get(url)
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "Ready"))

        # An empty question is refused with a message in the page.
        browser.find_element(By.CSS_SELECTOR, "#ask").click()
        wait.until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), "The question is empty"))

        box = browser.find_element(By.CSS_SELECTOR, "#question textarea")
        box.clear()
        box.send_keys(question)
        compare = browser.find_element(By.XPATH, "//label[contains(., 'Side by side')]//input[@type='checkbox']")
        compare.click()
        browser.find_element(By.CSS_SELECTOR, "#ask").click()

        wait.until(ec.text_to_be_present_in_element((By.ID, "baseline-passages"), f"[{len(expected)}] "))
        wait.until(ec.text_to_be_present_in_element((By.ID, "ranks"), "rank under baseline"))
        passages = browser.find_element(By.ID, "passages").text
        for i, title in enumerate(expected, start=1):
            assert f"[{i}] {title}" in passages
        assert "★ gold" in passages
        assert browser.find_element(By.ID, "answer").text.startswith("ms-poe (smollm2-135m):")
        # The heat scale: each passage's text carries a background colour from its score; headers do not.
        shaded = browser.execute_script(
            "return [...document.querySelectorAll('#passages [style*=\"background-color\"]')]"
            ".filter(e => e.innerText.trim() && getComputedStyle(e).backgroundColor !== 'rgba(0, 0, 0, 0)').length"
        )
        assert shaded == len(expected), f"{shaded} shaded spans for {len(expected)} passages"
        browser.execute_script("document.getElementById('answer').scrollIntoView()")
        browser.execute_script("window.scrollTo(0, 0)")
        _save_screenshot(browser, SCREENSHOT)
    assert SCREENSHOT.stat().st_size > 10_000
