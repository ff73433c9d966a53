"""Files on disk: atomic writes of files and folders (checkpoints, rollout trees, model directories). The bottom
layer: it imports nothing of the package, so every layer may use it."""
