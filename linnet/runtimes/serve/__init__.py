"""The serving engine: continuous batching of many requests over one backend's `StepModel` (engine.py), its
scheduler (scheduler.py) and stop conditions (stops.py). Backend-neutral: numpy only.

    engine = Engine(model.step_model(), model.tokenizer(), max_queue=256)
    engine.start()
    handle = engine.submit(Request(prompt_ids, SamplingParams(temperature=0.7, seed=1), max_tokens=64))
    for event in handle.events():  # Delta(text, token_ids) ..., then Finished(finish_reason, usage, timings)
        ...
    engine.shutdown()
"""

from .engine import ContextLengthExceeded, Delta, Engine, EngineStats, Finished, QueueFull, Request, RequestHandle
from .scheduler import Scheduler, StepPlan
from .stops import TextStream

__all__ = [
    "ContextLengthExceeded",
    "Delta",
    "Engine",
    "EngineStats",
    "Finished",
    "QueueFull",
    "Request",
    "RequestHandle",
    "Scheduler",
    "StepPlan",
    "TextStream",
]
