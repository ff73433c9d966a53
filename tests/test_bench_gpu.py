"""`srt-agent bench gpu`: the GPU check's dry run (`--device cpu --quick`) writes every stage's JSON, well-formed
and with its figures, and imports nothing the offline GPU machine lacks; a failing or late stage is recorded
and the others still run. The suite runs the dry run, so the check cannot rot between GPU runs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.progress_lines import progress_lines
from torch.autograd import DeviceType

from srt_agent.bench import gpu, gpu_setup
from srt_agent.bench.gpu_exactness import chi_square_p
from srt_agent.bench.gpu_profile import LABEL, busy_us
from srt_agent.cli.quiet import LOG_NAME

ROOT = Path(__file__).resolve().parents[1]
# The GPU machine has none of these (docs/benchmarks/gpu.md): `bench gpu` must not import them.
ABSENT_THERE = {"fastapi", "uvicorn", "gguf", "math_verify", "vllm", "verl"}
DRY_RUN = """
import json, sys
from srt_agent.cli import app
try:
    app(["bench", "gpu", "--device", "cpu", "--quick", "--out", sys.argv[1]], prog_name="srt-agent")
except SystemExit as exc:
    code = exc.code
print(json.dumps(dict(code=code, modules=sorted({m.split(".")[0] for m in sys.modules}))))
"""


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[Path, dict]:
    """The dry run through the command line, in a process of its own (its imports are its own)."""
    out = tmp_path_factory.mktemp("gpu-check")
    proc = subprocess.run(
        [sys.executable, "-c", DRY_RUN, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, dict(json.loads(proc.stdout.strip().splitlines()[-1]), output=proc.stdout)


def stage(out: Path, name: str) -> dict:
    result = json.loads((out / f"{name}.json").read_text())
    assert result["stage"] == name and result["status"] == "ok", result.get("error") or result.get("skipped")
    assert result["wall_s"] > 0 and isinstance(result["headline"], dict)
    return result


@pytest.mark.slow
def test_dry_run_writes_every_stage_and_imports_nothing_the_gpu_machine_lacks(dry_run):
    out, proc = dry_run
    assert proc["code"] in (0, None)
    assert not ABSENT_THERE & set(proc["modules"])
    written = sorted(p.name for p in out.iterdir() if p.name != LOG_NAME)  # third-party output comes back too
    assert written == sorted(f"{s}.json" for s in (*gpu_setup.STAGES, "summary"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "done" and summary["environment"]["device"] == "cpu"
    assert list(summary["stages"]) == list(gpu_setup.STAGES)
    assert all(s["status"] == "ok" for s in summary["stages"].values())
    assert progress_lines(proc["output"], "bench gpu") == len(gpu_setup.STAGES)  # a line per stage


@pytest.mark.slow
def test_dry_run_exactness(dry_run):
    result = stage(dry_run[0], "exactness")
    assert result["lossless"] and all(r["identical"] and r["draft_accepted"] > 0 for r in result["lossless"])
    assert all(r["identical"] for r in result["cross_device_float64"])
    bf16 = result["bfloat16"]
    assert 0.5 < min(r["identical_share"] for r in bf16["identity"].values()) <= 1
    for chi in bf16["chi_square"].values():  # drafts accepted and rejected, distribution unchanged
        assert 0 < chi["draft_accepted"] < chi["draft_verified"] and chi["p_value"] > 1e-3
    assert bf16["power_p_value_T1_vs_T0_7"] < 1e-3  # the test sees a change of temperature


@pytest.mark.slow
def test_dry_run_speed_train_and_profile(dry_run):
    out = dry_run[0]
    speed = stage(out, "speed")
    config = gpu_setup.GpuCheckConfig.dry_run()
    assert {(r["method"], r["batch"], r["epoch"]) for r in speed["runs"]} == {
        (m, b, e) for m in ("none", "srt") for b in config.batches for e in (1, 2)
    }
    model = speed["models"][gpu_setup.TINY.name]
    assert abs(model["sharpening"]["entropy_after_nats"] - config.target_entropy) < 0.2
    assert len(model["verification"]["shapes"]) == len(config.batches) * len(config.drafted_per_sequence)
    assert all(s["floor_plain_ms"] > 0 and s["plain_step_ms"] > 0 for s in model["verification"]["shapes"])
    warm = [r for r in speed["summary"] if r["method"] == "srt" and r["epochs"] == "2+"]
    assert warm and all(r["tokens_per_forward"] > 1 for r in warm)

    train = stage(out, "train")
    assert [s["dtype"] for s in train["steps"]] == ["float32", "bfloat16"]
    assert train["steps"][0]["max_weight_change"] > 0 and train["steps"][0]["update_memory"]["peak_rss_mb"] > 0
    assert all(s["training/rollout_logprob_diff_mean"] >= 0 for s in train["steps"])  # the gap is reported
    gap = train["gap"]  # bfloat16 sampling, scored as the trainer does and with one source changed at a time
    assert gap["model"] == gpu_setup.TINY.name and gap["exact_attention"]  # a CPU: batch-invariant numerics
    rows = gap["rows"]
    assert rows["trainer"]["logprob_diff_mean"] < 1e-4 < rows["trainer, float32"]["logprob_diff_mean"]
    assert rows["float64"]["logprob_diff_mean"] > 0 and "trainer, attention not exact" in rows
    assert train["headline"]["bf16_gap"]["trainer"] == rows["trainer"]["logprob_diff_mean"]

    profile = stage(out, "profile")
    for p in profile["profiles"]:
        assert p["top_cpu_ops"] and p["attention_ops"] and p["host_share"] == 1.0 and p["tokens"] > 0


def test_a_failing_stage_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    def broken(config, device, deadline, save, log):
        save(dict(runs=[1]))
        raise RuntimeError("no kernel image for this device")

    def fine(config, device, deadline, save, log):
        save(dict(part=1))
        return dict(value=2, headline=dict(value=2))

    monkeypatch.setattr(gpu, "stage_functions", lambda: {"exactness": broken, "speed": fine})
    config = gpu_setup.GpuCheckConfig(device="cpu", stages=("exactness", "speed"))
    summary = gpu.run_gpu_check(config, tmp_path)
    assert summary["stages"]["exactness"]["status"] == "error"
    assert summary["stages"]["speed"] == dict(
        status="ok", wall_s=summary["stages"]["speed"]["wall_s"], headline={"value": 2}
    )
    error = json.loads((tmp_path / "exactness.json").read_text())
    assert "no kernel image" in error["error"] and "RuntimeError" in error["traceback"]
    assert error["runs"] == [1]  # what the stage saved before it failed is kept
    assert json.loads((tmp_path / "speed.json").read_text())["value"] == 2


def test_a_stage_out_of_time_skips_what_is_left_and_says_so(tmp_path):
    config = gpu_setup.GpuCheckConfig(device="cpu", stages=("train",), budget_s=0.0)
    summary = gpu.run_gpu_check(config, tmp_path)
    assert summary["stages"]["train"]["status"] == "skipped-some"
    result = json.loads((tmp_path / "train.json").read_text())
    assert result["steps"] == [] and result["skipped"] == [
        "float32: time budget",
        "bfloat16: time budget",
        f"sampler gap at {config.gap_shape.name}: time budget",
    ]


def test_unknown_stages_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown stage"):
        gpu.run_gpu_check(gpu_setup.GpuCheckConfig(device="cpu", stages=("speeed",)), tmp_path)


def test_the_chi_square_test_rejects_a_shifted_distribution():
    a = Counter({(1,): 600, (2,): 300, (3,): 300})
    assert chi_square_p(a, Counter({(1,): 600, (2,): 310, (3,): 290})) > 0.5
    assert chi_square_p(a, Counter({(1,): 700, (2,): 250, (3,): 250})) < 1e-3


def test_device_busy_time_is_the_union_of_device_events_within_the_step():
    def event(start, end, device=DeviceType.CUDA, name="kernel", annotation=False):
        return SimpleNamespace(
            time_range=SimpleNamespace(start=start, end=end),
            device_type=device,
            name=name,
            is_user_annotation=annotation,
        )

    events = [
        event(0, 100, DeviceType.CPU, LABEL),  # the step itself (host side)
        event(0, 100, name=LABEL, annotation=True),  # its device-side annotation: no device work
        event(10, 30),
        event(20, 40),  # overlaps the one before
        event(60, 70),
        event(95, 120),  # runs past the step: only 5 us inside
        event(50, 55, DeviceType.CPU),
    ]
    assert busy_us(events, 0, 100) == 30 + 10 + 5
