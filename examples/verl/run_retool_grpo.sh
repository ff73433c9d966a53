#!/usr/bin/env bash
# ReTool-style GRPO with verl on a GPU node (or a Ray cluster: run it on the head node).
#   bash examples/verl/run_retool_grpo.sh                    # srt-agent's engine, prompt affinity
#   ROLLOUT=vllm_suffix bash examples/verl/run_retool_grpo.sh   # baseline: vLLM + suffix decoding
#   ROLLOUT=vllm_srt bash examples/verl/run_retool_grpo.sh      # verl's vLLM rollout with SRT as its proposer
# Needs: pip install 'srt-agent[verl]' (plus vllm and arctic-inference for the baseline), a SandboxFusion
# server for the code interpreter (`srt-agent sandbox serve --port 8080` or ByteDance's Docker image),
# and data in verl's parquet layout (prompt, data_source, reward_model.ground_truth), e.g. the DAPO-Math
# and AIME sets verl's ReTool recipe uses.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
TRAIN=${TRAIN:-$HOME/data/dapo_math/train.parquet}
VAL=${VAL:-$HOME/data/aime_2025/test.parquet}
ROLLOUT=${ROLLOUT:-srt}
GPUS=${GPUS:-8}
NODES=${NODES:-1}
SANDBOX=${SANDBOX:-http://localhost:8080/run_code}

TOOLS=$(mktemp --suffix=.yaml)
sed "s#http://localhost:8080/run_code#${SANDBOX}#" tools/code_interpreter_verl_sandbox_fusion.yaml > "$TOOLS"

python3 -m verl.trainer.main_ppo \
    --config-path="$PWD/examples/verl" --config-name=retool_grpo \
    rollout_backend="$ROLLOUT" \
    actor_rollout_ref.model.path="$MODEL" \
    data.train_files="$TRAIN" data.val_files="$VAL" \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOLS" \
    trainer.n_gpus_per_node="$GPUS" trainer.nnodes="$NODES" \
    "$@"
