"""A picture of an engine-benchmark result: speedup and tokens per forward per drafter, and what a
step costs by tokens fed."""

from __future__ import annotations

from pathlib import Path


def plot_engine_bench(result: dict, path: str | Path) -> Path:
    """Write a PNG of `result` (as `run_engine_bench` returns it, or its JSON) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = "2+" if any(r["epochs"] == "2+" for r in result["summary"]) else "1"
    rows = [r for r in result["summary"] if r["speedup_vs_none"] is not None and r["epochs"] == epochs]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    costs = [c for c in result.get("verification_cost", []) if c["sequences"] == 1]
    panels = 3 if costs else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2))
    width = 0.8 / max(1, len(batches))
    for k, batch in enumerate(batches):
        by_method = {r["method"]: r for r in rows if r["batch"] == batch}
        xs = [i + (k - (len(batches) - 1) / 2) * width for i in range(len(methods))]
        speedups = [by_method[m]["speedup_vs_none"] if m in by_method else 0.0 for m in methods]
        per_forward = [(by_method[m]["tokens_per_forward"] or 0.0) / batch if m in by_method else 0.0 for m in methods]
        axes[0].bar(xs, speedups, width, label=f"batch {batch}")
        axes[1].bar(xs, per_forward, width, label=f"batch {batch}")
    for ax, title in zip(axes[:2], ("tokens/s vs none", "tokens per forward per sequence")):
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(title)
        ax.legend(fontsize="small")
    if costs:
        for batch in sorted({c["batch"] for c in costs}):
            points = sorted((c["tokens"], 1000 * c["seconds"]) for c in costs if c["batch"] == batch)
            axes[2].plot(*zip(*points), marker="o", label=f"engine of batch {batch}")
        axes[2].set_xlabel("tokens fed by one sequence")
        axes[2].set_ylabel("ms per step")
        axes[2].set_ylim(bottom=0)
        axes[2].set_title("verification cost")
        axes[2].legend(fontsize="small")
    config = result.get("config", {})
    fig.suptitle(f"{config.get('model', '')} {config.get('dtype', 'float32')}, epochs {epochs}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
