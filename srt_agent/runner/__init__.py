"""Running a causal LM over batches of token trees: the model runner, its KV cache and tree attention, the
position-keyed sampler and the device facts. Below drafting (a drafter that runs a model uses it) and the engine."""
