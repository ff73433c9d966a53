"""Every drafter, one a module: SRT, the comparison drafters (n-gram, suffix, history, arctic, SPEC-RL) and
those that run a model (self, srt+self). The registry (``drafting.registry``) builds them by name."""
