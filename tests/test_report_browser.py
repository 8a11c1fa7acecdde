"""The report and the gateway inspector in a real browser (headless Chromium from Debian,
driven by selenium): no console errors (CSP violations included), charts drawn at their size,
sortable envelope tables, live refresh, and hostile markup in facts shown as text, never run.
Screenshots go to each test's tmp_path, or to `--screenshots DIR` (`pytest
tests/test_report_browser.py --screenshots bench/results` takes the pictures docs/guide.md
shows), so that a test run never rewrites files of the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import chrome, console_errors, full_page_screenshot, missing
from tests.test_gateway_ui import run_windows
from tests.ui_fixtures import MARKUP

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")
pytest_plugins = ["tests.ui_fixtures"]



@pytest.fixture
def shots(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where screenshots go: `--screenshots DIR`, else the test's own temporary directory."""
    chosen = request.config.getoption("--screenshots")
    out = Path(chosen) if chosen else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


def wait_for(driver, condition, timeout: float = 30.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def column(driver, table, index: int) -> list[float]:
    return driver.execute_script(
        "return Array.from(arguments[0].tBodies[0].rows).map("
        "r => parseFloat(r.children[arguments[1]].getAttribute('data-v')))", table, index)


def check_charts(driver) -> int:
    sizes = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart')).map(s => {"
        "const r = s.getBoundingClientRect();"
        "return [r.width, r.height, s.querySelectorAll('polyline, circle, rect.bar').length,"
        "        parseFloat(s.getAttribute('width')), parseFloat(s.getAttribute('height'))]; })")
    assert sizes, "no charts"
    for width, height, _marks, w_attr, h_attr in sizes:
        assert (width, height) == (w_attr, h_attr) and width >= 240 and height >= 150
    drawn = [marks for _, _, marks, _, _ in sizes]
    assert sum(1 for m in drawn if m > 0) >= len(sizes) - 1  # a run may have no guard bars
    return len(sizes)


def test_static_report_in_chromium(hostile_traces, tmp_path, shots):
    from cdr.report import write_report

    out = write_report([hostile_traces["cdr"], hostile_traces["relevance"]],
                       tmp_path / "run.html")
    with chrome() as d:
        d.get(out.as_uri())
        wait_for(d, lambda d: d.execute_script("return document.readyState") == "complete")
        assert console_errors(d) == []
        assert check_charts(d) >= 8
        from selenium.webdriver.common.by import By

        table = d.find_elements(By.CSS_SELECTOR, "table.env")[1]
        score_th = table.find_elements(By.CSS_SELECTOR, "th")[6]
        assert score_th.text == "score"
        original = column(d, table, 6)
        d.execute_script("arguments[0].scrollIntoView()", score_th)
        score_th.click()
        assert column(d, table, 6) == sorted(original)
        assert score_th.get_attribute("aria-sort") == "ascending"
        score_th.click()
        assert column(d, table, 6) == sorted(original, reverse=True)
        # The fact's script is on the page as text, and never ran.
        text = d.find_element(By.TAG_NAME, "body").text
        assert any(m in text for m in MARKUP)
        assert d.execute_script("return window.__pwned === undefined")
        assert console_errors(d) == []
        d.execute_script("window.scrollTo(0, 0)")
        full_page_screenshot(d, shots / "report.png", max_height=2400)
    assert (shots / "report.png").stat().st_size > 20_000


def test_gateway_inspector_refreshes_live(ui_dev_gateway, shots):
    ui_gateway = ui_dev_gateway  # a browser navigation sends no API key: dev mode
    from selenium.webdriver.common.by import By

    with ui_gateway.client() as client:
        sid, tokens = run_windows(client, 1)
        with chrome() as d:
            d.get(f"{ui_gateway.url}/ui/sessions/{sid}#token={tokens[-1]}")
            wait_for(d, lambda d: d.find_elements(By.ID, "w1"))
            # The credential left the address bar (kept in the tab's sessionStorage).
            assert d.execute_script("return window.location.hash") == ""
            assert "live, 1 windows" in d.find_element(By.ID, "live").text
            env = client.post(f"/v1/sessions/{sid}/envelope",
                              headers={"CRP-Session": tokens[-1]}).json()
            client.post(f"/v1/sessions/{sid}/windows", headers={"CRP-Session": env["token"]},
                        json={"text": "The raise statement raises an exception. <script>"
                                      "window.__pwned = 7</script>", "etag": env["etag"]}
                        ).raise_for_status()
            wait_for(d, lambda d: d.find_elements(By.ID, "w2"))
            body = d.find_element(By.TAG_NAME, "body").text
            assert "<script>window.__pwned = 7</script>" in body
            assert d.execute_script("return window.__pwned === undefined")
            assert check_charts(d) >= 5
            assert console_errors(d) == []
            full_page_screenshot(d, shots / "inspector.png", max_height=2400)
    assert (shots / "inspector.png").stat().st_size > 20_000


def test_admin_session_list(ui_dev_gateway, shots):
    from selenium.webdriver.common.by import By

    with ui_dev_gateway.client() as client:
        sid, _ = run_windows(client, 1)
    with chrome(1200, 700) as d:
        d.get(f"{ui_dev_gateway.url}/ui/")
        wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "#sessions tr"))
        link = d.find_element(By.LINK_TEXT, sid)
        assert link.get_attribute("href").endswith(f"/ui/sessions/{sid}")
        assert console_errors(d) == []
        d.save_screenshot(str(shots / "inspector-list.png"))
        link.click()
        wait_for(d, lambda d: d.find_elements(By.ID, "w1"))
        assert console_errors(d) == []
