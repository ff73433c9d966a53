"""TRL integration (`pip install 'srt-agent[trl]'`): a rollout_func for GRPOTrainer and a ReTool reward."""
