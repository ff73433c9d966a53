"""`srt-agent bench proposer`: what SRT's proposer costs the host per batch row and step inside vLLM, at the batch
a GPU step runs, against vLLM's own step.

vLLM for CPUs runs a tiny random Llama (SmolLM2's tokenizer) in this process, so the step is cheap and the
proposer's share of it is what a GPU step would pay on the host: GRPO groups of ``rollouts_per_prompt`` samples
of ``prompts`` prompts (``prompts × rollouts_per_prompt`` rows in flight) decode ``tokens`` tokens at T = 1, and
the same prompts come back for ``steps`` RL-like steps (new samples, the trees kept), so later steps draft from
earlier ones. The proposer times its own ``propose`` (host µs per row per step: wall time, and its thread's CPU
time, which leaves out what vLLM's own CPU threads take of these cores meanwhile); the step is vLLM's wall time
per engine step. SRT runs with its default options (the cost policy sizes drafts to the batch).
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import asdict, dataclass

from ..console import Progress

TARGET_US_PER_ROW = 2.0  # the proposer's host time per row per step a GPU step can afford (0.5 ms at batch 256)


@dataclass
class ProposerBenchSpec:
    """Rows in flight (prompts × rollouts per prompt), tokens per rollout, RL-like steps, draft length."""

    prompts: int = 32
    rollouts_per_prompt: int = 8
    tokens: int = 128
    steps: int = 3
    speculative_tokens: int = 8
    prompt_tokens: int = 64
    seed: int = 0


def run_proposer_bench(spec: ProposerBenchSpec, work: Progress | None = None) -> dict:
    """Generate the steps with SRT inside vLLM; per step the proposer's host µs per row and vLLM's step ms
    (`work` hears of each step as it ends)."""
    from ..backends.vllm import configure_speculation, cpu_env, srt_proposer, tiny_model_dir

    work = work or Progress.unseen()
    work.now("vLLM's start-up")
    os.environ.update(cpu_env(kv_cache_gib=2))
    from vllm import LLM, SamplingParams

    rows = spec.prompts * spec.rollouts_per_prompt
    llm = LLM(
        model=str(tiny_model_dir()),
        enforce_eager=True,
        max_model_len=spec.prompt_tokens + spec.tokens + 2 * spec.speculative_tokens,
        max_num_seqs=rows,
        dtype="float32",
        seed=spec.seed,
        speculative_config=configure_speculation("srt", spec.speculative_tokens),
    )
    proposer = srt_proposer(llm)
    rng = random.Random(spec.seed)
    vocab = llm.get_tokenizer().vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(spec.prompt_tokens)] for _ in range(spec.prompts)]
    figures = []
    for step in range(1, spec.steps + 1):
        before = dict(proposer.stats())
        params = SamplingParams(temperature=1.0, max_tokens=spec.tokens, ignore_eos=True, detokenize=False)
        batch = [{"prompt_token_ids": p} for p in prompts for _ in range(spec.rollouts_per_prompt)]
        started = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        proposer.end_step()
        after = proposer.stats()
        steps = after["steps"] - before["steps"]
        seen = after["rows_seen"] - before["rows_seen"]
        host_ms = (after["host_ns"] - before["host_ns"]) / 1e6
        cpu_ms = (after["host_cpu_ns"] - before["host_cpu_ns"]) / 1e6
        figures.append(
            {
                "step": step,
                "seconds": seconds,
                "engine_steps": steps,
                "rows_per_engine_step": seen / max(1, steps),
                "vllm_step_ms": seconds * 1e3 / max(1, steps),
                "proposer_ms_per_step": host_ms / max(1, steps),
                "proposer_us_per_row": host_ms * 1e3 / max(1, seen),
                "proposer_cpu_us_per_row": cpu_ms * 1e3 / max(1, seen),
                "proposer_share_of_step": host_ms / 1e3 / seconds,
                "drafted": after["drafted"] - before["drafted"],
                "accepted": after["accepted"] - before["accepted"],
            }
        )
        work.done(f"step {step}: {figures[-1]['proposer_us_per_row']:.1f} µs per row, {seconds:.1f} s")
    return {"spec": asdict(spec), "rows": rows, "target_us_per_row": TARGET_US_PER_ROW, "steps": figures}


def proposer_table(result: dict):
    """A rich table: one row per step."""
    from rich.table import Table

    table = Table(
        "step", "engine steps", "rows/step", "vLLM step ms", "proposer ms/step", "µs/row", "CPU µs/row", "share"
    )
    for s in result["steps"]:
        table.add_row(
            str(s["step"]),
            str(s["engine_steps"]),
            f"{s['rows_per_engine_step']:.0f}",
            f"{s['vllm_step_ms']:.1f}",
            f"{s['proposer_ms_per_step']:.2f}",
            f"{s['proposer_us_per_row']:.1f}",
            f"{s['proposer_cpu_us_per_row']:.1f}",
            f"{s['proposer_share_of_step']:.1%}",
        )
    return table


__all__ = ["ProposerBenchSpec", "proposer_table", "run_proposer_bench"]
