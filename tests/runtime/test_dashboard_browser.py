"""The dashboard in a real browser: headless Chromium driven by selenium, against the dashboard
served by uvicorn on loopback, its actions going to this cluster's jobs manager.

Chromium and its driver come from the Debian packages (`chromium`, `chromium-driver`; `.ci/run`
installs them). A missing browser skips locally and fails under `CI=true`. One browser serves
every test of the module; the job page's screenshot is written to the test's own folder.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import uvicorn

from choreography_ray.dashboard import RayActions, create_app
from choreography_ray.status import JobStatus
from choreography_ray.storage import open_storage
from tests.dashboard.client import TOKEN
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.support import RAY_NAMESPACE, eventually, free_port

#: One xdist worker runs the whole module: its module's browser and app.
pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("browser")]

#: Where Debian installs the browser and its driver.
CHROMIUM = ("chromium", "chromium-browser")
DRIVER = "chromedriver"
#: How long the browser waits for a page's element, in seconds.
WAIT_SECONDS = 30
#: About 20 s at 4 steps at a time: the bar has time to move, and the stop finds it running.
SLOW = FanOutRequest(count=400, sleep=0.2)


def missing_browser(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing_browser("selenium is not installed (pip install -e '.[test]')")
    chromium = next((found for name in CHROMIUM if (found := shutil.which(name))), None)
    driver_path = shutil.which(DRIVER)
    if chromium is None or driver_path is None:
        missing_browser("headless Chromium needs the Debian packages chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1100", "--disable-extensions"):  # fmt: skip
        options.add_argument(argument)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    except Exception as error:  # the driver's own error types say why it could not start
        missing_browser(f"Chromium did not start: {error}")
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def served(ray_cluster: None, storage_url: str) -> Iterator[str]:
    """The dashboard's base URL: uvicorn on a free loopback port, in a thread."""
    actions = RayActions(storage_url, ray_namespace=RAY_NAMESPACE)
    app = create_app(open_storage(storage_url), token=TOKEN, actions=actions,
                     allowed_hosts=["127.0.0.1"])  # fmt: skip
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    eventually(lambda: server.started, 20, "the dashboard to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


def wait_for(browser: Any, check: Any, what: str) -> Any:
    """What `check` returns once it is truthy; an element the live script swapped out under
    it (stale) or has not drawn yet is looked for again."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    wait = WebDriverWait(browser, WAIT_SECONDS, poll_frequency=0.1, ignored_exceptions=ignored)
    return wait.until(lambda _: check(), message=f"waiting for {what}")


def by_css(browser: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, selector)


def test_browser__filter_open_a_running_job_watch_it_advance_and_stop_it(
    browser: Any, served: str, connect: Any, scope: str, tmp_path: Path
) -> None:
    from selenium.webdriver.support.ui import Select

    manager = connect(max_active_steps_per_job=4).manager(scope, "browser")
    done_id = manager.start(FanOut, FanOutRequest(count=3)).job_id
    manager.wait(done_id, timeout=60)
    job_id = manager.start(FanOut, SLOW).job_id
    eventually(lambda: manager.get(job_id).status is JobStatus.RUNNING, 30, "the job to run")

    # The jobs page, filtered by status through its form.
    browser.get(f"{served}/login?token={TOKEN}")
    wait_for(browser, lambda: "log out" in browser.page_source, "the session")
    browser.get(f"{served}/")
    assert f'data-job="{done_id}"' in browser.page_source
    Select(by_css(browser, "select#status")).select_by_value("RUNNING")
    by_css(browser, "button#apply").click()
    wait_for(browser, lambda: "status=RUNNING" in browser.current_url, "the filtered list")
    rows = [row.get_attribute("data-job") for row in
            browser.find_elements("css selector", "tr[data-job]")]  # fmt: skip
    assert job_id in rows and done_id not in rows

    # The running job's page: its bar advances without a reload.
    by_css(browser, f'tr[data-job="{job_id}"] td.id a').click()
    wait_for(browser, lambda: browser.current_url.endswith(f"/jobs/{job_id}"), "the job page")
    browser.execute_script("window.notReloaded = true;")

    def done() -> int:
        return int(by_css(browser, "#overall svg.bar").get_attribute("data-done"))

    (first,) = wait_for(browser, lambda: (done(),), "the progress bar")
    wait_for(browser, lambda: done() > first + 8, "the progress bar to advance")
    assert browser.execute_script("return window.notReloaded === true;"), "the page reloaded"
    assert "steps/s" in by_css(browser, "#pace").text
    browser.save_screenshot(str(tmp_path / "job-page.png"))
    assert (tmp_path / "job-page.png").stat().st_size > 10_000

    # Stop it through the confirmation, and see STOPPED.
    by_css(browser, "#action-stop").click()
    wait_for(
        browser, lambda: browser.current_url.endswith(f"/jobs/{job_id}/stop"), "the confirmation"
    )
    assert "Stop job" in by_css(browser, "h1").text
    by_css(browser, "button#confirm").click()
    wait_for(browser, lambda: by_css(browser, "#job-status").text == "STOPPED", "STOPPED")
    assert "Stop of job" in by_css(browser, ".flash").text
    state = eventually(lambda: (s := manager.get(job_id)).stop_finalized and s, 30, "the stop")
    assert state.status is JobStatus.STOPPED and state.progress.stopped_steps > 0
    # The live part settles with the final stop: no more refreshes.
    wait_for(browser, lambda: by_css(browser, "#live").get_attribute("data-live") is None,
             "the live part to settle")  # fmt: skip
