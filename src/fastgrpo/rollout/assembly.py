"""One training rollout, assembled from what it needs: prompts drawn, completions produced and scored, rounds, Â.

`RolloutAssembly` holds the parts (built once by `build_assembly`): the prompt draw (this process's share of the
data order), the producer (collect.py / producers.py: single turn, agents, rollout_func — it holds the generation
backend), the reward functions (rewards.score with TRL's extra keywords), the sampling rounds (group_filter.py:
one batch, or DAPO's rounds with their carry-over, which get π_behaviour for carried groups from the log-prob pass
passed in) and the advantage function. Â is set once, on the rollout that trains. Nothing here calls back into the
trainer; π_old and π_ref are the log-prob passes' (update/).

Not here: the log-prob passes (update/passes.py), the advantage maths (algo/advantages.py), metrics (run/metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from ..algo.advantages import rollout_advantages
from .collect import collect
from .group_filter import sampling_rounds
from .record import Rollout
from .rewards import score


def advantages_of(args, reward_weights: torch.Tensor, gather: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
    """(N, R) rewards → (N,) Â with the config's G, scale_rewards and multi_objective_aggregation, statistics over all processes."""

    def advantages(rewards: torch.Tensor) -> torch.Tensor:
        return rollout_advantages(
            rewards.to(reward_weights.device), reward_weights, args.num_generations, args.scale_rewards,
            args.multi_objective_aggregation, gather=gather,
        )

    return advantages


class RolloutAssembly:
    """This process's next training rollout, or B scored groups of any rows (evaluation).

    Args:
        draw: a number of prompts per process → this process's rows of the next draw.
        producer: (rows, G) → `Generated` (producers.build_producer).
        reward_funcs: the reward functions (rewards.py's protocol).
        reward_kwargs: () → the extra keywords every reward function receives (TRL's trainer_state, log_extra, log_metric).
        pop_columns: () → the log_extra columns the reward functions logged since the last call.
        rounds: `OneBatch` or `DynamicSampling` (group_filter.sampling_rounds): sampling rounds and Â.
        num_generations: G.
        timer: the phase timer ("generate", "score").
    """

    def __init__(self, draw, producer, reward_funcs, reward_kwargs, pop_columns, rounds, num_generations: int, timer):
        self.draw, self.producer, self.reward_funcs, self.reward_kwargs = draw, producer, reward_funcs, reward_kwargs
        self.pop_columns, self.rounds, self.num_generations, self.timer = pop_columns, rounds, num_generations, timer

    def __call__(self) -> tuple[Rollout, dict, dict]:
        """(rollout with Â, no π_old/π_ref; its log_extra columns; window sums of the rounds, e.g. DAPO's ds_*)."""
        return self.rounds(lambda prompts: self.score_rows(self.draw(prompts), self.num_generations, self.timer))

    def score_rows(self, rows: list[dict], num_generations: int, timer) -> tuple[Rollout, dict]:
        """B rows → a Rollout of B·G scored completions without Â, and the log_extra columns the rewards logged.

        Raises:
            ValueError: a log_extra column without one value per completion from each reward function that logged it
                (it would land on the wrong rows).
        """
        rollout = collect(
            rows, num_generations=num_generations, produce=self.producer,
            score=partial(score, self.reward_funcs, reward_kwargs=self.reward_kwargs()), timer=timer,
        )
        columns = self.pop_columns()
        for column, values in columns.items():
            if not values or len(values) % len(rollout):
                raise ValueError(f"log_extra({column!r}, …) logged {len(values)} values for the {len(rollout)} completions scored; log one "
                                 "value per completion (the `completions` the reward function received).")
            columns[column] = values[-len(rollout):]  # several reward functions logged it: the last one's, as TRL's table keeps it
        return rollout, columns

    def state_dict(self):
        """The rounds' state (DAPO's carry-over buffer), part of a checkpoint."""
        return self.rounds.state_dict()

    def load_state_dict(self, state) -> None:
        """Restore `state_dict()`."""
        self.rounds.load_state_dict(state)


def build_assembly(
    args, accelerator, *, draw, producer, reward_funcs, reward_names, reward_weights, reward_kwargs, pop_columns, behaviour_logps, timer,
) -> RolloutAssembly:
    """The `RolloutAssembly` of a run (its arguments as `RolloutAssembly`'s).

    Args:
        behaviour_logps: (a Rollout, its micro-batch row slices) → (N, T) log-probs under the current policy,
            no collectives: π_behaviour of groups DAPO carries to a later rollout (update/passes.py).
    Raises:
        ValueError: a filter_groups_metric that names nothing (group_filter.resolve_filter).
    """
    advantages = advantages_of(args, reward_weights, accelerator.gather)
    rounds = sampling_rounds(args, accelerator, reward_names, reward_weights, advantages, behaviour_logps)
    return RolloutAssembly(draw, producer, reward_funcs, reward_kwargs, pop_columns, rounds, args.num_generations, timer)
