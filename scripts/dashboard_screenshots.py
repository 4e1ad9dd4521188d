"""The screenshots of docs/dashboard.md, taken again: `python scripts/dashboard_screenshots.py`.

Seeds a temporary SQLite file with the records of the dashboard's tests (tests/dashboard/seed.py),
serves the dashboard with a recording stand-in for the actions (so the buttons show and a refusal
can be staged), and has headless Chromium (Debian's chromium and chromium-driver) photograph
each page into docs/images/. pngquant, when installed, makes the files about three times smaller.
Run from the repository root with the test extra installed.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from choreography_ray.dashboard import ActionRefused, create_app  # noqa: E402
from choreography_ray.storage import open_storage  # noqa: E402
from tests.dashboard.client import TOKEN, RecordingActions  # noqa: E402
from tests.dashboard.seed import RUNNING_JOB, SCOPE, seed  # noqa: E402
from tests.support import free_port  # noqa: E402

IMAGES = ROOT / "docs" / "images"
WIDTH = 1200
#: The tallest a screenshot gets, in pixels (a long page is cut).
MAX_HEIGHT = 950


def shoot(browser: webdriver.Chrome, name: str) -> None:
    browser.set_window_size(WIDTH, 300)  # so the page's height is its content's
    height, chrome = browser.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    browser.set_window_size(WIDTH, min(int(height), MAX_HEIGHT) + int(chrome))
    time.sleep(0.3)
    path = IMAGES / f"{name}.png"
    browser.save_screenshot(str(path))
    if shutil.which("pngquant"):
        subprocess.run(["pngquant", "--force", "--skip-if-larger", "--output", str(path), "64",
                        str(path)], check=False)  # fmt: skip
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KiB")


def main() -> None:
    scratch = Path(tempfile.mkdtemp())
    url = f"sqlite:///{scratch / 'jobs.db'}"

    async def prepare() -> None:
        storage = open_storage(url)
        await seed(storage)
        await storage.close()

    asyncio.run(prepare())
    actions = RecordingActions()
    actions.refuse["retry-failed"] = ActionRefused(
        "NotSupported", "the job type does not allow retrying failed steps, or the job has stages"
    )
    app = create_app(open_storage(url), token=TOKEN, actions=actions,
                     allowed_hosts=["127.0.0.1"])  # fmt: skip
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                     f"--window-size={WIDTH},900"):  # fmt: skip
        options.add_argument(argument)
    service = Service(executable_path=shutil.which("chromedriver") or "chromedriver")
    browser = webdriver.Chrome(service=service, options=options)
    try:
        browser.get(f"{base}/login?token={TOKEN}")
        browser.get(f"{base}/")
        shoot(browser, "dashboard-jobs")
        browser.get(f"{base}/jobs/{RUNNING_JOB}")
        shoot(browser, "dashboard-job")
        browser.get(f"{base}/jobs/{RUNNING_JOB}/stop")
        shoot(browser, "dashboard-confirm")
        browser.get(f"{base}/jobs/job-with-failures/retry-failed")
        browser.find_element(By.CSS_SELECTOR, "button#confirm").click()
        shoot(browser, "dashboard-refused")
        browser.get(f"{base}/schedules?scope={SCOPE}")
        shoot(browser, "dashboard-schedules")
        browser.get(f"{base}/schedules/dead-letters?scope={SCOPE}")
        shoot(browser, "dashboard-dead-letters")
    finally:
        browser.quit()
        server.should_exit = True
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
