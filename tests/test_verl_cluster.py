"""srt inside verl on a local Ray cluster (CPU): two replicas of the ``srt`` backend, selected by name through
the plugin entry point, verl's own LLMServerClient and AgentLoopWorker running our agent loop, the affinity
router, weight updates through the server adapter, and trees moving between replicas."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

ray = pytest.importorskip("ray")
pytest.importorskip("verl.experimental.agent_loop", reason="verl is an optional extra: pip install 'srt-agent[verl]'")

import verl  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.tools.base_tool import BaseTool  # noqa: E402
from verl.workers.rollout.llm_server import LLMServerClient  # noqa: E402
from verl.workers.rollout.replica import get_rollout_replica_class  # noqa: E402

from srt_agent.agent import Env, StepResult  # noqa: E402
from srt_agent.agent.retool import interpreter_block  # noqa: E402
from srt_agent.drafting import RolloutCache  # noqa: E402
from srt_agent.drafting.trees.keys import prompt_key  # noqa: E402
from srt_agent.engine import Engine, EngineOptions  # noqa: E402
from srt_agent.integrations.verl.adapter import SRTServerAdapter  # noqa: E402
from srt_agent.integrations.verl.affinity import ConsistentHashRing, PromptAffinityRouter  # noqa: E402
from srt_agent.integrations.verl.replica import SRTReplica  # noqa: E402
from srt_agent.integrations.verl.wire import from_verl_sampling  # noqa: E402
from srt_agent.models import tiny_random_model  # noqa: E402
from srt_agent.tools.local import bwrap_path  # noqa: E402

# A Ray cluster and two engine actors: about a minute and a half on 2 cores. Each test makes the rollouts it
# checks, since pytest-xdist may spread the module over workers, each with its own cluster.
pytestmark = pytest.mark.slow

RESPONSE_LENGTH = 64


class CrashingTool(BaseTool):
    """A verl tool whose execute raises (the agent loop must turn that into an observation)."""

    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("sandbox exploded")


class ScriptedToolEnv(Env):
    """Calls the tools itself, whatever the random model writes: code, then the crashing tool, then done."""

    async def step(self, response: str, final: bool) -> StepResult:
        if self.turn == 0:
            record = await self.call_tool("code_interpreter", {"code": "print(6 * 7)"})
        elif self.turn == 1:
            record = await self.call_tool("crashing_tool", {})
        else:
            return StepResult(reward=1.0, done=True)
        return StepResult(observation=interpreter_block(record.output))


def tool_config(path) -> None:
    schema = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "tools", "code_interpreter.yaml")))
    crashing = {
        "class_name": f"{__name__}.CrashingTool",
        "config": {"type": "native"},
        "tool_schema": {
            "type": "function",
            "function": {
                "name": "crashing_tool",
                "description": "always fails",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    }
    path.write_text(yaml.safe_dump({"tools": schema["tools"] + [crashing]}))


def agent_loops(path) -> None:
    loops = [
        {
            "name": "srt_retool",
            "_target_": "srt_agent.integrations.verl.agent_loop.ReToolAgentLoop",
            "max_turns": 2,
            "max_tokens_per_turn": 6,
        },
        {
            "name": "scripted",
            "_target_": "srt_agent.integrations.verl.agent_loop.ReToolAgentLoop",
            "env": f"{__name__}.ScriptedToolEnv",
            "max_turns": 3,
            "max_tokens_per_turn": 6,
        },
        {
            "name": "scripted_long",
            "_target_": "srt_agent.integrations.verl.agent_loop.ReToolAgentLoop",
            "env": f"{__name__}.ScriptedToolEnv",
            "max_turns": 3,
            "max_tokens_per_turn": 40,
        },
    ]
    path.write_text(yaml.safe_dump(loops))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_tokenizer):
    if bwrap_path() is None:
        pytest.skip("bubblewrap is not installed (the agent loop's code interpreter needs it)")
    root = tmp_path_factory.mktemp("verl")
    model = tiny_random_model("llama", dtype=torch.float32, tokenizer=smollm2_tokenizer, seed=3)
    model.model.save_pretrained(root / "model")
    smollm2_tokenizer.save_pretrained(root / "model")
    tool_config(root / "tools.yaml")
    agent_loops(root / "agent_loops.yaml")
    config = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml"))
    config.actor_rollout_ref.model.path = str(root / "model")
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "srt"
    rollout.tensor_model_parallel_size = 1
    rollout.prompt_length, rollout.response_length, rollout.dtype = 512, RESPONSE_LENGTH, "float32"
    rollout.engine_kwargs = {"srt": {"device": "cpu", "max_batch": 8, "calibrate": False}}
    rollout.agent.agent_loop_config_path = str(root / "agent_loops.yaml")
    rollout.agent.default_agent_loop = "srt_retool"
    rollout.multi_turn.tool_config_path = str(root / "tools.yaml")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    try:
        replica_class = get_rollout_replica_class("srt")  # resolved through the verl.plugins entry point
        replicas = [replica_class(i, rollout, config.actor_rollout_ref.model, gpus_per_node=1) for i in range(2)]

        async def launch():
            await asyncio.gather(*[replica.launch_servers() for replica in replicas])

        asyncio.run(launch())
        servers = {replica.server_address: replica.server_handle for replica in replicas}
        router = ray.remote(PromptAffinityRouter).remote(servers, {})
        client = LLMServerClient(config, router)
        yield SimpleNamespace(
            config=config,
            replicas=replicas,
            router=router,
            servers=servers,
            model=model,
            worker=AgentLoopWorker(config, client),
        )
    finally:
        ray.shutdown()


def batch(prompts: list[str], n: int, agent: str) -> DataProto:
    rows = [[{"role": "user", "content": p}] for p in prompts for _ in range(n)]
    raw = np.empty(len(rows), dtype=object)
    raw[:] = rows
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": raw,
            "reward_model": np.array([{"ground_truth": "42"}] * len(rows), dtype=object),
            "data_source": np.array(["arithmetic"] * len(rows), dtype=object),
            "agent_name": np.array([agent] * len(rows), dtype=object),
            "index": np.repeat(np.arange(len(prompts)), n),
        }
    )


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """(value, length) of each run of equal values."""
    out: list[tuple[int, int]] = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + 1)
        else:
            out.append((m, 1))
    return out


def test_the_plugin_selects_srt_by_name(cluster):
    from verl.workers.rollout.base import get_rollout_class

    assert get_rollout_replica_class("srt") is SRTReplica
    assert get_rollout_class("srt", "async") is SRTServerAdapter
    assert sorted(cluster.servers) == ["srt://" + os.uname().nodename + f"/replica-{i}" for i in range(2)]


def test_agent_loop_through_verls_worker_masks_tool_tokens_and_survives_a_crashing_tool(cluster):
    tokenizer = cluster.model.tokenizer
    out = asyncio.run(cluster.worker.generate_sequences(batch(["What is 6 times 7?"], 2, "scripted")))
    responses, masks = out.batch["responses"], out.batch["response_mask"]
    prompt_len = out.batch["prompts"].shape[1]
    assert responses.shape == (2, RESPONSE_LENGTH) and out.batch["rollout_log_probs"].shape == (2, RESPONSE_LENGTH)
    for i in range(2):
        length = int(out.batch["attention_mask"][i, prompt_len:].sum())
        mask = masks[i, :length].tolist()
        logprobs = out.batch["rollout_log_probs"][i, :length]
        assert [value for value, _ in runs(mask)] == [1, 0, 1, 0, 1]  # model, tool output, model, error, model
        assert (
            all(lp < 0 for lp, m in zip(logprobs.tolist(), mask) if m) and not logprobs[torch.tensor(mask) == 0].any()
        )
        forced = [tokenizer.decode(responses[i, :length][torch.tensor(mask) == 0].tolist())]
        assert "<interpreter>\n42\n</interpreter>" in forced[0]
        assert "RuntimeError: sandbox exploded" in forced[0]
        assert int(out.non_tensor_batch["__num_turns__"][i]) == 6  # prompt + 3 model turns + 2 observations
        assert out.batch["rm_scores"][i, length - 1] == 1.0 and out.batch["rm_scores"][i].sum() == 1.0
        assert out.non_tensor_batch["srt_tool_statuses"][i] == {"ok": 1, "crash": 1}
        assert out.non_tensor_batch["srt_finish_reason"][i] == "done"
        assert out.non_tensor_batch["srt_forwards"][i] >= 3
    # verl's client sends a fresh request id every turn; the server still continued each trajectory's one
    # sequence (KV reused, tool output forced into the tree): the prompt's tree holds 2 sequences, not 6.
    first_turn = out.batch["prompts"][0][out.batch["attention_mask"][0, :prompt_len].bool()].tolist()
    key = prompt_key(first_turn)  # the one key every tree holder files a prompt under
    (address,) = [a for a, h in cluster.servers.items() if key in ray.get(h.prompt_keys.remote())]
    local = RolloutCache()
    sequences = local.sequences(local.import_prompt(ray.get(cluster.servers[address].export_prompt.remote(key))))
    assert len(sequences) == 2
    assert all("<interpreter>\n42\n</interpreter>" in tokenizer.decode(seq) for seq in sequences)


def test_long_trajectories_are_cut_at_the_response_length(cluster):
    out = asyncio.run(cluster.worker.generate_sequences(batch(["Count to fifty."], 2, "scripted_long")))
    prompt_len = out.batch["prompts"].shape[1]
    for i in range(2):
        length = int(out.batch["attention_mask"][i, prompt_len:].sum())
        assert 40 < length <= RESPONSE_LENGTH
        assert out.non_tensor_batch["srt_finish_reason"][i] == "length"
        assert out.batch["rm_scores"][i].sum() == 0.0  # never scored: the env's `incorrect`


def test_affinity_keeps_grpo_siblings_on_the_replica_that_owns_their_prompt(cluster):
    prompts = [f"Compute {a} + {a}." for a in range(6)]
    out = asyncio.run(cluster.worker.generate_sequences(batch(prompts, 3, "srt_retool")))
    assert set(out.non_tensor_batch["srt_finish_reason"]) <= {"done", "max_turns"}
    ring = ConsistentHashRing(list(cluster.servers))
    seen: dict[str, str] = {}
    for address, handle in cluster.servers.items():
        for key in ray.get(handle.prompt_keys.remote()):
            assert key not in seen, "a prompt's rollouts were split over two replicas"
            assert ring.owner(key) == address
            seen[key] = address
    assert len(seen) >= len(prompts)  # every prompt of this batch (and the earlier tests') has one home
    local = RolloutCache()
    counts = []
    for key, address in seen.items():
        data = ray.get(cluster.servers[address].export_prompt.remote(key))
        counts.append(len(local.sequences(local.import_prompt(data))))
    assert sorted(counts)[-len(prompts) :] == [3] * len(prompts)  # each group's 3 siblings share one tree
    assert len(set(seen.values())) == 2  # both replicas own prompts


CERTAIN_TOKEN = 39  # "7": no special token, no stop string


def one_token_weights(state: dict[str, torch.Tensor], token: int) -> dict[str, torch.Tensor]:
    """Weights under which every position samples `token`: the layers add nothing to the residual (their
    output projections are zero), every token embeds to the same vector of ones, and only `token`'s output
    row points along it (a logit of 640 against 0 for every other token)."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor = torch.zeros_like(tensor)
        elif name in ("model.embed_tokens.weight", "model.norm.weight"):
            tensor = torch.ones_like(tensor)
        elif name == "lm_head.weight":
            tensor = torch.zeros_like(tensor)
            tensor[token] = 10.0
        out[name] = tensor
    return out


def update_both(cluster, state: dict[str, torch.Tensor], global_steps: int) -> None:
    async def update():
        for replica in cluster.replicas:
            adapter = SRTServerAdapter(
                cluster.config.actor_rollout_ref.rollout, None, replica_rank=replica.replica_rank
            )
            assert await adapter.update_weights(iter(state.items()), global_steps=global_steps) == len(state)

    asyncio.run(update())


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "seed": 11, "max_tokens": 12, "ignore_eos": True}  # verl's sampling dict


def sample_on_both(cluster, prompt_ids: list[int], request_id: str) -> dict:
    """What each replica samples for `prompt_ids` with SAMPLING: its tokens and log-probs. The calls go
    through the router under prompt keys weights-0, weights-1, … until both replicas served one (so the
    router knows every tree, and trees stay with their owners)."""
    outs: dict[str, object] = {}
    for i in itertools.count():
        key = f"weights-{i}"
        address, handle = ray.get(cluster.router.acquire_server.remote(f"{request_id}-{i}", prompt_ids, key))
        out = ray.get(
            handle.generate.remote(
                prompt_ids=prompt_ids, sampling_params=SAMPLING, request_id=request_id, prompt_key=key
            )
        )
        ray.get(cluster.router.release_server.remote(address, f"{request_id}-{i}"))
        outs.setdefault(address, out)
        if len(outs) == len(cluster.servers):
            return outs


def test_generation_follows_a_weight_update(cluster):
    """After an update both replicas sample what a local engine with the new weights samples (same prompt,
    seed and parameters), not what they sampled before; weights that make one token certain make every
    replica, and verl's agent loop on top, emit only that token."""
    # long enough for full prefix-cache blocks (16 tokens): KV computed before the update must not serve after it
    prompt_ids = cluster.model.tokenizer("The weights decide what comes next. " * 6).input_ids
    before = sample_on_both(cluster, prompt_ids, "before")
    target = tiny_random_model("llama", dtype=torch.float32, tokenizer=cluster.model.tokenizer, seed=5)
    new_state = target.model.state_dict()
    local = Engine(
        target,
        EngineOptions(drafter=None, device="cpu", max_batch=8, max_context=512 + RESPONSE_LENGTH, calibrate=False),
    )
    (want,) = local.generate([prompt_ids], from_verl_sampling(SAMPLING, RESPONSE_LENGTH))
    try:
        update_both(cluster, new_state, global_steps=7)
        expected = float(sum(t.double().sum() for t in new_state.values()))
        for handle in cluster.servers.values():
            assert ray.get(handle.state_checksum.remote()) == pytest.approx(expected, rel=1e-9)
            assert ray.get(handle.stats.remote())["held"] == 0  # stale KV is dropped
        after = sample_on_both(cluster, prompt_ids, "after")
        for address, out in after.items():
            assert out.token_ids == want.token_ids and out.token_ids != before[address].token_ids, address
            assert out.log_probs == pytest.approx(want.logprobs, abs=1e-4)

        update_both(cluster, one_token_weights(new_state, CERTAIN_TOKEN), global_steps=8)
        assert {tuple(out.token_ids) for out in sample_on_both(cluster, prompt_ids, "certain").values()} == {
            (CERTAIN_TOKEN,) * SAMPLING["max_tokens"]
        }
        prompts = [f"Say anything ({a})." for a in range(6)]
        out = asyncio.run(cluster.worker.generate_sequences(batch(prompts, 1, "srt_retool")))
        prompt_len = out.batch["prompts"].shape[1]
        for i in range(len(prompts)):
            length = int(out.batch["attention_mask"][i, prompt_len:].sum())
            mask = out.batch["response_mask"][i, :length] == 1
            sampled = out.batch["responses"][i, :length][mask].tolist()
            assert sampled and set(sampled) == {CERTAIN_TOKEN}
    finally:
        update_both(cluster, cluster.model.model.state_dict(), global_steps=9)  # the next tests see the first weights


def test_trees_move_when_a_replica_leaves(cluster):
    # its own rollouts first: under pytest-xdist this test may get a cluster of its own
    asyncio.run(cluster.worker.generate_sequences(batch([f"Name {a} primes." for a in range(6)], 2, "srt_retool")))
    leaving, staying = list(cluster.servers)
    moving = set(ray.get(cluster.servers[leaving].prompt_keys.remote()))
    before = set(ray.get(cluster.servers[staying].prompt_keys.remote()))
    assert moving and not moving & before
    ray.get(cluster.router.remove_servers.remote([leaving]))
    deadline = time.monotonic() + 60
    while not moving <= set(ray.get(cluster.servers[staying].prompt_keys.remote())):
        assert time.monotonic() < deadline, "the trees did not arrive"
        time.sleep(0.2)
    for key in moving:  # the same sequences, byte for byte
        assert ray.get(cluster.servers[staying].export_prompt.remote(key)) == ray.get(
            cluster.servers[leaving].export_prompt.remote(key)
        )
    status = ray.get(cluster.router.get_status.remote())
    assert status["active_servers"] == 1 and status["migrations"] == len(moving)
