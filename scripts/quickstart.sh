#!/usr/bin/env bash
# Set up what the main job needs (scripts/setup.sh main), then run it: ReTool cold start + GRPO with SRT
# rollouts on the embedded SmolLM2, every step's generation timed against plain decoding (--compare none).
# Extra arguments go to `srt-agent train` (e.g. --steps 8, --algorithm dapo, --out runs/mine, --verbose).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
exec .venv/bin/srt-agent train envs/retool_train.yaml --compare none "$@"
