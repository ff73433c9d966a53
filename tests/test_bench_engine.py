"""`srt-agent bench engine --quick` runs end to end, says how far it is, and writes the documented JSON."""

from __future__ import annotations

import json

from helpers.progress_lines import progress_lines
from typer.testing import CliRunner

from srt_agent.cli import app


def test_bench_engine_quick_writes_json(tmp_path):
    path = tmp_path / "engine.json"
    picture = tmp_path / "engine.png"
    result = CliRunner().invoke(app, ["bench", "engine", "--quick", "--json", str(path), "--plot", str(picture)])
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    runs = data["runs"]
    keys = {"method", "batch", "epoch", "wall_s", "tokens", "tokens_per_s", "tokens_per_forward", "identical_to_none"}
    assert all(keys <= r.keys() for r in runs)
    engine_runs = [r for r in runs if not r["method"].startswith("hf-")]
    methods = ("none", "srt", "self", "srt+self")
    assert {(r["method"], r["batch"]) for r in engine_runs} == {(m, b) for m in methods for b in (1, 4)}
    assert all(r["identical_to_none"] and r["identical_share"] == 1.0 for r in engine_runs)
    assert all(r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in runs)
    assert {r["method"] for r in runs} >= {"hf-generate", "hf-generate+prompt-lookup"}
    assert {(row["method"], row["epochs"]) for row in data["summary"]} >= {(m, e) for m in methods for e in ("1", "2+")}
    model_runs = [r for r in engine_runs if r["method"] in ("self", "srt+self")]
    assert all(r["model_drafted"] == 0 or r["model_draft_s_per_token"] > 0 for r in model_runs)
    assert all(r["drafter_update_s"] > 0 for r in model_runs if r["epoch"] == 1)  # rebuilt for epoch 2
    assert "speedup" in result.output
    costs = data["verification_cost"]  # the srt engines' start-up calibration, per batch size
    assert {c["batch"] for c in costs} == {1, 4}
    assert all(c["seconds"] > 0 for c in costs)
    assert {(c["sequences"], c["tokens"]) for c in costs if c["batch"] == 4} >= {(1, 1), (1, 16), (4, 4), (4, 8)}
    assert "verification cost at batch 4" in result.output
    pairs = data["head_to_head"]["1"]  # quick runs none, srt, self, srt+self: of the pairs only srt / none ran
    assert list(pairs) == ["srt / none"] and pairs["srt / none"]["time_ratio_all"] > 0
    assert "batch 1, srt / none time:" in result.output
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    assert progress_lines(result.output, "bench engine") == len(runs)  # one line per run as it finishes


def test_bench_engine_runs_a_bf16_policy_unsized_and_rejects_other_dtypes(tmp_path):
    path = tmp_path / "engine.json"
    args = ["bench", "engine", "--quick", "--dtype", "bfloat16", "--no-adaptive", "--json", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    assert data["config"]["dtype"] == "bfloat16" and data["config"]["adaptive_drafts"] is False
    assert all(r["tokens"] > 0 for r in data["runs"])
    bad = CliRunner().invoke(app, ["bench", "engine", "--quick", "--dtype", "float16"])
    assert bad.exit_code == 1 and "dtype must be one of float32, bfloat16" in bad.output
