"""`summary.json` and the acceptance plot: the trained drafter beside the untrained baseline and any
other configured drafters, on each evaluation set.

Inputs are the dicts of `evaluate_offline` and `evaluate_specdec` (see `build_summary`).
Both outputs are written atomically; the plot uses matplotlib's object API on an Agg canvas, so no
global backend or pyplot state is touched.
"""

from __future__ import annotations

import json
import math
import os

from eyas.core.acceptance import at_chain_length
from eyas.core.atomic import atomic_file
from eyas.evaluate.figures import new_figure, save_figure

SUMMARY_FORMAT = "eyas.summary/2"  # 2: per-set, per-drafter reports and the tau table
SPECDEC_FIELDS = (
    "tau",
    "temperature",
    "speedup",
    "spec_tokens_per_s",
    "greedy_tokens_per_s",
    "acceptance_by_position",
    "conditional_acceptance_by_position",
    "position_attempted",
    "position_accepted",
    "greedy_equal",
    "num_prompts",
    "max_new_tokens",
    "num_draft_tokens",
    "verify_passes",
    "generated_tokens",
)
OFFLINE_FIELDS = (
    "ttt_steps",
    "accuracy",
    "conditional_accuracy",
    "simulated_tau",
    "simulated_tau_by_k",
    "walked_tau_by_k",
    "count",
    "cond_count",
    "loss",
    "num_samples",
    "num_tokens",
)


def _pick(report: dict, fields: tuple[str, ...], name: str) -> dict:
    missing = [f for f in fields if f not in report]
    if missing:
        raise ValueError(f"write_summary: {name} lacks field(s) {missing}")
    return {f: report[f] for f in fields}


def json_safe(value):
    """JSON-safe copy: NaN/inf become None (json would write invalid `NaN`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def primary_set(specdec: dict) -> str:
    """The set the headline and the acceptance plot describe: `heldout` if evaluated, else the first."""
    return "heldout" if "heldout" in specdec else next(iter(specdec))


SERVED_ROW_FIELDS = (
    "tau",
    "tau_sglang",
    "tau_batched",
    "acceptance_by_position",
    "tokens_per_s_bs1",
    "speedup_bs1",
    "tokens_per_s_batched",
    "speedup_batched",
    "tau_by_origin",  # tau pooled by each prompt's input file (`eyas.evaluate.served.tau_by_origin`)
)


def served_section(served: dict) -> dict:
    """`summary["served"]`: the served run's engine, settings, speeds and one row per (set, drafter, k)
    with greedy-equality counts and each mismatch's position and margin."""
    table = [
        {"set": set_name, "drafter": drafter, "k": int(k)}
        | {f: report.get(f) for f in SERVED_ROW_FIELDS}
        | {
            "greedy_equal": report["greedy_equal"]["equal"],
            "prompts": report["greedy_equal"]["prompts"],
            "mismatches": report["greedy_equal"]["mismatches"],
        }
        for set_name, drafters in served["sets"].items()
        for drafter, by_k in drafters.items()
        for k, report in by_k.items()
    ]
    keys = ("sglang_version", "engine_args", "settings", "plain", "swap_check", "timings")
    return {key: served.get(key) for key in keys} | {"table": table}


def _pick_sets(specdec: dict) -> dict:
    """{set: {drafter: its SPECDEC_FIELDS}}; every set has the trained drafter, and the untrained one in
    every set or in none (`evaluate.untrained_control`), all drafting the same number of tokens per pass."""
    if not specdec:
        raise ValueError("write_summary: no evaluation set")
    with_control = {name for name, reports in specdec.items() if "untrained" in reports}
    sets = {}
    for set_name, reports in specdec.items():
        if "trained" not in reports:
            raise ValueError(f"write_summary: set {set_name!r} lacks the trained drafter")
        if with_control and set_name not in with_control:
            raise ValueError(f"write_summary: set {set_name!r} lacks the untrained drafter the others have")
        sets[set_name] = {
            d: _pick(r, SPECDEC_FIELDS, f"specdec[{set_name}][{d}]") for d, r in reports.items()
        }
        drafts = {d: r["num_draft_tokens"] for d, r in sets[set_name].items()}
        if len(set(drafts.values())) != 1:
            raise ValueError(
                f"write_summary: set {set_name!r} drafts per pass differ {drafts}: baselines must match"
            )
    return sets


def _pick_offline(offline: dict) -> dict:
    """{drafter: its OFFLINE_FIELDS}; the trained drafter is among them."""
    offline_by = {d: _pick(r, OFFLINE_FIELDS, f"offline[{d}]") for d, r in offline.items()}
    if "trained" not in offline_by:
        raise ValueError("write_summary: offline lacks the trained drafter")
    return offline_by


def _tau_table(sets: dict, offline_by: dict) -> list[dict]:
    """One row per set and drafter: real tau beside the drafter's offline figures: simulated tau over
    all its TTT steps, and simulated and walked tau at the row's k (`evaluate_offline`)."""
    return [
        {
            "set": set_name,
            "drafter": d,
            "tau": r["tau"],
            "simulated_tau": offline_by.get(d, {}).get("simulated_tau"),
            "simulated_tau_k": at_chain_length(
                offline_by.get(d, {}).get("simulated_tau_by_k"), r["num_draft_tokens"]
            ),
            "walked_tau_k": at_chain_length(
                offline_by.get(d, {}).get("walked_tau_by_k"), r["num_draft_tokens"]
            ),
            "speedup": r["speedup"],
            "spec_tokens_per_s": r["spec_tokens_per_s"],
            "acceptance_by_position": r["acceptance_by_position"],
        }
        for set_name, reports in sets.items()
        for d, r in reports.items()
    ]


def _headline(primary: str, sets: dict, offline_by: dict) -> dict:
    """The trained drafter beside the untrained one (None without the control) on the primary set,
    greedy equality over every report (None unless all were checked), and tau by set."""
    trained, untrained = sets[primary]["trained"], sets[primary].get("untrained", {})
    checks = [r["greedy_equal"] for reports in sets.values() for r in reports.values()]
    checked = all(c.get("checked") for c in checks)
    mismatches = sum(c.get("mismatch_count") or 0 for c in checks) if checked else None
    return {
        "set": primary,
        "tau": trained["tau"],
        "tau_untrained": untrained.get("tau"),
        "simulated_tau": offline_by["trained"]["simulated_tau"],
        "speedup": trained["speedup"],
        "speedup_untrained": untrained.get("speedup"),
        "greedy_equal": (mismatches == 0) if checked else None,
        "greedy_mismatches": mismatches,
        "tau_by_set": {name: {d: r["tau"] for d, r in reports.items()} for name, reports in sets.items()},
    }


def build_summary(*, offline: dict, specdec: dict, meta: dict, served: dict | None = None) -> dict:
    """The summary dict (pure).

    offline: {drafter: evaluate_offline report}; specdec: {set: {drafter: evaluate_specdec report}},
    with drafter `trained` in every set, `untrained` in all or none. Headline, `specdec`,
    `specdec_untrained` and `offline` describe the trained drafter on the primary set; `sets`,
    `offline_by_drafter` and `table` (one row per set and drafter: real tau beside simulated tau) hold
    everything. `served` (the served evaluation's JSON, `evaluate.served`) adds the `served` section
    and the headline's served figures; where only SGLang ran, `specdec` holds its figures at the first k.
    """
    sets = _pick_sets(specdec)
    offline_by = _pick_offline(offline)
    primary = primary_set(specdec)
    summary = {
        "format": SUMMARY_FORMAT,
        "meta": dict(meta),
        "headline": _headline(primary, sets, offline_by),
        "specdec": sets[primary]["trained"],
        "specdec_untrained": sets[primary].get("untrained"),
        "offline": offline_by["trained"],
        "table": _tau_table(sets, offline_by),
        "sets": sets,
        "offline_by_drafter": offline_by,
    }
    if served is not None:
        summary["served"] = served_section(served)
        trained_by_k = served["sets"][primary]["trained"]
        summary["headline"]["served_tau_by_k"] = {k: r["tau"] for k, r in trained_by_k.items()}
        summary["headline"]["served_speedup_bs1_by_k"] = {
            k: r["speedup_bs1"] for k, r in trained_by_k.items()
        }
    return json_safe(summary)


def _nan(values: list) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def plot_acceptance(summary: dict, out_plot: str | os.PathLike) -> list[dict]:
    """PNG: real acceptance by draft position (trained vs untrained) | offline accuracy by TTT step.
    Returns what it plotted (`figures.plotted`)."""
    fig = new_figure(10, 4)
    left, right = fig.subplots(1, 2)
    head = summary["headline"]
    for key, label, style in (("specdec", "trained", "o-"), ("specdec_untrained", "untrained", "s--")):
        if summary[key] is None:  # no untrained control (`evaluate.untrained_control` false)
            continue
        rates = _nan(summary[key]["acceptance_by_position"])
        tau = summary[key]["tau"]
        tau_txt = "n/a" if tau is None else f"{tau:.2f}"
        left.plot(range(1, len(rates) + 1), rates, style, label=f"{label} (tau {tau_txt})")
    # Offline prediction of the same quantity: all drafts up to position i right = prod of conditional acc.
    predicted, prod = [], 1.0
    for acc in _nan(summary["offline"]["conditional_accuracy"])[: len(rates)]:
        prod *= acc
        predicted.append(prod)
    left.plot(
        range(1, len(predicted) + 1), predicted, ":", color="grey", label="offline prediction (trained)"
    )
    left.set(
        title="Real speculative decoding",
        xlabel="draft position",
        ylabel="accepted / attempted",
        ylim=(0, 1.02),
    )
    left.legend()
    offline = summary["offline"]
    steps = range(1, len(offline["accuracy"]) + 1)
    right.plot(steps, _nan(offline["accuracy"]), "o-", label="accuracy")
    right.plot(steps, _nan(offline["conditional_accuracy"]), "s--", label="conditional accuracy")
    sim = head["simulated_tau"]
    right.set(
        title="Offline (held-out)" + ("" if sim is None else f", simulated tau {sim:.2f}"),
        xlabel="TTT step",
        ylabel="accuracy",
        ylim=(0, 1.02),
    )
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    return save_figure(fig, out_plot)


def write_summary(
    out_json: str | os.PathLike,
    out_plot: str | os.PathLike,
    *,
    offline: dict,
    specdec: dict,
    meta: dict,
    served: dict | None = None,
) -> dict:
    """Write `summary.json` and the acceptance PNG (both atomically); returns the summary dict.
    Arguments as `build_summary`."""
    summary = build_summary(offline=offline, specdec=specdec, meta=meta, served=served)
    text = json.dumps(summary, indent=2, sort_keys=False, allow_nan=False) + "\n"
    plot_acceptance(summary, out_plot)
    with atomic_file(out_json) as fh:
        fh.write(text)
    return summary
