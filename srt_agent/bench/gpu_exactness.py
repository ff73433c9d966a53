"""The GPU check's exactness stage: the engine's lossless promises, checked on the device.

* float32 and float64, two architectures (tiny random Llama and Qwen2), three sampling settings: plain
  decoding against SRT over two epochs of the same seeds (the second drafts from warm trees), token
  for token, with the largest log-prob difference;
* float64: the same seeds on the CPU and on the device, plain and SRT, token for token;
* bfloat16, on a tiny Qwen2 whose head is sharpened (`gpu_setup.sharpen_head`) so that a few outcomes carry
  most of the mass: the share of tokens SRT emits identically to plain decoding (a verified row's logits
  round differently from a plain step's, which can flip a near-tie), and Pearson's chi-square test that the
  first three sampled tokens keep their distribution when SRT drafts from a warm tree (independent seeds on
  each side, every drafted node verified; a comparison of T = 1 with T = 0.7 shows the test has the power
  to see a change).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable

import torch

from ..engine import Engine, EngineOptions, SamplingParams
from ..models import tiny_random_model
from .engine import identical_share
from .gpu_setup import Deadline, GpuCheckConfig, check_outputs, sharpen_head

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "t1-top-p0.9": dict(temperature=1.0, top_p=0.9),
    "t0.7-top-k20": dict(temperature=0.7, top_k=20),
}
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]
GROUP = 3  # samples per prompt: siblings share the prompt's tree
CHI_PROMPT = [5, 6, 7]
CHI_ENTROPY = 1.0  # nats per token after sharpening: a 3-token outcome distribution with a few large cells
MIN_CELL = 10  # outcomes rarer than this (both samples together) are pooled into one cell


def epochs_of(model, device, drafter: str | None, setting: dict, epochs: int = 2, max_tokens: int = 24):
    """`epochs` passes over the same prompts and seeds (drafter trees kept between them); the outputs of
    each pass and the engine's stats."""
    engine = Engine(
        model,
        EngineOptions(
            drafter=drafter,
            device=device,
            max_batch=8,
            max_context=96,
            max_draft_tokens=8,
            adaptive_drafts=False,
            calibrate=False,
        ),
    )
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    params = [SamplingParams(max_tokens=max_tokens, seed=100 + i, **setting) for i in range(len(prompts))]
    outs = []
    for _ in range(epochs):
        outs.append(engine.generate(prompts, params))
        check_outputs(outs[-1])
        engine.end_step()
    return outs, engine.stats()


def compare(plain: list, spec: list) -> dict:
    """Token identity and the largest log-prob difference between two runs' epochs of outputs."""
    tokens_a = [[o.token_ids for o in epoch] for epoch in plain]
    tokens_b = [[o.token_ids for o in epoch] for epoch in spec]
    diffs = [
        abs(x - y)
        for ea, eb in zip(plain, spec)
        for a, b in zip(ea, eb)
        if a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs)
        if x != y  # -inf == -inf (greedy) is no difference
    ]
    return dict(
        identical=tokens_a == tokens_b,
        identical_share=min(identical_share(b, a) for a, b in zip(tokens_a, tokens_b)),
        max_logprob_diff=max(diffs, default=0.0),
        tokens=sum(len(t) for epoch in tokens_a for t in epoch),
    )


def lossless_cases(config: GpuCheckConfig, device: torch.device, deadline: Deadline, save, rows: list) -> None:
    """Plain vs SRT per (dtype, architecture, setting), appended to `rows` as they finish."""
    cases = itertools.product((torch.float32, torch.float64), config.exact_archs, config.exact_settings)
    for dtype, arch, setting in cases:
        if deadline.expired():
            rows.append(
                dict(dtype=str(dtype).removeprefix("torch."), arch=arch, setting=setting, skipped="time budget")
            )
            continue
        model = tiny_random_model(arch, seed=3, dtype=dtype, device=device)
        plain, _ = epochs_of(model, device, None, SETTINGS[setting])
        spec, stats = epochs_of(model, device, "srt", SETTINGS[setting])
        rows.append(
            dict(
                dtype=str(dtype).removeprefix("torch."),
                arch=arch,
                setting=setting,
                **compare(plain, spec),
                draft_verified=stats["draft_verified"],
                draft_accepted=stats["draft_accepted"],
            )
        )
        save(dict(lossless=rows))


def cross_device(config: GpuCheckConfig, device: torch.device) -> list[dict]:
    """float64, the same seeds: plain and SRT on the CPU and on `device` emit the same tokens."""
    cpu = torch.device("cpu")
    rows = []
    for arch, setting in itertools.product(config.exact_archs, ("t1-top-p0.9", "greedy")):
        runs = {}
        for where, drafter in itertools.product(dict.fromkeys((cpu, device)), (None, "srt")):
            model = tiny_random_model(arch, seed=5, dtype=torch.float64, device=where)
            runs[(where.type, drafter or "none")], _ = epochs_of(model, where, drafter, SETTINGS[setting])
        reference = runs[("cpu", "none")]
        rows.append(
            dict(
                arch=arch,
                setting=setting,
                runs={f"{d}:{m}": compare(reference, outs) for (d, m), outs in runs.items()},
                identical=all(compare(reference, outs)["identical"] for outs in runs.values()),
            )
        )
    return rows


def chi_square_p(a: Counter, b: Counter) -> float:
    """p-value of Pearson's chi-square test that two samples come from one distribution."""
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= MIN_CELL]
    rows = [[a[k] for k in common], [b[k] for k in common]]
    rows[0].append(sum(a.values()) - sum(rows[0]))
    rows[1].append(sum(b.values()) - sum(rows[1]))
    table = torch.tensor(rows, dtype=torch.float64)
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return 1.0
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    dof = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def first_tokens(engine: Engine, n: int, seed: int, **sampling) -> Counter:
    """How often each tuple of the first three tokens comes out of `n` samples of CHI_PROMPT (seeds from `seed`)."""
    params = [SamplingParams(max_tokens=3, seed=seed + i, **sampling) for i in range(n)]
    outs = engine.generate([CHI_PROMPT] * n, params, prompt_keys=["chi"] * n)
    check_outputs(outs)
    engine.end_step()
    return Counter(tuple(o.token_ids) for o in outs)


def bf16_checks(device: torch.device, samples: int) -> dict:
    """bf16: SRT's share of identical tokens, and chi-square tests through warm trees at two settings, on a
    tiny Qwen2 whose head is sharpened to CHI_ENTROPY (concentrated enough for the test to have power)."""
    model = tiny_random_model("qwen2", seed=7, dtype=torch.bfloat16, device=device)
    rng = random.Random(7)
    sharpening = sharpen_head(model.model, [[rng.randrange(256) for _ in range(8)] for _ in range(8)], CHI_ENTROPY)
    identity = {}
    for setting in ("t1-top-p0.9", "greedy"):
        plain, _ = epochs_of(model, device, None, SETTINGS[setting])
        spec, stats = epochs_of(model, device, "srt", SETTINGS[setting])
        identity[setting] = dict(**compare(plain, spec), draft_accepted=stats["draft_accepted"])
    chi = {}
    plain_engine = Engine(
        model, EngineOptions(drafter=None, device=device, max_batch=64, max_context=16, calibrate=False)
    )
    for name, sampling in {"T1": dict(temperature=1.0), "T0.7-top-p0.9": dict(temperature=0.7, top_p=0.9)}.items():
        srt = Engine(
            model,
            EngineOptions(
                drafter="srt",
                device=device,
                max_batch=64,
                max_context=16,
                max_draft_tokens=4,
                adaptive_drafts=False,
                calibrate=False,
            ),
        )
        first_tokens(srt, samples // 2, 10_000, **sampling)  # warm the prompt's tree
        before = srt.stats()
        spec = first_tokens(srt, samples, 20_000, **sampling)
        after = srt.stats()
        plain = first_tokens(plain_engine, samples, 30_000, **sampling)
        chi[name] = dict(
            p_value=chi_square_p(spec, plain),
            samples=samples,
            top_outcome_share=plain.most_common(1)[0][1] / samples,
            outcomes=len(set(spec) | set(plain)),
            draft_verified=after["draft_verified"] - before["draft_verified"],
            draft_accepted=after["draft_accepted"] - before["draft_accepted"],
        )
    at_07 = first_tokens(plain_engine, samples, 40_000, temperature=0.7)
    at_1 = first_tokens(plain_engine, samples, 50_000, temperature=1.0)
    return dict(
        model=dict(arch="qwen2", vocab_size=256, sharpening=sharpening),
        identity=identity,
        chi_square=chi,
        power_p_value_T1_vs_T0_7=chi_square_p(at_1, at_07),
    )


def run_exactness(
    config: GpuCheckConfig,
    device: torch.device,
    deadline: Deadline,
    save: Callable[[dict], None],
    log: Callable[[str], None],
) -> dict:
    """The stage: lossless cases, CPU vs device in float64, bf16 identity share and chi-square."""
    rows: list[dict] = []
    lossless_cases(config, device, deadline, save, rows)
    log(f"lossless: {sum(r.get('identical', False) for r in rows)}/{len(rows)} cases token-identical")
    result: dict = dict(lossless=rows, skipped=[r for r in rows if "skipped" in r])
    if deadline.expired():
        result["skipped"].append("cross-device and bf16 checks: time budget")
    else:
        result["cross_device_float64"] = cross_device(config, device)
        save(result)
        result["bfloat16"] = bf16_checks(device, config.chi_square_samples)
    if device.type == "cpu":
        result["note"] = "device is the CPU: the cross-device comparison is the CPU against itself"
    run = [r for r in rows if "identical" in r]
    bf16 = result.get("bfloat16", {})
    result["headline"] = dict(
        lossless_identical=f"{sum(r['identical'] for r in run)}/{len(run)}",
        lossless_max_logprob_diff=max((r["max_logprob_diff"] for r in run), default=None),
        cross_device_identical=all(r["identical"] for r in result["cross_device_float64"])
        if "cross_device_float64" in result
        else None,
        bf16_identical_share={k: v["identical_share"] for k, v in bf16.get("identity", {}).items()},
        bf16_chi_square_p={k: v["p_value"] for k, v in bf16.get("chi_square", {}).items()},
        chi_square_power_p=bf16.get("power_p_value_T1_vs_T0_7"),
    )
    return result
