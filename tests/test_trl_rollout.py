"""TRL's GRPOTrainer (real, on CPU) training a tiny model through SRTRolloutFunc: multi-turn episodes with
tool tokens masked, the engine's policy kept in sync with the trainer, trees kept across steps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl", reason="TRL is an optional extra: pip install 'srt-agent[trl]'")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from srt_agent.agent import Env, FunctionTool, StepResult  # noqa: E402
from srt_agent.agent.retool import interpreter_block  # noqa: E402
from srt_agent.config import EnvConfig  # noqa: E402
from srt_agent.integrations.trl.reward import completion_text, retool_reward  # noqa: E402
from srt_agent.integrations.trl.rollout_func import SRTRolloutFunc  # noqa: E402
from srt_agent.models import tiny_random_model  # noqa: E402

pytestmark = pytest.mark.slow  # TRL's import and trainer set-up take ~20 s here


class OneToolCallEnv(Env):
    """Calls its tool after the first model turn (whatever the random model wrote), then ends."""

    async def step(self, response: str, final: bool) -> StepResult:
        if self.turn == 0:
            record = await self.call_tool("lookup", {"query": response[:10]})
            return StepResult(observation=interpreter_block(record.output))
        return StepResult(done=True)


def varied_reward(completions, **kwargs) -> list[float]:
    """A reward that differs between siblings, so GRPO's advantages (and gradients) are not zero."""
    return [float(len(completion_text(c)) % 5) for c in completions]


def test_grpo_trainer_runs_on_srt_rollouts(tmp_path, smollm2_tokenizer):
    model = tiny_random_model("llama", dtype=torch.float32, tokenizer=smollm2_tokenizer, seed=5).model
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {a} + {a}?"}], "ground_truth": str(2 * a)} for a in (3, 4)]
    )
    config = EnvConfig(
        max_turns=2,
        max_tokens_per_turn=6,
        max_response_tokens=40,
        engine={"drafter": "srt", "device": "cpu", "max_batch": 8, "max_context": 512},
    )
    tool = FunctionTool("lookup", lambda query: "found: 42")
    rollout = SRTRolloutFunc(config, env_class=OneToolCallEnv, tools={"lookup": tool})
    outputs, synced = [], []

    def recording_rollout(prompts, trainer):
        out = rollout(prompts, trainer)
        engine = rollout.controller.engine.engine
        trained = trainer.accelerator.unwrap_model(trainer.model).state_dict()
        synced.append(all(torch.equal(v, trained[k]) for k, v in engine.loaded.model.state_dict().items()))
        outputs.append(out)
        return out

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=2,
        max_completion_length=40,
        learning_rate=1e-2,
        report_to=[],
        logging_steps=1,
        use_cpu=True,
        save_strategy="no",
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[varied_reward, retool_reward],
        args=args,
        train_dataset=data,
        processing_class=smollm2_tokenizer,
        rollout_func=recording_rollout,
    )
    try:
        trainer.train()
        assert len(outputs) == 2 and all(synced)  # every rollout ran the trainer's current policy
        for out in outputs:
            assert len(out["completion_ids"]) == 4 and out["num_turns"] == [4] * 4  # prompt, turn, tool, turn
            for ids, mask, logprobs in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
                assert len(ids) == len(mask) == len(logprobs) <= 40
                assert 0 in mask and mask[0] == 1  # model tokens, then the masked tool output
                assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)
                forced = smollm2_tokenizer.decode([t for t, m in zip(ids, mask) if not m])
                assert forced == interpreter_block("found: 42")
        logged = trainer.state.log_history[0]
        model_tokens = [sum(m) for m in outputs[0]["env_mask"]]
        assert logged["completions/mean_length"] == pytest.approx(sum(model_tokens) / 4)  # TRL counted env_mask
        assert logged["grad_norm"] > 0
        moved = trainer.accelerator.unwrap_model(trainer.model).state_dict()
        assert any(not torch.equal(initial[k], moved[k]) for k in initial)  # the policy trained
        cache = rollout.controller.engine.engine.drafter.cache
        # both prompts came back in the second step: each tree holds both steps' siblings
        assert cache.stats().prompts == 2 and all(len(cache.sequences(k)) == 4 for k in cache.prompt_keys())
    finally:
        rollout.close()
