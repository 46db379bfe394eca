"""Build the Snakemake report of a finished run and screenshot it headless with Debian's chromium.

    .venv/bin/python bench/studies/report_screenshot.py --workdir . --out docs/report.png

runs `snakemake -d WORKDIR [--configfile C] --report WORKDIR/results/report.html`, checks the HTML
holds every report item (tables and plots), opens it in headless chromium (installed with apt-get if
missing and root) and writes the PNG. Prints the commands it ran.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
from render import find_chromium, screenshot  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
REPORT_ITEMS = ("summary.json", "acceptance.png", "tau.png", "tau_table.tsv", "loss.png", "throughput.png")


def build_report(workdir: Path, configfile: str | None) -> Path:
    html = workdir / "results" / "report.html"
    cmd = [sys.executable, "-m", "snakemake", "-d", str(workdir), "--report", str(html)]
    if configfile:
        cmd += ["--configfile", configfile]
    print("$", shlex.join(cmd), flush=True)
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"snakemake --report failed:\n{(result.stdout + result.stderr)[-4000:]}")
    text = html.read_text(errors="replace")
    missing = [item for item in REPORT_ITEMS if item not in text]
    if missing:
        raise SystemExit(f"{html}: report lacks {missing}")
    print(f"{html}: {html.stat().st_size / 1e6:.1f} MB, all of {list(REPORT_ITEMS)} present")
    return html


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, default=REPO, help="the run's working dir (holds results/)")
    parser.add_argument("--configfile", default=None, help="the run's config file, if not the default")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "report.png")
    args = parser.parse_args()
    html = build_report(args.workdir.resolve(), args.configfile)
    browser, why = find_chromium(install=True)
    if browser is None:
        raise SystemExit(f"cannot screenshot: {why}")
    print(f"browser: {why}")
    png = screenshot(browser, html, args.out)
    print(f"screenshot: {png} ({png.stat().st_size} bytes)")
    print("command:", shlex.join([sys.executable, *sys.argv]))


if __name__ == "__main__":
    main()
