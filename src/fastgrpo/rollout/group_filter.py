"""Rollout producers: one batch of groups, or DAPO's dynamic sampling (only groups with reward spread).

A producer turns `sample(prompts, advantages)` — this process's share of the
next `prompts × world_size` prompts, generated and scored into a `Rollout`
(the trainer's single-turn sampler, or any other way of making groups) — into
the rollout one update trains on, plus the reward functions' log_extra
columns and the sums it logs. `OneBatch` samples once (TRL's behaviour).
`DynamicSampling` (DAPO, arXiv 2503.14476 §3.2, "dynamic sampling"; verl's
`algorithm.filter_groups`) keeps only groups whose rewards differ, since a
group of equal rewards has Â = 0 and teaches nothing:

1. Carried groups first: surplus informative groups of earlier rollouts, at
   most `max_age` rollouts old, oldest first.
2. Rounds: every process samples `n` prompts, where `n` is the largest
   shortfall of any process divided by the keep rate of the last round (all
   processes), at most 2 × the share; the groups with spread are kept in
   sampling order. Rounds stop when every process holds its share, or after
   `max_rounds` (verl's `max_num_gen_batches`). Every process samples in every
   round (the data order is shared) and each round's decision is one gather of
   three numbers per process, so collectives always line up.
3. The rollout is the first `share` kept groups (carried, then fresh, each in
   order). The rest is carried over (at most `share` groups), with its
   log-probs under the policy that sampled it computed now, before any update:
   they become that group's π_old, so the PPO ratio of a carried group is
   π_θ / π_behaviour, clipped like any other (PPO's own off-policy correction);
   `max_age = 0` drops the surplus instead (verl).
4. At the cap, every process trains on K groups, the fewest any process holds
   (the rest is carried); the trainer splits them into the usual number of
   micro-batches (`rollout.micro_batch_rows`), so every process makes the same
   optimizer steps, and the loss normalisers count the smaller batch (dapo's
   tokens, grpo's sequences). With K below `min_groups` (a micro-batch would
   be empty; K = 0 when nothing at all had spread: a solved task, every group
   all right, or a hopeless one) every process trains on a full rollout: its
   groups with spread, then groups without, in sampling order — the batch TRL
   trains on without a filter, whose equal-reward groups have Â = 0 and add
   no policy gradient (β·KL and the entropy bonus still act). It warns once
   per run and logs `dynamic_sampling/filled_fraction`; a learned task never
   ends the run with an exception (verl raises there instead).

Advantages are computed once the rollout is assembled: a group's own mean
and std ("group", "none") do not depend on which other groups were kept; the
"batch" std and GDPO's batch normalisation are taken over the kept rollout on
all processes (the batch that trains).

Not here: drawing prompts and generating (assembly.py, collect.py), the
advantage maths (algo/advantages.py), the loss (algo/losses.py).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import torch

from ..algo.advantages import no_signal
from ..tasks import import_module
from .record import Rollout, concat, micro_batch_rows

# prompts per process → (this process's share of them sampled and scored: a Rollout without Â, π_old, π_ref; log_extra columns)
DrawAndScore = Callable[[int], tuple[Rollout, dict]]


def informative_groups(rewards: torch.Tensor, weights: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Which groups get a non-zero Â: DAPO's filter 0 < acc < 1, generalised to any reward (exact equality).

    Args:
        rewards: (num_groups, G, R) per-function rewards, NaN = not applicable.
        weights: (R,) reward weights.
        aggregation: "sum_then_normalize" (a group needs spread in its weighted
            total, what its Â is computed from) or "normalize_then_sum" (GDPO:
            spread in any one function's rewards).
    Returns:
        (num_groups,) bool, True where the group has spread.
    """
    if aggregation == "normalize_then_sum":
        return (~no_signal(rewards, 1)).squeeze(1).any(-1)
    unscorable = torch.isnan(rewards).all(-1)
    total = torch.where(unscorable, torch.nan, torch.nansum(rewards * weights, -1))  # (num_groups, G), as advantages.py
    return ~no_signal(total, 1).squeeze(1)


def resolve_filter(spec: str | None, reward_names: list[str], weights: torch.Tensor, aggregation: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The group filter: (num_groups, G, R) rewards → (num_groups,) bool keep.

    Args:
        spec: None (`informative_groups`), a reward function's name (spread in
            that function's rewards alone, verl's `filter_groups.metric`), or
            "module:function" (a callable with this same signature).
    Raises:
        ValueError: a name that is no reward function and no importable "module:function".
    """
    if spec is None:
        return lambda rewards: informative_groups(rewards, weights.to(rewards.device), aggregation)
    if spec in reward_names:
        k = reward_names.index(spec)
        return lambda rewards: ~no_signal(rewards[..., k], 1).squeeze(1)
    module, _, name = spec.partition(":")
    try:
        return getattr(import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(
            f"filter_groups_metric={spec!r} is neither a reward function ({', '.join(reward_names)}) nor an importable "
            f"'module:function' ({err}); give one of those, or None for spread in the total reward."
        ) from None


class OneBatch:
    """One sampling round of `share` prompts per process, Â from that batch: TRL's rollout."""

    def __init__(self, share: int, advantages: Callable[[torch.Tensor], torch.Tensor]):
        self.share, self.advantages = share, advantages

    def __call__(self, sample: DrawAndScore) -> tuple[Rollout, dict, dict]:
        """This process's rollout with Â, its log_extra columns, and no window sums."""
        rollout, extra = sample(self.share)
        return dataclasses.replace(rollout, advantages=self.advantages(rollout.rewards)), extra, {}

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state) -> None:
        pass


class DynamicSampling:
    """DAPO's dynamic sampling with carry-over (module docstring); one instance per process.

    Args:
        share: groups per process per rollout (generation_batch_size / G / world_size).
        num_generations: G.
        keep: (num_groups, G, R) rewards → (num_groups,) bool (`resolve_filter`).
        advantages: (N, R) rewards of the assembled rollout → (N,) Â (all processes' statistics).
        behaviour_logps: a Rollout → (N, T) log-probs of its completion tokens under the current policy (NaN past them).
        weights: (R,) reward weights (for the logged reward before filtering).
        gather: (k,) tensor → (world_size · k,), every process's values (identity on one process).
        max_rounds: sampling rounds per rollout at most (max_num_gen_batches).
        max_age: rollouts a surplus group may wait; 0: surplus is dropped.
        min_groups: fewest groups that fill every micro-batch (below it, at the cap: groups without spread fill the rollout).
    """

    def __init__(
        self, share: int, num_generations: int, keep, advantages, behaviour_logps, weights, gather, max_rounds: int, max_age: int,
        min_groups: int,
    ):
        self.share, self.G, self.keep, self.advantages, self.weights = share, num_generations, keep, advantages, weights
        self.behaviour_logps, self.gather = behaviour_logps, gather
        self.max_rounds, self.max_age, self.min_groups = max_rounds, max_age, min_groups
        self.keep_rate, self.rollouts = 1.0, 0  # keep rate of the last round (all processes); rollouts made
        self.warned = False  # the cap's fill has been warned about (once per run)
        self.carry: Rollout | None = None  # surplus groups with their behaviour log-probs as old_logps
        self.carry_born: list[int] = []  # per carried group: the rollout that sampled it
        self.carry_extra: dict = {}  # their log_extra columns

    def __call__(self, sample: DrawAndScore) -> tuple[Rollout, dict, dict]:
        """This process's rollout of informative groups, its log_extra columns, and the window sums it adds.

        Warns:
            UserWarning: once per run, the first time the cap is reached with fewer than `min_groups` groups with
                spread on some process, and groups without spread fill the rollout (module docstring, step 4).
        """
        self.rollouts += 1
        G = self.G
        carried, born, carried_extra, dropped = self._aged_carry()
        fresh: list[tuple[Rollout, dict]] = []
        rejected: list[tuple[Rollout, dict]] = []  # the rounds' groups without spread: what fills a rollout at the cap
        sums = {"ds_rounds": 0, "ds_sampled_groups": 0, "ds_kept_groups": 0, "ds_zero_std_sampled": 0, "ds_reward_sampled": 0.0,
                "ds_completions_sampled": 0, "ds_carried_groups": len(born), "ds_dropped_groups": dropped, "ds_at_cap": 0,
                "ds_filled_groups": 0}
        have, kept, prompts = len(born), 0, 0
        while True:  # one gather per round, the same decision on every process: (shortfall, kept, sampled) of each
            everyone = self.gather(torch.tensor([self.share - have, kept, prompts], dtype=torch.float64)).view(-1, 3)
            if prompts:  # the last round's keep rate over all processes; 0 kept: the largest round next
                self.keep_rate = max(float(everyone[:, 1].sum() / everyone[:, 2].sum()), 1 / (2 * self.share))
            need = int(everyone[:, 0].max())
            if need <= 0 or sums["ds_rounds"] == self.max_rounds:
                break
            prompts = min(math.ceil(need / self.keep_rate), 2 * self.share)
            rollout, extra = sample(prompts)
            rewards = rollout.rewards.view(prompts, G, -1)
            keep = self.keep(rewards).to(torch.bool).cpu()
            for part, groups in ((fresh, keep), (rejected, ~keep)):
                rows = (torch.nonzero(groups).view(-1, 1) * G + torch.arange(G)).view(-1)
                part.append((rollout.take(rows), {k: [v[i] for i in rows.tolist()] for k, v in extra.items()}))
            kept = int(keep.sum())
            have += kept
            sums["ds_rounds"] += 1
            sums["ds_sampled_groups"] += prompts
            sums["ds_kept_groups"] += kept
            total = torch.nansum(rewards * self.weights.to(rewards.device), -1)  # (prompts, G), as rollout_metrics
            sums["ds_zero_std_sampled"] += int((total == total[:, :1]).all(1).sum())
            sums["ds_reward_sampled"] += float(total.sum())
            sums["ds_completions_sampled"] += len(rollout)
        use, fill = self.share, 0
        if need > 0:  # the cap: everyone trains on the fewest groups any process holds
            use = int(self.share - everyone[:, 0].max())
            sums["ds_at_cap"] = 1
            if use < self.min_groups:  # too few to fill a step: a full rollout, groups without spread after those with
                use = min(have, self.share)
                fill = self.share - use
                self._warn_filled(sums, int(self.share - everyone[:, 0].max()))
        parts = ([(carried, carried_extra)] if carried is not None else []) + fresh
        rows_by_part = [p.completion_ids.shape[0] for p, _ in parts]
        whole = concat([p for p, _ in parts])  # never empty: a carry that fills the rollout, or at least one round
        extra = _concat_extra([e for _, e in parts], rows_by_part)
        born = born + [self.rollouts] * (sum(rows_by_part) // G - len(born))
        trained, trained_extra = whole.take(torch.arange(use * G)), {k: v[: use * G] for k, v in extra.items()}
        sums["ds_dropped_groups"] += self._keep_surplus(whole, born, extra, use)
        if fill:  # every process has sampled at least `share` groups, so the rejected ones cover the shortfall
            filler = concat([p for p, _ in rejected]).take(torch.arange(fill * G))
            filler_extra = _concat_extra([e for _, e in rejected], [p.completion_ids.shape[0] for p, _ in rejected])
            trained_extra = _concat_extra([trained_extra, {k: v[: fill * G] for k, v in filler_extra.items()}], [use * G, fill * G])
            trained = concat([trained, dataclasses.replace(filler, old_logps=None)]) if use else filler
            sums["ds_filled_groups"] = fill
        trained = dataclasses.replace(trained, advantages=self.advantages(trained.rewards))
        return trained, trained_extra, sums

    def _warn_filled(self, sums: dict, fewest: int) -> None:
        """The cap's fill, said once per run (later ones are in `dynamic_sampling/filled_fraction`)."""
        if self.warned:
            return
        self.warned = True
        mean = sums["ds_reward_sampled"] / max(sums["ds_completions_sampled"], 1)
        warnings.warn(
            f"dynamic sampling: after max_num_gen_batches={self.max_rounds} rounds ({sums['ds_sampled_groups']} prompts sampled "
            f"on this process, mean reward {mean:.3g}) a process holds {fewest} group(s) with reward spread, fewer than the "
            f"{self.min_groups} a step needs; this rollout is filled with groups whose rewards are all equal (Â = 0, no policy "
            "gradient: what training without filter_groups would do). All right: the prompts are solved — stop, or use harder "
            "ones; all wrong: easier prompts or a reward with partial credit. dynamic_sampling/filled_fraction logs how often.",
            stacklevel=2,
        )

    def _aged_carry(self) -> tuple[Rollout | None, list[int], dict, int]:
        """The carried groups still young enough (≤ max_age rollouts), and how many aged out."""
        if self.carry is None:
            return None, [], {}, 0
        young = [i for i, b in enumerate(self.carry_born) if self.rollouts - b <= self.max_age]
        dropped = len(self.carry_born) - len(young)
        if not young:
            return None, [], {}, dropped
        rows = (torch.tensor(young).view(-1, 1) * self.G + torch.arange(self.G)).view(-1)
        extra = {k: [v[i] for i in rows.tolist()] for k, v in self.carry_extra.items()}
        return self.carry.take(rows), [self.carry_born[i] for i in young], extra, dropped

    def _keep_surplus(self, whole: Rollout, born: list[int], extra: dict, use: int) -> int:
        """Carry the groups after the first `use` (at most `share` of them, none when max_age = 0); returns how many were dropped.

        Those sampled in this rollout get log π_behaviour (the policy has not moved
        since it sampled them) as old_logps; carried ones keep theirs.
        """
        keep = min(len(born) - use, self.share) if self.max_age > 0 else 0
        if keep <= 0:
            self.carry, self.carry_born, self.carry_extra = None, [], {}
            return len(born) - use
        rows = torch.arange(use * self.G, (use + keep) * self.G)
        surplus = whole.take(rows)
        old = surplus.old_logps
        if old is None:
            old = torch.full(surplus.completion_ids.shape, float("nan"), device=surplus.completion_ids.device)
        new = torch.tensor([b == self.rollouts for b in born[use : use + keep]]).repeat_interleave(self.G)  # sampled now
        if bool(new.any()):  # the policy has not moved since it sampled them
            old = old.clone()
            old[new.to(old.device)] = self.behaviour_logps(surplus.take(torch.nonzero(new).view(-1))).to(old.device)
        self.carry = dataclasses.replace(surplus, old_logps=old, advantages=None)  # Â: set on the rollout that trains on them
        self.carry_born = born[use : use + keep]
        self.carry_extra = {k: v[use * self.G : (use + keep) * self.G] for k, v in extra.items()}
        return len(born) - use - keep

    def state_dict(self) -> dict:
        """This process's carry buffer and the sizing state: part of the checkpoint, so a resume continues exactly."""
        return {"keep_rate": self.keep_rate, "rollouts": self.rollouts, "carry": self.carry, "carry_born": self.carry_born,
                "carry_extra": self.carry_extra}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore `state_dict()`; None (a checkpoint from another number of processes) starts with an empty buffer."""
        if state is not None:
            self.keep_rate, self.rollouts, self.carry = state["keep_rate"], state["rollouts"], state["carry"]
            self.carry_born, self.carry_extra = state["carry_born"], state["carry_extra"]


def sampling_rounds(args, accelerator, reward_names: list[str], reward_weights: torch.Tensor, advantages, behaviour_logps):
    """`DynamicSampling` when `args.filter_groups`, else `OneBatch`: how many rounds make one rollout, and its Â.

    Args:
        args: the GRPOConfig (read here, never inside the producers).
        accelerator: world size, rank and the gather of the round decisions.
        advantages: (N, R) rewards → (N,) Â over all processes (assembly.advantages_of).
        behaviour_logps: (a Rollout, its micro-batch row slices) → (N, T) log-probs under the current
            policy, with no collectives (run in micro-batches of per_device_train_batch_size).
    Raises:
        ValueError: a filter_groups_metric that names nothing (`resolve_filter`).
    """
    share = args.prompts_per_rollout // accelerator.num_processes
    if not args.filter_groups:
        return OneBatch(share, advantages)
    keep = resolve_filter(args.filter_groups_metric, reward_names, reward_weights, args.multi_objective_aggregation)
    gather = lambda t: accelerator.gather(t.to(accelerator.device)).cpu()  # noqa: E731
    size = args.per_device_train_batch_size
    behaviour = lambda r: behaviour_logps(r, micro_batch_rows(len(r), math.ceil(len(r) / size)))  # noqa: E731
    return DynamicSampling(
        share, args.num_generations, keep, advantages, behaviour, reward_weights, gather, args.max_num_gen_batches,
        args.filter_groups_max_age, min_groups=math.ceil(args.steps_per_generation / args.num_generations),
    )


def _concat_extra(columns: list[dict], rows: list[int]) -> dict:
    """log_extra columns of consecutive parts (rows each), a missing column filled with None."""
    names = list(dict.fromkeys(k for c in columns for k in c))
    return {k: [x for c, n in zip(columns, rows) for x in c.get(k, [None] * n)] for k in names}
