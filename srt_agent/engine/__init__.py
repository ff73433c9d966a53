"""Batched, lossless speculative generation: sequences, scheduler, model runner, sampler, cost model."""

from .async_engine import AsyncEngine, SteppingEngine
from .engine import Engine
from .params import RequestMetrics, RequestOutput, SamplingParams

__all__ = ["AsyncEngine", "Engine", "RequestMetrics", "RequestOutput", "SamplingParams", "SteppingEngine"]
