"""Render an HTML file headless with Debian's chromium and save a screenshot (checks the report opens).

`find_chromium(install=True)` runs `apt-get install -y chromium` only when no browser is on PATH and
we are root; it returns None with the reason when none can be had, so callers can skip clearly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_chromium(install: bool = False) -> tuple[str | None, str]:
    """(path of a chromium binary or None, reason)."""
    for name in BROWSERS:
        if path := shutil.which(name):
            return path, f"found {path}"
    if not install:
        return None, "no chromium on PATH"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "no chromium on PATH and apt-get is unavailable (not root or not Debian)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(
        ["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        return None, f"apt-get install chromium failed: {result.stderr.strip()[-500:]}"
    path = shutil.which("chromium")
    return path, "installed chromium with apt-get" if path else "apt-get succeeded but no chromium on PATH"


def screenshot(
    browser: str, html: str | os.PathLike, out_png: str | os.PathLike, size: tuple[int, int] = (1400, 1000)
) -> Path:
    """Open `html` headless (JS runs for up to 10 s of virtual time) and write a PNG screenshot."""
    html = Path(html).resolve()
    if not html.exists():
        raise FileNotFoundError(f"{html}: no such report")
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    # chromium picks the image type from the suffix: the temporary name must end in .png
    tmp = out_png.with_name(f".{out_png.stem}.{os.getpid()}.partial.png")
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",  # root inside a container: the sandbox needs user namespaces
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={size[0]},{size[1]}",
        "--virtual-time-budget=10000",  # the report is a JS app: let it render before the shot
        f"--screenshot={tmp}",
        html.as_uri(),
    ]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        if result.returncode != 0 or not tmp.exists():
            raise RuntimeError(f"{browser} could not render {html}: {result.stderr.strip()[-1000:]}")
        os.replace(tmp, out_png)
    finally:
        tmp.unlink(missing_ok=True)
    return out_png
