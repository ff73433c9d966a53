"""`srt-agent train` interrupted by a real SIGINT and resumed with the command it prints equals an
uninterrupted run on every step, for GRPO, DAPO and PPO; run folders are never mixed."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.rl_envs import tiny_env_file

from srt_agent.drafting import RolloutCache
from srt_agent.models import load_tokenizer, tiny_random_model
from srt_agent.rl.checkpoint import find_checkpoint, load_checkpoint
from srt_agent.rl.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
SRT_AGENT = str(Path(sys.executable).with_name("srt-agent"))
STEPS = 3
# KL to the start policy and a warm-up schedule on, so the reference policy and the scheduler must resume too.
TRAIN = {
    "steps": STEPS,
    "prompts_per_step": 2,
    "lr": 1e-3,
    "micro_batch_tokens": 256,
    "kl_coef": 0.01,
    "warmup_steps": 2,
    "checkpoint_every": 2,
    "keep_checkpoints": 3,
    "keep_optimizer": True,  # the finished runs' optimizers are compared too
}
LOSSES = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/lr", "critic/score/mean", "critic/advantages/max")


def env_file(tmp_path: Path, algorithm: str) -> Path:
    return tiny_env_file(tmp_path, f"tiny-{algorithm}.yaml", **TRAIN, algorithm=algorithm)


def train(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "COLUMNS": "200"}
    return subprocess.Popen(
        [SRT_AGENT, "train", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    output, _ = proc.communicate(timeout=timeout)
    return output


def interrupt_after_first_step(proc: subprocess.Popen, out: Path, timeout: float = 300) -> str:
    """Send SIGINT once step 1's rollouts are written (during step 1's recording or step 2's rollouts)."""
    deadline = time.monotonic() + timeout
    while not (out / "rollouts" / "step-000001.jsonl").exists():
        assert proc.poll() is None, finish(proc)
        assert time.monotonic() < deadline, "step 1 never finished"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    return finish(proc)


def rows(out: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (out / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()]


def trees(out: Path) -> dict[str, dict]:
    """Every drafter's saved trees in the run's newest checkpoint: prompt key → sorted sequences."""
    _, caches = load_checkpoint(out)
    out_trees = {}
    for name, path in caches.items():
        cache = RolloutCache.load(path)
        out_trees[name] = {repr(k): sorted(map(tuple, cache.sequences(k))) for k in cache.prompt_keys()}
    return out_trees


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "ppo"])
def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(tmp_path, algorithm):
    config = env_file(tmp_path, algorithm)
    whole, part = tmp_path / "whole", tmp_path / "part"
    uninterrupted = train([str(config), "--out", str(whole)], tmp_path)
    output = interrupt_after_first_step(train([str(config), "--out", str(part)], tmp_path), part)
    assert uninterrupted.wait(timeout=400) == 0, finish(uninterrupted)

    # Ctrl-C: exit 130 and one line naming the checkpoint and the exact command; no traceback.
    assert "Traceback" not in output and "Event loop is closed" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, output
    done = json.loads((part / "report.json").read_text())["steps"][-1]["step"]
    assert f"saved in {find_checkpoint(part)}" in lines[0]
    assert int(load_checkpoint(part)[0]["step"]) == done < STEPS
    command = shlex.split(lines[0].split("continue with: ", 1)[1])
    assert command[:2] == ["srt-agent", "train"] and command[-2:] == ["--resume", str(part)]

    resumed = train(command[2:], tmp_path)
    resumed_output = finish(resumed)
    assert resumed.returncode == 0, resumed_output
    assert f"resumed from step {done:.0f}" in resumed_output
    assert not (tmp_path / "runs").exists()  # the resumed run wrote into its own folder only

    a, b = (json.loads((d / "report.json").read_text()) for d in (whole, part))
    assert [m["step"] for m in b["steps"]] == [float(s) for s in range(1, STEPS + 1)]
    for step in range(1, STEPS + 1):
        ra, rb = rows(whole, step), rows(part, step)
        assert [r["response_ids"] for r in ra] == [r["response_ids"] for r in rb], step
        assert [r["reward"] for r in ra] == [r["reward"] for r in rb], step
        # The engine's log-probs come from the weights it was given: a resumed run that re-initialised
        # the policy (or lost an update) would sample from other weights and differ here.
        for x, y in zip(ra, rb):
            assert x["response_logprobs"] == pytest.approx(y["response_logprobs"], rel=1e-5, abs=1e-6), step
        ma, mb = a["steps"][step - 1], b["steps"][step - 1]
        keys = [k for k in LOSSES if k in ma] + (["critic/vf_loss", "critic/values/mean"] if algorithm == "ppo" else [])
        for key in keys:
            assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-7), (step, key)

    sa, sb = (load_checkpoint(d)[0] for d in (whole, part))
    assert sa["step"] == sb["step"] == STEPS
    for key in sa["policy"]:
        torch.testing.assert_close(sb["policy"][key], sa["policy"][key], rtol=1e-5, atol=1e-7)
    if algorithm == "ppo":
        assert "value_head.weight" in sa["policy"]
    for key in sa["reference"]:
        torch.testing.assert_close(sb["reference"][key], sa["reference"][key], rtol=0, atol=0)
    for pa, pb in zip(sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values()):
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(pb[name], pa[name], rtol=1e-5, atol=1e-9)
    assert sa["scheduler"] == sb["scheduler"] and sa["sampler"] == sb["sampler"]
    ta, tb = trees(whole), trees(part)
    assert "srt" in ta and sum(len(seqs) for seqs in ta["srt"].values()) > 0
    assert tb == ta  # the trees went on from the checkpoint: same prompts, same sequences


@pytest.mark.slow
def test_a_finished_run_keeps_one_checkpoint_without_moments_and_continues_from_it(tmp_path):
    """By default the run folder keeps the newest checkpoint only, a finished run's without AdamW's moments
    (twice the policy's size); the closing lines give the folder's size; continuing it with more steps says that
    the moments start afresh."""
    config = tiny_env_file(tmp_path, steps=2, prompts_per_step=2, micro_batch_tokens=256)
    out = tmp_path / "run"
    output = finish(train([str(config), "--out", str(out)], tmp_path))
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == ["step-000002"], output
    state = load_checkpoint(out)[0]
    assert state["optimizer"] is None and state["policy"]
    assert f"run folder {out}: " in output and " GB" in output.split(f"run folder {out}: ")[1]
    more = finish(train([str(config), "--resume", str(out), "--steps", "3", "--keep-checkpoints", "2"], tmp_path))
    assert "AdamW's moments: they start afresh" in more and "resumed from step 2" in more, more
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000002", "step-000003"]


def test_a_new_run_never_writes_into_another_runs_folder(tmp_path):
    config = env_file(tmp_path, "grpo")
    out = tmp_path / "run"
    (out / "checkpoints" / "step-000001").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step-000001")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    proc = train([str(config), "--out", str(out), "--steps", "1"], tmp_path)
    output = finish(proc)
    assert proc.returncode == 2, output
    assert "already holds a run" in output and "--resume" in output and "--out" in output
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def tiny():
    """A fresh float64 random Llama with SmolLM2's tokenizer, the same every call."""
    return tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))


@pytest.mark.parametrize("where", ["step 2's rollouts", "step 1's update"])
def test_ctrl_c_leaves_a_checkpoint_that_resumes_exactly(tmp_path, monkeypatch, where):
    """In-process, at a chosen point: during rollouts the step is discarded and the last finished step
    is saved with the trees it ended with (not those the discarded rollouts grew); during an update the
    step finishes and is saved before the run stops."""
    from srt_agent.rl import trainer as trainer_module
    from srt_agent.rl.rollouts import PolicyRollouts

    config = env_file(tmp_path, "grpo")  # checkpoint_every 2: step 1 has no checkpoint of its own
    whole, part = tmp_path / "whole", tmp_path / "part"
    Trainer.from_env_file(config, whole, loaded=tiny()).run()
    calls = []
    if where == "step 2's rollouts":
        run = PolicyRollouts.run

        def interrupted_run(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                run(self, *args, **kwargs)  # the trees grow, then Ctrl-C
                raise KeyboardInterrupt
            return run(self, *args, **kwargs)

        monkeypatch.setattr(PolicyRollouts, "run", interrupted_run)
    else:
        update = trainer_module.update_step

        def interrupted_update(*args, **kwargs):
            calls.append(1)
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, held until the step is recorded and saved
            return update(*args, **kwargs)

        monkeypatch.setattr(trainer_module, "update_step", interrupted_update)
    report = Trainer.from_env_file(config, part, loaded=tiny()).run()
    assert report["interrupted"] and [m["step"] for m in report["steps"]] == [1.0]
    assert load_checkpoint(part)[0]["step"] == 1 and report["checkpoint"] == str(find_checkpoint(part))
    monkeypatch.undo()
    Trainer.from_env_file(config, part, resume=part, loaded=tiny()).run()
    for step in range(1, STEPS + 1):
        assert [r["response_ids"] for r in rows(whole, step)] == [r["response_ids"] for r in rows(part, step)]
    sa, sb = (load_checkpoint(d)[0] for d in (whole, part))
    assert all(torch.equal(sa["policy"][k], sb["policy"][k]) for k in sa["policy"])
    assert trees(part) == trees(whole)


def test_the_default_run_folder_never_lands_on_an_earlier_run(tmp_path):
    from srt_agent.rl.checkpoint import fresh_run_folder

    base = tmp_path / "runs" / "tiny"
    assert fresh_run_folder(base) == base
    (base / "rollouts").mkdir(parents=True)
    assert fresh_run_folder(base) == base.with_name("tiny-2")
    (base.with_name("tiny-2") / "report.json").parent.mkdir(parents=True)
    (base.with_name("tiny-2") / "report.json").write_text("{}")
    assert fresh_run_folder(base) == base.with_name("tiny-3")
