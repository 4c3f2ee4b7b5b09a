"""The playground page at `/`, driven in Debian's headless chromium through chromium-driver (Selenium),
against a real `berth serve` with real bundles: each form submits and draws what the API answered (entity
spans checked against gold spans written here), errors and the API key's 401 are shown, the page loads
without console errors, and `BERTH_PLAYGROUND=false` turns it off. Screenshots of each form with its
result are written to docs/playground/.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest

from export.bundle_writing import write_manifest
from tasks.runtime.bundle import MANIFEST_FILE
from tests.service.conftest import API_KEY, REPO, ServerProcess

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[test])")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium")) if p and os.path.exists(p)), None)
SCREENSHOTS = REPO / "docs" / "playground"
NER_TEXT = "We flew to Tokyo, then on to Sydney."
NER_GOLD = [("Tokyo", "LOC"), ("Sydney", "LOC")]  # the test NER model tags city names as locations
QA_EXAMPLE = {"question": "When was the museum founded?",
              "context": "The old market stood by the river. The museum was founded in 1887. Children played near "
                         "the water in the evening."}
SIMILAR = ["A man is playing a guitar.", "Someone plays an instrument.", "A chef is cooking pasta."]
CHOICE_EXAMPLE = {"context": "She opened the umbrella because",
                  "choices": ["it started to rain.", "the soup was cold."]}
# the test ranker takes a document naming the city a query asks about as relevant
RERANK_EXAMPLE = {"query": "Tell me about Lisbon.", "documents": ["We flew to Tokyo last week.",
                                                                  "The museum in Lisbon was closed.",
                                                                  "Prices in Oslo keep rising."]}
EXAMPLES = {
    "sentiment": ["A charming and often affecting journey.", "Unflinchingly bleak and desperate."],
    "similarity": [{"text": "A dog runs on the beach.", "text_pair": "A dog is running along the shore."}],
    "entities": [NER_TEXT, "The train from Berlin was late again."],
    "reader": [QA_EXAMPLE],
    # the bundles of the newer tasks, where the test repository has them
    "embeddings": SIMILAR,
    "masker": ["Paris is the [MASK] of France."],
    "chooser": [CHOICE_EXAMPLE],
    "ranker": [RERANK_EXAMPLE],
}

pytestmark = pytest.mark.skipif(not (CHROMEDRIVER and CHROMIUM),
                                reason="chromium and chromium-driver are not installed (apt install chromium "
                                       "chromium-driver, or make deploy-tools)")


@pytest.fixture(scope="module")
def example_repository(bundle_repository, tmp_path_factory) -> Path:
    """The test bundles with example inputs in their manifests (model files hard-linked, not copied)."""
    repository = tmp_path_factory.mktemp("playground") / "repository"
    for name, examples in EXAMPLES.items():
        source, target = bundle_repository / name, repository / name
        if not source.is_dir():
            continue
        target.mkdir(parents=True)
        for item in source.iterdir():
            if item.name != MANIFEST_FILE:
                os.link(item, target / item.name)
        manifest = json.loads((source / MANIFEST_FILE).read_text())
        write_manifest(target, {**manifest, "examples": examples})
    return repository


@pytest.fixture(scope="module")
def open_server(example_repository, tmp_path_factory):
    proc = ServerProcess(example_repository, tmp_path_factory.mktemp("logs") / "playground.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1000,900", f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    except WebDriverException as error:
        pytest.skip(f"chromium does not start here: {error.msg}")
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def console_errors(driver) -> list[str]:
    """The browser console's errors since the last call (reading the log empties it)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait(driver, condition, timeout: float = 60):
    return WebDriverWait(driver, timeout).until(condition)


def open_page(driver, url: str) -> None:
    driver.get(url + "/")
    driver.execute_script("sessionStorage.clear()")
    driver.get(url + "/")


def choose(driver, model: str) -> None:
    wait(driver, ec.visibility_of_element_located((By.ID, "model")))
    Select(driver.find_element(By.ID, "model")).select_by_visible_text(model)


def run_and_wait(driver) -> None:
    driver.find_element(By.ID, "run").click()
    wait(driver, lambda d: d.find_element(By.ID, "timing").text or d.find_element(By.ID, "error").is_displayed())
    assert not driver.find_element(By.ID, "error").is_displayed(), driver.find_element(By.ID, "error").text


def screenshot(driver, name: str) -> None:
    """The whole page, 1000 CSS pixels wide, as docs/playground/<name>.png."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1000, "height": height, "deviceScaleFactor": 1, "mobile": False})
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def api(server, route: str, body: dict) -> dict:
    response = httpx.post(server.url + route, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["results"][0]


def served(server, name: str) -> None:
    names = {m["name"] for m in httpx.get(server.url + "/v1/models").json()["models"]}
    if name not in names:
        pytest.skip(f"the test repository has no {name} bundle (its task's route is not in this branch)")


def bars(driver) -> list[tuple[str, str]]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#result .bar-row")
    return [(r.find_element(By.CLASS_NAME, "bar-label").text, r.find_element(By.CLASS_NAME, "bar-value").text)
            for r in rows]


def test_page_lists_the_models_with_their_examples_without_console_errors(open_server, browser):
    listed = httpx.get(open_server.url + "/v1/models").json()["models"]
    assert {m["name"]: m["examples"] for m in listed} == {m["name"]: EXAMPLES[m["name"]] for m in listed}
    assert {"sentiment", "similarity", "entities", "reader"} <= {m["name"] for m in listed}
    page = httpx.get(open_server.url + "/")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]

    open_page(browser, open_server.url)
    wait(browser, ec.visibility_of_element_located((By.ID, "task-form")))
    options = [o.text for o in Select(browser.find_element(By.ID, "model")).options]
    assert options == [f"{m['name']} ({m['task']})" for m in listed]
    choose(browser, "sentiment (classification)")
    assert browser.find_element(By.ID, "field-text").get_attribute("value") == EXAMPLES["sentiment"][0]
    labels = {label.get_attribute("for") for label in browser.find_elements(By.CSS_SELECTOR, "label")}
    inputs = {e.get_attribute("id") for e in browser.find_elements(By.CSS_SELECTOR, "input, textarea, select")}
    assert inputs <= labels  # every field has a label
    assert browser.execute_script("return localStorage.length") == 0
    assert console_errors(browser) == []


def test_ner_highlights_the_gold_entities_with_type_and_score(open_server, browser):
    open_page(browser, open_server.url)
    choose(browser, "entities (ner)")
    assert browser.find_element(By.ID, "field-text").get_attribute("value") == NER_TEXT
    run_and_wait(browser)
    marks = browser.find_elements(By.CSS_SELECTOR, "#result mark")
    found = [(m.find_element(By.CLASS_NAME, "span-text").text, m.find_element(By.CLASS_NAME, "tag").text)
             for m in marks]
    assert found == NER_GOLD
    entities = api(open_server, "/v1/ner", {"inputs": NER_TEXT, "model": "entities"})
    assert [m.get_attribute("title") for m in marks] == [f"{e['entity']} (score {e['score']:.3f})" for e in entities]
    assert "inference" in browser.find_element(By.ID, "timing").text
    screenshot(browser, "ner")
    assert console_errors(browser) == []


def test_qa_highlights_the_apis_answer_in_the_context_and_lists_the_top_k(open_server, browser):
    open_page(browser, open_server.url)
    choose(browser, "reader (qa)")
    question = browser.find_element(By.ID, "field-question")
    question.clear()
    question.send_keys(QA_EXAMPLE["question"], Keys.CONTROL, Keys.ENTER)  # the keyboard alone runs the form
    wait(browser, lambda d: d.find_element(By.ID, "timing").text)
    answers = api(open_server, "/v1/qa", {"inputs": QA_EXAMPLE, "model": "reader", "top_k": 5})
    highlighted = browser.find_element(By.CSS_SELECTOR, "#result mark .span-text").text
    assert highlighted == answers[0]["answer"] == "1887"
    assert browser.find_element(By.CSS_SELECTOR, "#result .answer").text == answers[0]["answer"]
    items = browser.find_elements(By.CSS_SELECTOR, "#result .top-k li")
    assert [i.text for i in items] == [f"{a['answer']} — score {a['score']:.3f}" for a in answers]
    screenshot(browser, "qa")
    assert console_errors(browser) == []


def test_classification_draws_every_label_as_a_bar(open_server, browser):
    open_page(browser, open_server.url)
    choose(browser, "sentiment (classification)")
    browser.find_elements(By.CSS_SELECTOR, "button.example")[1].click()
    assert browser.find_element(By.ID, "field-text").get_attribute("value") == EXAMPLES["sentiment"][1]
    run_and_wait(browser)
    expected = api(open_server, "/v1/classify", {"inputs": EXAMPLES["sentiment"][1], "model": "sentiment", "top_k": 2})
    assert bars(browser) == [(e["label"], f"{100 * e['score']:.1f}%") for e in expected]
    rows = browser.find_elements(By.CSS_SELECTOR, "#result .bar-row")
    widths = [r.find_element(By.CLASS_NAME, "fill").value_of_css_property("width") for r in rows]
    assert float(widths[0].removesuffix("px")) >= float(widths[1].removesuffix("px"))
    screenshot(browser, "classification")
    assert console_errors(browser) == []


def test_pair_regression_shows_the_score(open_server, browser):
    open_page(browser, open_server.url)
    choose(browser, "similarity (pair)")
    run_and_wait(browser)
    expected = api(open_server, "/v1/pair", {"inputs": EXAMPLES["similarity"][0], "model": "similarity"})
    assert browser.find_element(By.CSS_SELECTOR, "#result .score").text == f"{expected['score']:.3f}"
    screenshot(browser, "pair")
    assert console_errors(browser) == []


def test_embedding_shows_cosine_similarities_and_the_vector(open_server, browser):
    served(open_server, "embeddings")
    open_page(browser, open_server.url)
    choose(browser, "embeddings (embedding)")
    assert browser.find_element(By.ID, "field-targets").get_attribute("value") == "\n".join(SIMILAR[1:])
    run_and_wait(browser)
    scores = api(open_server, "/v1/similarity", {"inputs": {"source": SIMILAR[0], "targets": SIMILAR[1:]},
                                                 "model": "embeddings"})
    assert bars(browser) == [(t, f"{s:.3f}") for t, s in zip(SIMILAR[1:], scores)]
    assert scores[0] > scores[1]  # the guitar is nearer an instrument than a chef's pasta
    screenshot(browser, "embedding")
    browser.find_element(By.ID, "run-extra").click()
    wait(browser, lambda d: "A vector of" in d.find_element(By.ID, "result").text)
    assert "A vector of 384 numbers, norm 1.000" in browser.find_element(By.ID, "result").text
    assert console_errors(browser) == []


def test_fill_mask_shows_the_apis_candidates_and_the_filled_sentence(open_server, browser):
    served(open_server, "masker")
    open_page(browser, open_server.url)
    choose(browser, "masker (fill-mask)")
    run_and_wait(browser)
    candidates = api(open_server, "/v1/fill-mask", {"inputs": EXAMPLES["masker"][0], "model": "masker", "top_k": 5})
    assert bars(browser) == [(c["token_str"], f"{100 * c['score']:.1f}%") for c in candidates]
    assert browser.find_element(By.CSS_SELECTOR, "#result .sequence").text == candidates[0]["sequence"]
    screenshot(browser, "fill-mask")
    assert console_errors(browser) == []


def test_multiple_choice_ranks_the_choices(open_server, browser):
    served(open_server, "chooser")
    open_page(browser, open_server.url)
    choose(browser, "chooser (multiple-choice)")
    run_and_wait(browser)
    ranked = api(open_server, "/v1/choice", {"inputs": CHOICE_EXAMPLE, "model": "chooser"})
    assert bars(browser) == [(r["choice"], f"{100 * r['score']:.1f}%") for r in ranked]
    screenshot(browser, "multiple-choice")
    assert console_errors(browser) == []


def test_rerank_shows_the_ranking_with_scores_as_bars(open_server, browser):
    served(open_server, "ranker")
    open_page(browser, open_server.url)
    choose(browser, "ranker (rerank)")
    assert (browser.find_element(By.ID, "field-documents").get_attribute("value")
            == "\n".join(RERANK_EXAMPLE["documents"]))
    run_and_wait(browser)
    response = httpx.post(open_server.url + "/v1/rerank", json={**RERANK_EXAMPLE, "model": "ranker"}, timeout=60)
    assert response.status_code == 200, response.text
    ranked = response.json()["results"]
    documents = RERANK_EXAMPLE["documents"]
    assert bars(browser) == [(f"{r['index'] + 1}. {documents[r['index']]}", f"{r['relevance_score']:.3f}")
                             for r in ranked]
    assert ranked[0]["index"] == 1  # the Lisbon document
    rows = browser.find_elements(By.CSS_SELECTOR, "#result .bar-row")
    widths = [float(r.find_element(By.CLASS_NAME, "fill").value_of_css_property("width").removesuffix("px"))
              for r in rows]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
    screenshot(browser, "rerank")
    assert console_errors(browser) == []


def test_an_api_error_is_shown_with_its_message(open_server, browser):
    open_page(browser, open_server.url)
    choose(browser, "sentiment (classification)")
    browser.find_element(By.ID, "field-text").clear()
    browser.find_element(By.ID, "run").click()
    error = wait(browser, ec.visibility_of_element_located((By.ID, "error")))
    refused = httpx.post(open_server.url + "/v1/classify", json={"inputs": "", "model": "sentiment", "top_k": 2})
    assert refused.status_code == 422
    assert error.text == f"Error 422 (validation): {refused.json()['error']}"
    assert browser.find_element(By.ID, "result").text == ""
    assert all("422" in message for message in console_errors(browser))  # only the refused request's own line


def test_with_an_api_key_the_page_asks_for_it_and_shows_the_401_message(server, browser):
    open_page(browser, server.url)
    key = wait(browser, ec.visibility_of_element_located((By.ID, "api-key")))
    assert browser.switch_to.active_element == key
    key.send_keys("not-the-key", Keys.ENTER)
    error = wait(browser, ec.visibility_of_element_located((By.ID, "error")))
    refused = httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer not-the-key"})
    assert refused.status_code == 401
    assert error.text == f"Error 401 (unauthorized): {refused.json()['error']}"

    browser.find_element(By.ID, "api-key").send_keys(API_KEY, Keys.ENTER)
    wait(browser, ec.visibility_of_element_located((By.ID, "task-form")))
    assert not browser.find_element(By.ID, "error").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('berth-api-key')") == API_KEY
    assert browser.execute_script("return localStorage.length") == 0
    choose(browser, "sentiment (classification)")
    browser.find_element(By.ID, "field-text").send_keys("A gorgeous, witty, seductive movie.")
    run_and_wait(browser)  # the key is sent as a Bearer token
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result .bar-row")) == 2


def test_playground_false_turns_the_page_off(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "off.log", env={"BERTH_PLAYGROUND": "false"},
                         args=["--model", "sentiment", "--no-warmup"])
    try:
        proc.wait_ready()
        for path in ("/", "/playground/playground.js"):
            response = httpx.get(proc.url + path)
            assert response.status_code == 404 and response.json()["error_type"] == "not_found"
        assert httpx.get(proc.url + "/v1/models").status_code == 200
    finally:
        proc.stop()
