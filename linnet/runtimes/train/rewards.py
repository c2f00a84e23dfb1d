"""GRPO's reward functions: the user's Python functions, named by import path (`--reward module:function`), called
with TRL's reward-function signature (trl/trainer/grpo_trainer.py, `GRPOTrainer._calculate_rewards`):

    reward(prompts=[...], completions=[...], completion_ids=[[...], ...], **columns) -> list[float]

one entry per completion (each prompt repeated once per completion of its group), `columns` the row's other
fields as lists aligned with `prompts` (e.g. a dataset's `answer`). Text rows pass text; token-id rows pass the
ids (`prompt_ids` as prompts, completion ids as completions).

A function that cannot be imported, raises, or returns something else than one number per completion is a
`TrainError` naming the function and, when it raised, the data row (file:line) whose completions it was scoring.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from linnet.errors import TrainError

__all__ = ["RewardFunction", "load_reward"]


def load_reward(spec: str | Callable) -> RewardFunction:
    """`spec` "package.module:function" (or a callable) as a `RewardFunction`; the current folder is searched for
    the module first, as `python -m` would (the `linnet` script does not put it on `sys.path`). Raises TrainError
    for a spec without `:`, a module that cannot be imported (with its error), or a name that is not a callable."""
    if callable(spec):
        return RewardFunction(spec, getattr(spec, "__qualname__", repr(spec)))
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise TrainError(f"--reward must be `module:function` (a Python import path), got {spec!r}")
    module_name, name = spec.split(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` resolves: a module in the current folder is found first
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the user's module: any import-time error is theirs
        raise TrainError(f"--reward {spec}: cannot import `{module_name}` ({type(err).__name__}: {err})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        what = "has no" if fn is None else "has a non-callable"
        raise TrainError(f"--reward {spec}: module `{module_name}` {what} `{name}`")
    return RewardFunction(fn, spec)


class RewardFunction:
    """A user's reward function with the checks around its calls (`name` is how messages call it)."""

    def __init__(self, fn: Callable, name: str):
        self.fn = fn
        self.name = name

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[list[int]],
        columns: dict[str, list[Any]],
        wheres: Sequence[str],
    ) -> list[float]:
        """Score every completion (`wheres[i]`: the "file:line" of completion i's row). Returns floats.
        Raises TrainError naming the function, and the row when it raised."""
        try:
            scores = self.fn(prompts=list(prompts), completions=list(completions),
                             completion_ids=[list(c) for c in completion_ids], **columns)  # fmt: skip
        except Exception as err:  # the user's code: any exception is reported as theirs, located
            where = self._failing_row(prompts, completions, completion_ids, columns, wheres) or wheres[0]
            raise TrainError(
                f"{where}: reward function {self.name} raised {type(err).__name__}: {err} "
                "(scoring this row's completions)"
            ) from err
        return self._checked(scores, len(completions))

    def _checked(self, scores: Any, n: int) -> list[float]:
        if not isinstance(scores, Sequence) or isinstance(scores, (str, bytes)) or len(scores) != n:
            got = f"{len(scores)} values" if isinstance(scores, Sequence) else type(scores).__name__
            raise TrainError(f"reward function {self.name} must return one number per completion ({n}), got {got}")
        out = []
        for i, s in enumerate(scores):
            if isinstance(s, bool) or not isinstance(s, (int, float)) or math.isnan(float(s)):
                raise TrainError(f"reward function {self.name} returned {s!r} for completion {i}, not a number")
            out.append(float(s))
        return out

    def _failing_row(self, prompts, completions, completion_ids, columns, wheres) -> str | None:
        """The first row whose completions alone make the function raise (each row is called on its own)."""
        for where in dict.fromkeys(wheres):
            idx = [i for i, w in enumerate(wheres) if w == where]
            try:
                self.fn(prompts=[prompts[i] for i in idx], completions=[completions[i] for i in idx],
                        completion_ids=[list(completion_ids[i]) for i in idx],
                        **{k: [v[i] for i in idx] for k, v in columns.items()})  # fmt: skip
            except Exception:  # the row that fails alone
                return where
        return None
