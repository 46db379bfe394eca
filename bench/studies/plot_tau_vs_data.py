"""τ against data: the served τ of the data-curve variants of `recipe_sweep.py` reports, as a JSON and a plot.

    python bench/studies/plot_tau_vs_data.py bench/results/recipe-curve-*.json --out docs/tau-vs-data

A variant named `<series>-<percent>` (e.g. `regen-50`, `dataset-25`, bench/studies/recipe_curve.json) is the
point (percent of the training conversations, served τ at each k) of its series. Writes OUT.json (the
points, with training samples, simulated τ, the held-out walked τ at each served k and the reports they
came from) and OUT.png (one panel per k, the share on a log axis; the walked τ dashed beside the served one).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from eyas.core.acceptance import at_chain_length
from eyas.core.atomic import atomic_file


def points(reports: list[Path]) -> list[dict]:
    """One point per served variant of every report; variants without a served τ are skipped by name."""
    found = []
    for path in reports:
        report = json.loads(path.read_text())
        for name, figures in report["variants"].items():
            series, _, percent = name.rpartition("-")
            if not series or not percent.isdigit():
                raise ValueError(f"{path}: variant {name!r} is not named <series>-<percent>")
            if not figures.get("served_tau"):
                print(
                    f"{path}: {name}: no served tau (status {report.get('status')!r}), left out",
                    file=sys.stderr,
                )
                continue
            found.append(
                {
                    "series": series,
                    "percent": int(percent),
                    "samples": (figures.get("stats") or {}).get("samples"),
                    "served_tau": {str(k): tau for k, tau in figures["served_tau"].items()},
                    "best_sim_tau": figures.get("best_sim_tau"),
                    "walked_tau": {
                        str(k): at_chain_length(figures.get("best_walked_tau_by_k"), int(k))
                        for k in figures["served_tau"]
                    },
                    "train_seconds": figures.get("train_seconds"),
                    "report": str(path),
                }
            )
    return sorted(found, key=lambda p: (p["series"], p["percent"]))


def plot(found: list[dict], out_png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ks = sorted({k for p in found for k in p["served_tau"]}, key=int)
    fig = Figure(figsize=(4.5 * len(ks), 3.6))
    FigureCanvasAgg(fig)
    for i, k in enumerate(ks):
        ax = fig.add_subplot(1, len(ks), i + 1)
        for series in sorted({p["series"] for p in found}):
            pts = [p for p in found if p["series"] == series and k in p["served_tau"]]
            (line,) = ax.plot(
                [p["percent"] for p in pts], [p["served_tau"][k] for p in pts], marker="o", label=series
            )
            walked = [(p["percent"], p["walked_tau"][k]) for p in pts if p["walked_tau"].get(k) is not None]
            if walked:
                ax.plot(*zip(*walked, strict=True), ls="--", marker=".", color=line.get_color(),
                        label=f"{series} (walked, offline)")  # fmt: skip
        # doublings equally spaced: the field reads τ against data on a log axis (+~0.3 per 10x of
        # training data, speculators' Qwen3-8B figures)
        ax.set_xscale("log", base=2)
        percents = sorted({p["percent"] for p in found})
        ax.set_xticks(percents, [str(p) for p in percents])
        ax.minorticks_off()
        ax.set_title(f"served τ, k = {k}")
        ax.set_xlabel("% of training conversations (log scale)")
        ax.set_ylabel("τ (tokens per verify pass)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_file(out_png, "wb") as fh:
        fig.savefig(fh, format="png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", type=Path, help="recipe_sweep.py JSON reports")
    ap.add_argument("--out", required=True, type=Path, help="output path without suffix")
    args = ap.parse_args()
    found = points(args.reports)
    if not found:
        raise SystemExit("no variant with a served tau in " + ", ".join(map(str, args.reports)))
    payload = {"command": shlex.join([sys.executable, *sys.argv]), "points": found}
    with atomic_file(args.out.with_suffix(".json")) as fh:
        fh.write(json.dumps(payload, indent=2) + "\n")
    plot(found, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
