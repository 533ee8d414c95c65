"""TRL's hooks for reward functions: `log_metric` (a scalar averaged over the logging window) and `log_extra`
(a column of this rollout's completions.jsonl rows), passed to every reward function as keywords.

Not here: the window and the files they end up in (metrics.py), calling reward functions (rollout/rewards.py).
"""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from collections.abc import Callable, Collection
from contextlib import contextmanager

import numpy as np
import torch

from .metrics import USER_COUNT, USER_SUM, Window, taken_name


class RewardHooks:
    """TRL's `log_metric` and `log_extra` for reward functions.

    `log_metric(name, value)` adds a scalar that is averaged over the logging
    window (all processes; every process must log the same names) and logged
    as `name` (during an evaluation: its window, logged as `eval_<name>`, `into`); `log_extra(column, values)` adds a
    column (N values) to this rollout's rows in completions.jsonl. `kwargs()`: the keywords every reward function receives.

    Args:
        window: the trainer's current logging window.
        state: the trainer's TrainerState.
        logged: the names the trainer's records hold, as known now (every record's, and the last record's); default none.
    """

    def __init__(self, window: Callable[[], Window], state: Callable[[], object], logged: Callable[[], Collection[str]] = lambda: ()):
        self.window, self.state, self.logged = window, state, logged
        self.columns: dict[str, list] = defaultdict(list)
        self.names: set[str] = set()  # log_metric's names so far (the last record holds them too)
        self.target: Window | None = None  # an evaluation's window, while `into` holds it

    @contextmanager
    def into(self, window: Window):
        """log_metric's values go to `window` inside (an evaluation's: TRL logs them in its eval record as `eval_<name>`)."""
        self.target = window
        try:
            yield
        finally:
            self.target = None

    def kwargs(self) -> dict:
        """Extra keywords every reward function receives, as TRL passes them: trainer_state, log_extra, log_metric."""
        return {"trainer_state": self.state(), "log_extra": self.log_extra, "log_metric": self.log_metric}

    def log_metric(self, name: str, value: float) -> None:
        """Add `value` to the window's mean of `name` (TRL's `_log_metric`). A NaN is left out of the mean, and a window
        of NaNs only logs None (TRL's `log()` drops NaN means, then logs None: a bare NaN in metrics.jsonl breaks JSON readers).

        Raises:
            TypeError: a name that is not a string, or a value that is not one real number (a 0-d tensor or array is
                one): `log_metric("m", None)` failed in float() with words naming neither (TRL: in its sum() after scoring).
            ValueError: a name the trainer logs itself (`loss`, `reward`, `rewards/<fn>/mean`, …: TRL merges the two), at
                the call when `logged` has it, else when the window is logged (`metrics.window_record`: a name only this
                config's records hold, before the first log).
        """
        if not isinstance(name, str):
            raise TypeError(f"log_metric(name={name!r}, …): give the metric's name as a string.")
        if name not in self.names and name in self.logged():
            raise taken_name(name)
        if isinstance(value, (np.ndarray, torch.Tensor, np.generic)) and value.ndim == 0:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"log_metric({name!r}, {value!r:.80}): the value has type {type(value).__name__}; give one number.")
        counted, window = not math.isnan(value), self.target if self.target is not None else self.window()
        window.add(f"{name}{USER_SUM}", value if counted else 0.0)
        window.add(f"{name}{USER_COUNT}", int(counted))
        self.names.add(name)

    def log_extra(self, column: str, values: list) -> None:
        """Add `values` (one per completion scored) as `column` of this rollout's completions rows, as TRL's `_log_completion_extra`.

        Several reward functions may log one column: the last one's values are kept (TRL's table, a deque of one
        generation batch, keeps them). A column named like one of completions.jsonl's own fields (`COMPLETION_FIELDS`)
        is kept in TRL's parquet table as TRL keeps it and left out of completions.jsonl, whose own fields win (its
        `step` is what a resume cuts the file back by).
        """
        self.columns[column].extend(values)

    def pop_columns(self) -> dict[str, list]:
        """The columns logged since the last pop (one rollout's), then reset."""
        out, self.columns = dict(self.columns), defaultdict(list)
        return out
