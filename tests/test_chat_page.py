"""The chat page of `specgguf serve` in a real browser (Debian's chromium and
chromedriver, driven by selenium): it asks for the key, streams an answer,
and colours each piece by where its tokens came from, as the server's
sources say. A screenshot is saved (to $SPECGGUF_SCREENSHOTS when set)."""

import os
import shutil
import time

import httpx
import pytest

pytest.importorskip("llama_cpp")
webdriver = pytest.importorskip("selenium.webdriver")

from tests.conftest import PROMPTS  # noqa: E402
from tests.test_server import KEY, Served  # noqa: E402

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    if os.environ.get("CI"):
        raise RuntimeError("the chat page's browser test needs chromium and chromium-driver (.ci/run installs "
                           "them: apt-get install chromium chromium-driver)")
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
                allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def served(session_state):
    s = Served("-k", "4")  # a fixed K: the page's answer drafts, whatever this machine's costs
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,800",
                "--disable-gpu", "--no-first-run"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def spans(browser):
    return [(e.get_attribute("class").split()[-1], e.get_attribute("data-sources").split(","),
             e.get_attribute("textContent"))
            for e in browser.find_elements(By.CSS_SELECTOR, ".msg.assistant:last-of-type .tok")]


def test_the_page_streams_a_chat_and_colours_the_drafts_tokens(served, browser, tmp_path):
    page = httpx.get(served.url + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "connect-src 'self'" in page.headers["content-security-policy"]  # it talks to nothing else
    browser.get(served.url + "/")
    wait = WebDriverWait(browser, 120)
    wait.until(lambda b: b.find_element(By.ID, "keybox").is_displayed())  # the server has a key: it asks
    browser.find_element(By.ID, "key").send_keys("wrong")
    browser.find_element(By.ID, "keysave").click()
    wait.until(lambda b: "refused" in b.find_element(By.ID, "keyerror").text)
    key = browser.find_element(By.ID, "key")
    key.clear()
    key.send_keys(KEY)
    browser.find_element(By.ID, "keysave").click()
    wait.until(lambda b: b.find_element(By.ID, "model").text == "smollm2-135m-f32")
    assert not browser.find_element(By.ID, "keybox").is_displayed()

    for field, value in (("temp", "0"), ("max", "48")):
        box = browser.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    browser.find_element(By.ID, "prompt").send_keys(PROMPTS[0])
    browser.find_element(By.ID, "send").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-state=done]"))
    answer = browser.find_element(By.CSS_SELECTOR, ".msg.assistant")
    assert not answer.find_elements(By.CSS_SELECTOR, ".error"), answer.text
    got = spans(browser)
    sources = [s for _, src, _ in got for s in src]
    # Each span's colour is what its tokens' sources say; the draft's tokens are the accepted ones.
    for kind, src, _ in got:
        assert kind == (src[0] if len(set(src)) == 1 else "mixed")
    assert answer.get_attribute("data-finish") == "length" and len(sources) == 48
    assert len(sources) - sources.count("target") == int(answer.get_attribute("data-accepted")) > 0
    assert any(kind == "draft" for kind, _, _ in got) and any(kind == "target" for kind, _, _ in got)
    # The text is the server's greedy answer, token for token.
    whole = httpx.post(served.url + "/v1/chat/completions", headers=served.headers, timeout=120,
                       json={"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 48,
                             "temperature": 0}).json()
    assert "".join(text for _, _, text in got) == whole["choices"][0]["message"]["content"]
    stats = browser.find_element(By.ID, "stats").text
    assert "draft tokens" in stats and f"/{len(sources)}" in stats and "acceptance" in stats
    # Nothing was fetched from anywhere but this server.
    origins = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(u.startswith(served.url) for u in origins), origins

    out = os.environ.get("SPECGGUF_SCREENSHOTS") or str(tmp_path)
    os.makedirs(out, exist_ok=True)
    shot = os.path.join(out, "chat_page.png")
    time.sleep(0.2)
    assert browser.save_screenshot(shot) and os.path.getsize(shot) > 10_000


def test_the_page_shows_a_call_and_sends_its_result_back(served, browser):
    from tests.test_tools import TOOLS
    import json
    browser.find_element(By.ID, "clear").click()
    browser.find_element(By.CSS_SELECTOR, "#toolsbox summary").click()
    browser.find_element(By.ID, "tools").send_keys(json.dumps(TOOLS))
    browser.find_element(By.CSS_SELECTOR, "#toolchoice option[value=required]").click()
    browser.find_element(By.ID, "prompt").send_keys("Turn off the light in the kitchen.")
    browser.find_element(By.ID, "send").click()
    wait = WebDriverWait(browser, 120)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".call input"))
    call = browser.find_element(By.CSS_SELECTOR, ".call")
    assert "calls set_light(" in call.text and '"kitchen"' in call.text
    assert browser.find_element(By.CSS_SELECTOR, ".msg.assistant").get_attribute("data-finish") == "tool_calls"
    browser.find_element(By.CSS_SELECTOR, "#toolchoice option[value=none]").click()
    call.find_element(By.TAG_NAME, "input").send_keys('{"ok": true}')
    call.find_element(By.TAG_NAME, "button").click()
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-state=done]")) == 2)
    assert browser.find_element(By.CSS_SELECTOR, ".msg.tool").text.endswith('{"ok": true}')
    last = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    assert not last.find_elements(By.CSS_SELECTOR, ".error"), last.text
    assert last.get_attribute("data-finish") in ("stop", "length") and spans(browser)
