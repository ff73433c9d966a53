"""What a training run shows: a live per-step table, and at the end report.json, PNG plots and a summary."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from ..engine.tail import TAIL_SEQUENCES
from .evaluate import interval_text, ratio_text
from .projection import projection_lines


def visit_label(revisit: float) -> str:
    """How a step's prompts stand to the trees: ``new`` (a first visit) or ``seen`` (rolled out before)."""
    return "seen" if revisit else "new"


# (header, metric, format: a format string or a function of the value); missing metrics show as "-".
STEP_COLUMNS = (
    ("step", "step", "{:.0f}"),
    ("prompts", "training/revisit", visit_label),
    ("reward", "critic/score/mean", "{:.3f}"),
    ("acc", "env/accuracy", "{:.0%}"),
    ("tool", "env/tool_call_rate", "{:.0%}"),
    ("resp len", "response_length/mean", "{:.0f}"),
    ("gen s", "timing_s/gen", "{:.1f}"),
    (f"≤{TAIL_SEQUENCES} run", "srt/tail_share", "{:.0%}"),  # engine step time with so few sequences running
    ("upd s", "timing_s/update_actor", "{:.1f}"),
    ("tok/fwd", "srt/tokens_per_forward", "{:.2f}"),
    ("acc/draft", "srt/accepted_per_draft", "{:.0%}"),
    ("|Δlogp|", "training/rollout_logprob_diff_mean", "{:.1e}"),
    ("IS w", "rollout_corr/rollout_is_mean", "{:.3f}"),  # the rollout correction's mean weight, while on
)


def step_table(metrics: dict[str, float], compare: Sequence[str], header: bool) -> Table:
    """One step's row (with the header on the first step), so rows stack into one live table."""
    columns = list(STEP_COLUMNS)
    for name in compare:
        columns += [
            (f"{name} gen s", f"compare/{name}/gen_s", "{:.1f}"),
            (f"vs {name}", f"compare/{name}/speedup", "{:.2f}x"),
        ]
    table = Table(box=None, show_header=header, header_style="bold", pad_edge=False)
    for title, _, _ in columns:
        table.add_column(title, justify="right", width=max(len(title), 7), no_wrap=True)
    table.add_row(*[_cell(fmt, metrics[key]) if key in metrics else "-" for _, key, fmt in columns])
    return table


def _cell(fmt, value) -> str:
    return fmt(value) if callable(fmt) else fmt.format(value)


PLOTS = (
    ("reward and accuracy", ("critic/score/mean", "env/accuracy", "env/tool_call_rate")),
    ("response length (tokens)", ("response_length/mean",)),
    ("generation time per step (s)", None),  # every drafter's generation time
    ("update time per step (s)", ("timing_s/update_actor", "timing_s/update_weights")),
    ("tokens per forward", ("srt/tokens_per_forward",)),
    ("|engine - trainer| log-prob", ("training/rollout_logprob_diff_mean", "training/rollout_logprob_diff_max")),
)


def plot_history(
    history: Sequence[dict[str, float]], compare: Sequence[str], main: str, path: Path, held_out: dict | None = None
) -> Path:
    """Draw the run's series over steps as one PNG; `held_out` reports ("before RL" at the first step's left,
    "after RL" at the last step) add held-out accuracy with its 95% interval to the first panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in history]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, keys) in zip(axes.flat, PLOTS):
        series = (
            [(main, "timing_s/gen")] + [(name, f"compare/{name}/gen_s") for name in compare]
            if keys is None
            else [(k, k) for k in keys]
        )
        for label, key in series:
            values = [m.get(key) for m in history]
            if any(v is not None for v in values):
                ax.plot(steps, [float("nan") if v is None else v for v in values], marker="o", label=label)
        if ax is axes.flat[0] and held_out:
            _plot_held_out(ax, held_out, steps)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_held_out(ax, held_out: dict, steps: Sequence[float]) -> None:
    at = {"before RL": steps[0] - 1, "after RL": steps[-1]}
    points = [(at[label], r) for label, r in held_out.items() if label in at]
    if not points:
        return
    xs = [x for x, _ in points]
    ys = [r["accuracy"] for _, r in points]
    low = [r["accuracy"] - r.get("intervals", {}).get("accuracy", [r["accuracy"]] * 2)[0] for _, r in points]
    high = [r.get("intervals", {}).get("accuracy", [r["accuracy"]] * 2)[1] - r["accuracy"] for _, r in points]
    ax.errorbar(xs, ys, yerr=[low, high], fmt="s--", capsize=4, color="black", label="held-out accuracy (95% CI)")


def held_out_lines(report: dict) -> list[str]:
    """A Markdown table of every held-out evaluation of the run, with 95% intervals."""
    rows = []
    cold = report.get("cold_start") or {}
    for label, key in (("before cold start", "before"), ("after cold start", "after")):
        if cold.get(key):
            rows.append((label, cold[key]))
    rows += [(label, r) for label, r in (report.get("held_out") or {}).items()]
    if not rows:
        return []
    lines = [
        "| held-out | tasks | tool calls | code ran cleanly | accuracy | mean reward |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, r in rows:
        cells = [_with_interval(r, k) for k in ("tool_call_rate", "code_ok_rate", "accuracy", "mean_reward")]
        lines.append(f"| {label} | {r['trajectories']} | " + " | ".join(cells) + " |")
    return lines + [""]


def _with_interval(r: dict, key: str) -> str:
    return interval_text(key, r.get(key, 0.0), r.get("intervals", {}).get(key))


def token_totals(steps: Sequence[dict]) -> dict[str, float]:
    """Over a run's steps: rollouts, sampled tokens, trained tokens, those of failed rollouts, those of
    groups dropped by dynamic sampling (or a skipped update), and the sessions that branched with their
    tokens outside the last branch (trained too)."""
    total = {
        key: sum(m.get(f"rollout/{key}", 0.0) for m in steps)
        for key in ("rollouts", "sampled_tokens", "error_tokens", "branched_sessions", "branch_tokens")
    }
    total["trained_tokens"] = sum(m.get("perf/trained_tokens", 0.0) for m in steps)
    total["filtered_tokens"] = max(total["sampled_tokens"] - total["error_tokens"] - total["trained_tokens"], 0.0)
    return total


def token_text(steps: Sequence[dict]) -> str:
    """A sentence on where the run's sampled tokens went ("" for a run without the figures)."""
    t = token_totals(steps)
    if not t["sampled_tokens"]:
        return ""
    rollouts = max(t["rollouts"], 1.0)
    untrained = [
        f"{t[key]:,.0f} {why}"
        for key, why in (("error_tokens", "in failed rollouts"), ("filtered_tokens", "in groups without signal"))
        if t[key]
    ]
    text = (
        f"trained {t['trained_tokens']:,.0f} of {t['sampled_tokens']:,.0f} sampled tokens "
        f"({t['trained_tokens'] / rollouts:,.0f} per rollout); "
        + (f"not trained: {', '.join(untrained)}" if untrained else "none dropped")
    )
    return text + (
        f"; sessions with branches: {t['branched_sessions']:,.0f} of {t['rollouts']:,.0f}, "
        f"{t['branch_tokens']:,.0f} tokens outside the last branch (trained with their session's advantage)"
    )


def summary_markdown(report: dict) -> str:
    """A short Markdown summary of a run (cold start, RL steps, speedups)."""
    lines = [f"# {report['name']}: {report['algorithm']} with `{report['drafter']}` rollouts", ""]
    cold = report.get("cold_start")
    if cold:
        lines.append(
            f"Cold start: {cold['traces']} traces, {cold['trained_tokens']} trained tokens"
            f"{' (cached)' if cold.get('cached') else ''}."
        )
        lines.append("")
    lines += held_out_lines(report)
    steps = report.get("steps", [])
    if steps:
        compare = report.get("compare", [])
        head = ["step", "prompts", "reward", "accuracy", "tool calls", "gen s", "update s", "tokens/forward"]
        head += [f"{d} gen s" for d in compare] + [f"speedup vs {d}" for d in compare]
        lines += ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for m in steps:
            row = [
                f"{m['step']:.0f}",
                visit_label(m.get("training/revisit", 0.0)),
                f"{m.get('critic/score/mean', 0):.3f}",
                f"{m.get('env/accuracy', 0):.0%}",
                f"{m.get('env/tool_call_rate', 0):.0%}",
                f"{m.get('timing_s/gen', 0):.1f}",
                f"{m.get('timing_s/update_actor', 0):.1f}",
                f"{m.get('srt/tokens_per_forward', 0):.2f}",
            ]
            row += [f"{m.get(f'compare/{d}/gen_s', 0):.1f}" for d in compare]
            row += [f"{m.get(f'compare/{d}/speedup', 0):.2f}x" for d in compare]
            lines.append("| " + " | ".join(row) + " |")
        totals = report.get("totals", {})
        for d in compare:
            if f"speedup_vs_{d}" in totals:
                lines.append(
                    f"\nOver all steps, `{report['drafter']}` generated at "
                    f"{ratio_text(totals[f'speedup_vs_{d}'], totals.get(f'speedup_vs_{d}_interval'))} "
                    f"the speed of `{d}` (its time / ours, 95% interval over the steps; "
                    f"share of identical trajectories: {totals.get(f'identical_vs_{d}', 'n/a')})."
                )
                if totals.get(f"identical_vs_{d}_note"):
                    lines.append(f"Identical share: {totals[f'identical_vs_{d}_note']}.")
        tokens = token_text(steps)
        if tokens:
            lines.append(f"\nTokens: {tokens}.")
    if report.get("projection"):
        lines += ["", *(f"{line}." for line in projection_lines(report["projection"]))]
    return "\n".join(lines) + "\n"


def story_lines(report: dict) -> list[str]:
    """The run in a few console lines: tool use and accuracy before/after the cold start and before/after
    RL (95% intervals, and whether the change is beyond them), where the sampled tokens went (trained, or
    not and why; sessions with branches), and the drafter's generation time against each compared one, per
    step and over first visits and revisits."""
    lines = []
    pairs = [
        ("cold start", report.get("cold_start") or {}, "before", "after"),
        ("RL", report.get("held_out") or {}, "before RL", "after RL"),
    ]
    for phase, results, before_key, after_key in pairs:
        before, after = results.get(before_key), results.get(after_key)
        if not (before and after):
            continue
        parts = [
            f"{name} {_with_interval(before, key)} → {_with_interval(after, key)}"
            for name, key in (("tool calls", "tool_call_rate"), ("accuracy", "accuracy"))
        ]
        verdict = _verdict(before, after)
        lines.append(
            f"[bold]{phase}[/bold] (held-out): " + "; ".join(parts) + (f"; accuracy {verdict}" if verdict else "")
        )
    steps, totals, drafter = report.get("steps", []), report.get("totals", {}), report.get("drafter", "")
    tokens = token_text(steps)
    if tokens:
        lines.append(f"[bold]tokens[/bold]: {tokens}")
    for name in report.get("compare", []):
        per_step = ", ".join(
            f"{m['step']:.0f} {visit_label(m.get('training/revisit', 0.0))} "
            f"{m.get(f'compare/{name}/speedup', 0.0):.2f}x"
            for m in steps
        )
        parts = [
            f"{label} {ratio_text(totals[key], totals.get(f'{key}_interval'))}"
            for label, key in (
                ("all", f"speedup_vs_{name}"),
                ("first visits", f"speedup_vs_{name}_first"),
                ("revisits", f"speedup_vs_{name}_revisit"),
            )
            if totals.get(key) is not None
        ]
        if parts:
            lines.append(
                f"[bold]{drafter} vs {name}[/bold] (their generation time / ours): {', '.join(parts)}; "
                f"per step: {per_step}"
            )
    return lines + (projection_lines(report["projection"]) if report.get("projection") else [])


def _verdict(before: dict, after: dict) -> str:
    """Whether held-out accuracy moved beyond the 95% intervals of both evaluations ("" without intervals)."""
    if "accuracy" not in before.get("intervals", {}) or "accuracy" not in after.get("intervals", {}):
        return ""
    low_b, high_b = before["intervals"]["accuracy"]
    low_a, high_a = after["intervals"]["accuracy"]
    if low_a > high_b:
        return "rose beyond the intervals"
    if high_a < low_b:
        return "fell beyond the intervals"
    return "within noise (the intervals overlap)"


def write_report(out_dir: Path, report: dict) -> dict[str, Path]:
    """report.json, summary.md and plots.png in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"report": out_dir / "report.json", "summary": out_dir / "summary.md"}
    paths["report"].write_text(json.dumps(report, indent=2, default=float))
    paths["summary"].write_text(summary_markdown(report))
    if report.get("steps"):
        paths["plots"] = plot_history(
            report["steps"], report.get("compare", []), report["drafter"], out_dir / "plots.png", report.get("held_out")
        )
    return paths


def slower_line(metrics: dict[str, float], drafter: str, name: str) -> str | None:
    """Where `drafter`'s extra generation time over compared variant `name` went in a step it was slower (None
    when it was not). Where both counted their engine steps by sequences running: speed (our steps against
    theirs with as many sequences running: host drafting and rejected drafts within it), work (our tokens
    and tail, at their speed, against theirs: other trajectories) and the rest (tool waits, scheduling);
    else host drafting, rejected drafts and the rest."""
    theirs, ours = metrics.get(f"compare/{name}/gen_s"), metrics.get("timing_s/gen")
    if theirs is None or ours is None or ours <= theirs:
        return None
    extra = ours - theirs
    host, rejected = metrics.get("srt/draft_host_s", 0.0), metrics.get("srt/rejected_s", 0.0)
    drafting = (
        f"drafting on the host {host:.2f} s, verifying rejected drafts {rejected:.2f} s "
        f"({metrics.get('srt/rejected_tokens', 0):.0f} tokens)"
    )
    head = f"[yellow]step {metrics['step']:.0f}: {drafter} generated {extra:.1f} s longer than {name} ({ours:.1f} s vs {theirs:.1f} s): "
    at = metrics.get(f"compare/{name}/ours_at_their_speed_s")
    if at is None:
        return head + f"{drafting}, the rest {extra - host - rejected:.2f} s[/yellow]"
    speed = metrics[f"compare/{name}/ours_step_s"] - at
    work = at - metrics[f"compare/{name}/step_s"]
    identical = metrics.get(f"compare/{name}/identical")
    same = f", {identical:.0%} of trajectories identical" if identical is not None else ""
    return head + (
        f"speed {speed:+.2f} s (its steps against {name}'s with as many sequences running; {drafting}), "
        f"work {work:+.2f} s (other tokens or a longer tail at {name}'s speed{same}), "
        f"the rest {extra - speed - work:+.2f} s[/yellow]"
    )


def step_warnings(
    metrics: dict[str, float], warn_above: float, drafter: str, compared_why: dict[str, str]
) -> list[str]:
    """Console lines for what went wrong in a step: engine and trainer log-probs apart by more than
    `warn_above`, skipped non-finite updates, and compared drafters whose rollouts were not identical to
    `drafter`'s (`compared_why[name]`: why that can happen)."""
    lines = []
    step = metrics["step"]
    diff = metrics.get("training/rollout_logprob_diff_mean")
    if diff is not None and diff > warn_above:
        lines.append(
            f"[red]step {step:.0f}: engine and trainer log-probs differ by {diff:.4f} on average "
            f"(max {metrics.get('training/rollout_logprob_diff_max', 0):.4f}) — the rollouts may not be on-policy[/red]"
        )
    if metrics.get("training/nonfinite_updates", 0):
        lines.append(
            f"[red]step {step:.0f}: non-finite loss or gradient; "
            f"{metrics['training/nonfinite_updates']:.0f} optimizer step(s) skipped[/red]"
        )
    lines += [line for name in compared_why if (line := slower_line(metrics, drafter, name)) is not None]
    for name, why in compared_why.items():
        share = metrics.get(f"compare/{name}/identical", 1.0)
        if share >= 1.0:
            continue
        judged = f"compare/{name}/near_ties" in metrics
        if judged:  # each first difference recomputed in float64 (identity.py)
            counts = [int(metrics.get(f"compare/{name}/{k}", 0)) for k in ("near_ties", "faults", "observations")]
            why = "first differences: {} proven near-tie(s), {} fault(s), {} in forced tokens; report.json's identity"
            why = why.format(*counts)
        color = "red" if judged and sum(counts[1:]) else "yellow"
        lines.append(
            f"[{color}]step {step:.0f}: {name}'s rollouts match {share:.0%} of {drafter}'s token for token ({why})[/{color}]"
        )
    return lines
