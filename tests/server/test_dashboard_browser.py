"""``GET /dashboard``: the page and its headers (fast, torch-free engine), then the page itself
in real headless Chromium against the real server (default model, API keys): the 401 error
line, the key from the input field, ``?key=`` and ``sessionStorage``, live hit rates, the
divergence row of a dynamic-field workload, a chart with drawn data, a clean console, and the
screenshot (in the test's tmp dir; with ``HERMES_UPDATE_SCREENSHOT=1`` also over
``docs/dashboard.png``, the one the README links, so that a plain test run leaves the tree clean).

The browser test fails (never skips) without ``/usr/bin/chromium`` and
``/usr/bin/chromedriver``: ``.ci/run`` installs them (Debian: ``apt-get install chromium
chromium-driver``).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import re
import time
from pathlib import Path

import pytest

from hermes_async.config import CacheConfig, EngineConfig, ServerConfig
from hermes_async.engine.async_engine import AsyncEngine
from tests.engine.fake_runner import EOS, FakeRunner, fake_output_text
from tests.server.helpers import ServerThread, real_config, request, request_json

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
README_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"
KEY = "sk-dashboard"
TENANT = "acme"
AUTH = {"Authorization": f"Bearer {KEY}"}
# ~600 tokens of fixed system prompt, shared by every request of the workload.
SYSTEM = "You are the support assistant of the Hermes inference service. " + " ".join(
    f"Rule {i}: when a customer asks about topic {i}, answer politely, precisely and briefly, "
    f"and never invent facts." for i in range(1, 23))
QUESTIONS = ["What is a KV cache?", "How do I rotate my API key?", "Why is my request slow?",
             "What does prefix caching save?", "Can I stream tokens?", "What is a namespace?",
             "How many tokens fit in the context?", "Which models do you serve?"]


# ----- the page and its headers (no model) ------------------------------------------------------
@pytest.fixture(scope="module")
def fake_srv():
    cfg = EngineConfig(cache=CacheConfig(block_size=4),
                       server=ServerConfig(served_model_name="fake", api_keys={KEY: TENANT}))

    def make() -> AsyncEngine:
        return AsyncEngine(cfg, runner=FakeRunner(), tokenizer=object(), eos_token_ids=[EOS],
                           output_text=fake_output_text)

    srv = ServerThread(cfg, make).start(wait_ready=False)  # the page never needs the engine
    yield srv
    srv.stop()


def test_dashboard_page_is_self_contained_with_a_strict_csp(fake_srv):
    status, headers, body = request(f"{fake_srv.url}/dashboard")  # no key needed for the page
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    html = body.decode()
    assert html.startswith("<!doctype html>")
    # nothing from elsewhere: no absolute or protocol-relative URL in any attribute or CSS url()
    assert not re.search(r"""(?:src|href|action|srcset)\s*=\s*["']?\s*(?:[a-z][\w+.-]*:)?//""",
                         html, re.I)
    assert not re.search(r"https?://", html, re.I)
    assert not re.search(r"url\(\s*['\"]?\s*(?:https?:)?//|@import", html, re.I)
    # the DOM hooks the browser test (and anyone scripting the page) reads
    for hook in ('id="latest"', 'id="chart"', 'data-points=', 'id="divergence-table"',
                 'id="error"', 'id="namespace"', 'id="key"', 'id="disk-hit-rate"'):
        assert hook in html

    csp = dict(d.strip().split(" ", 1) for d in headers["Content-Security-Policy"].split(";"))
    assert csp["default-src"] == "'self'"
    assert csp["connect-src"] == "'self'"
    assert csp["style-src"] == "'unsafe-inline'"
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(scripts) == 1 and "<script src" not in html
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert csp["script-src"] == f"'sha256-{digest}'"  # that script only: no unsafe-inline/eval
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"  # ?key= never leaks through a Referer
    assert request(f"{fake_srv.url}/dashboard", method="HEAD")[0] == 200


# ----- the page in headless Chromium against the real server ------------------------------------
@pytest.fixture(scope="module")
def srv(default_model_dir, tmp_path_factory):
    cfg = real_config(default_model_dir, server={"api_keys": {KEY: TENANT}})
    disk = tmp_path_factory.mktemp("dashboard-kv")  # the disk tier's card shows a hit rate
    cfg = dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, disk_dir=str(disk)))
    s = ServerThread(cfg).start()
    yield s
    s.stop()


@pytest.fixture
def driver(tmp_path):
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(f"the dashboard test needs {CHROMIUM} and {CHROMEDRIVER}: "
                    "apt-get install chromium chromium-driver (.ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield d
    d.quit()


def chat(srv, system: str, question: str) -> dict:
    status, _, body = request_json(f"{srv.url}/v1/chat/completions", {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2, "temperature": 0}, headers=AUTH)
    assert status == 200, body
    return body["usage"]


def send_workload(srv) -> None:
    """The long system prompt behind a per-request timestamp line (a dynamic field: no prefix
    hits, a divergence row), then the same prompt without it (prefix hits) and one repeated
    messages list (an assembly hit). The hits come last so that they are in the one-minute
    window however slow the machine is (only the first of them prefills the whole prompt)."""
    for n, q in enumerate(QUESTIONS):
        chat(srv, f"Current time: 2026-11-29T20:31:0{n}.123Z\n{SYSTEM}", q)
    for q in QUESTIONS:
        chat(srv, SYSTEM, q)
    assert chat(srv, SYSTEM, QUESTIONS[0])["prompt_tokens_details"]["cached_tokens"] > 0

    def evict() -> None:  # the system prompt leaves the pool for the disk tier
        cache = srv.engine.core.cache
        cache.evict(cache.pool.num_blocks)
        assert cache.disk.tier.flush(30)

    srv.call(evict)
    assert chat(srv, SYSTEM, QUESTIONS[1])["prompt_tokens_details"]["cached_tokens"] > 0


def figure(driver, name: str) -> float:
    value = driver.find_element("id", "latest").get_attribute(f"data-{name}")
    return float(value) if value else 0.0


def polls(driver) -> int:
    return int(driver.find_element("id", "latest").get_attribute("data-polls"))


def error_line(driver) -> str:
    el = driver.find_element("id", "error")
    return el.text if el.is_displayed() else ""


def page_state(driver) -> dict:
    """What the page shows (for failure messages)."""
    return driver.execute_script("""
        const latest = {...document.getElementById("latest").dataset};
        return {latest, error: document.getElementById("error").textContent,
                divergences: document.querySelectorAll("#divergence-table tbody tr").length,
                points: document.getElementById("chart").dataset.points};""")


def severe(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["level"] == "SEVERE"]


# Pixels of each series' colour on the canvas (the chart really has drawn data).
COUNT_COLOURS = """
const c = document.getElementById("chart");
const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
const want = {prefix: [37, 99, 235], assembly: [234, 88, 12], matched: [5, 150, 105]};
const out = {prefix: 0, assembly: 0, matched: 0};
for (let i = 0; i < data.length; i += 4) {
  for (const [k, [r, g, b]] of Object.entries(want)) {
    if (Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 30
        && data[i + 3] > 200) out[k] += 1;
  }
}
return out;
"""


@pytest.mark.slow
def test_dashboard_in_chromium(srv, driver, tmp_path):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = f"{srv.url}/dashboard?interval=0.5"
    wait = WebDriverWait(driver, 20, poll_frequency=0.2)

    # without a key: the error line shows the status and the API's own message
    driver.get(page)
    wait.until(lambda d: "401" in error_line(d))
    assert "API key" in error_line(driver) and polls(driver) == 0
    unexpected = [e for e in severe(driver.get_log("browser"))  # the 401s themselves only
                  if not ("/cache/stats" in e["message"] and "401" in e["message"])]
    assert unexpected == []

    # the key from the input field: polls succeed, the error line goes away
    driver.find_element(By.ID, "key").send_keys(KEY)
    driver.find_element(By.ID, "key-save").click()
    wait.until(lambda d: polls(d) > 0 and not error_line(d))

    started = time.monotonic()
    send_workload(srv)
    workload_s = time.monotonic() - started

    def ready(d) -> bool:
        rows = d.find_elements(By.CSS_SELECTOR, "#divergence-table tbody tr")
        return (figure(d, "prefix-hit-rate") > 0 and figure(d, "assembly-hit-rate") > 0
                and figure(d, "mean-matched-len") > 0 and figure(d, "disk-hit-rate") > 0
                and len(rows) > 0)

    try:
        wait.until(ready)
    except TimeoutException:
        pytest.fail("the page never showed hit rates and a divergence row: "
                    f"{page_state(driver)}; /cache/stats: "
                    f"{request_json(f'{srv.url}/cache/stats', headers=AUTH)[2]}")
    assert 0 < figure(driver, "prefix-hit-rate") <= 1
    assert 0 < figure(driver, "assembly-hit-rate") <= 1
    assert driver.find_element(By.ID, "prefix-hit-rate").text.endswith("%")
    assert 0 < figure(driver, "disk-hit-rate") < figure(driver, "prefix-hit-rate")
    assert driver.find_element(By.ID, "disk-hit-rate").text.endswith("%")
    assert "on disk" in driver.find_element(By.ID, "disk-detail").text
    row = driver.find_element(By.CSS_SELECTOR, "#divergence-table tbody tr")
    cells = row.find_elements(By.TAG_NAME, "td")
    assert cells[0].text == TENANT
    assert int(cells[2].text.replace(",", "")) >= 2  # requests
    assert int(cells[3].text.replace(",", "")) > 0   # tokens lost
    assert "Current time: 2026-11-29T20:31:0" in cells[4].get_attribute("title")  # before
    assert cells[5].find_element(By.TAG_NAME, "mark").text  # this span
    assert cells[6].find_element(By.TAG_NAME, "mark").text  # other span

    # the chart: points recorded by the page and pixels of all three series on the canvas
    wait.until(lambda d: int(d.find_element(By.ID, "chart").get_attribute("data-points")) >= 9)
    coloured = driver.execute_script(COUNT_COLOURS)
    assert min(coloured.values()) > 20, coloured

    # one namespace instead of all of them
    driver.find_element(By.CSS_SELECTOR, f"#namespace option[value='{TENANT}']").click()
    wait.until(lambda d: d.find_element(By.ID, "latest").get_attribute("data-namespace")
               == TENANT)
    assert figure(driver, "prefix-hit-rate") > 0
    driver.find_element(By.CSS_SELECTOR, "#namespace option[value='']").click()
    driver.execute_script("document.activeElement.blur()")

    # the screenshot the README links: the whole page
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 1400, "height": height, "deviceScaleFactor": 1, "mobile": False})
    time.sleep(1.2)  # two more polls at the new size
    shot = tmp_path / "dashboard.png"
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("HERMES_UPDATE_SCREENSHOT") == "1":
        README_SCREENSHOT.write_bytes(shot.read_bytes())

    # the key survives a reload (sessionStorage); ?key= sets it and leaves the address bar
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    driver.refresh()
    wait.until(lambda d: polls(d) > 0 and not error_line(d))
    assert severe(driver.get_log("browser")) == []  # no JS error, CSP violation or failed poll
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{page}&key={KEY}")
    wait.until(lambda d: polls(d) > 0 and not error_line(d))
    assert "key=" not in driver.current_url
    assert driver.execute_script("return sessionStorage.length") == 1
    # the old page may poll once without a key between the clear and the navigation (a CI run
    # under load saw one 401); the new page's own polls succeed (the wait above)
    assert [e for e in severe(driver.get_log("browser"))
            if not ("/cache/stats" in e["message"] and "401" in e["message"])] == []
    print(f"workload {workload_s:.1f} s, whole test {time.monotonic() - started:.1f} s "
          "after the workload began")
