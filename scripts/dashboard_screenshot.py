"""Regenerate docs/img/dashboard.png: run the demo for a while, then screenshot its page
in headless Chromium. Usage: .venv/bin/python scripts/dashboard_screenshot.py [seconds]"""

from __future__ import annotations

import shutil
import socket
import sys
import threading
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from evaluator.app.demo import demo_tree, run_demo
from evaluator.config import load_settings

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "dashboard.png"


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 90.0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = load_settings(environ={}, overrides=demo_tree({"http": {"port": port}}))
    stop = threading.Event()
    worker = threading.Thread(target=run_demo, args=(settings,), kwargs={"stop": stop})
    worker.start()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
    ):
        options.add_argument(flag)
    browser = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options
    )
    try:
        browser.get(f"http://127.0.0.1:{port}/")
        time.sleep(seconds)  # a picture, not a test: let the history accumulate
        browser.save_screenshot(str(OUT))
        print(OUT)
    finally:
        browser.quit()
        stop.set()
        worker.join()


if __name__ == "__main__":
    main()
