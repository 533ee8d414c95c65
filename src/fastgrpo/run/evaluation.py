"""Evaluation: the mean reward of G sampled completions per eval prompt, and TRL's eval loss, over all processes.

`mean_rewards` gives each process every num_processes-th row of each eval
dataset, samples and scores them in chunks of `per_device_eval_batch_size`
completions, and sums over all processes before dividing, so every process
returns the same means and a process without rows still joins the reduction.
Nothing here trains: the loss of each sampled batch is TRL's eval-mode loss (ρ = 1, no gradient;
update/step.OptimizerStep.eval_loss), averaged over completions as transformers' evaluation loop
averages `prediction_step`'s losses.

Not here: which objects are eval datasets (dataset_kinds.eval_sets), when
evaluation runs (`eval_strategy`, trainer.py), writing the metrics (metrics.py).
"""

from __future__ import annotations

import difflib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager, nullcontext

import torch
from transformers.trainer_utils import speed_metrics

from .metrics import PhaseTimer, Window, rollout_metrics, window_record
from ..algo.clip_metrics import CLIPPED_LOSS_TYPES
from ..rollout.record import Rollout

# (rows, timer) → (rollout with Â, reward functions' log_extra columns): sampled and scored as for training.
Sample = Callable[[list[dict], PhaseTimer], tuple[Rollout, dict]]


ALWAYS_REPORTED = (  # eval keys every evaluation reports, whatever the loss (`loss_keys` adds the loss's own)
    "loss", "reward", "reward_std", "frac_reward_zero_std", "frac_reward_none", "completions/mean_length", "completions/min_length",
    "completions/max_length", "completions/clipped_ratio", "completions/mean_terminated_length", "completions/min_terminated_length",
    "completions/max_terminated_length", "entropy", "num_tokens", "runtime", "samples_per_second", "steps_per_second",
)


def loss_keys(loss_type: str, beta: float) -> tuple[str, ...]:
    """The eval keys the loss adds (as training logs them): TRL's clip_ratio/* for the clipped losses, cispo_clip_ratio
    for cispo, kl with β > 0."""
    clip = ("clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean", "clip_ratio/high_max", "clip_ratio/region_mean")
    clipped = clip if loss_type in CLIPPED_LOSS_TYPES else ("cispo_clip_ratio",) if loss_type == "cispo" else ()
    return (*clipped, *(("kl",) if beta > 0 else ()))


def eval_metric_names(set_names: Sequence[str], reward_names: list[str], metric_key_prefix: str = "eval", extra: Sequence[str] = ()) -> list[str]:
    """The keys `mean_rewards` reports for these eval sets, as `metric_for_best_model` may name them.

    Args:
        set_names: "eval" or "eval_<name>" per set (dataset_kinds.eval_sets' keys).
        reward_names: the reward functions' log names (each function's mean and std: NaN where it applied to no completion).
        metric_key_prefix: replaces "eval" in each set's name.
        extra: the loss's keys (`loss_keys`).
    """
    names = []
    for set_name in set_names:
        prefix = metric_key_prefix + set_name[len("eval") :]
        names += [f"{prefix}_{key}" for key in (*ALWAYS_REPORTED, *extra)]
        names += [f"{prefix}_rewards/{n}/{part}" for n in reward_names for part in ("mean", "std")]
    return names


def check_best_metric(metric_for_best_model: str | None, set_names: Sequence[str], reward_names: list[str], extra: Sequence[str] = ()) -> None:
    """Refuse a `metric_for_best_model` no evaluation of these sets reports, before the model loads.

    transformers' rule: a name without the "eval_" prefix gets it (`reward` → `eval_reward`).
    Raises:
        ValueError: the metric is not one of `eval_metric_names` (it used to fail at the first evaluation,
            after training steps were spent), naming the metric and the ones there are.
    """
    if metric_for_best_model is None:
        return
    key = metric_for_best_model if metric_for_best_model.startswith("eval_") else f"eval_{metric_for_best_model}"
    names = eval_metric_names(set_names, reward_names, extra=extra)
    if key not in names:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        keys = eval_metric_names(["eval"], reward_names, "", extra)  # each set's keys without its prefix: "_loss", "_reward", …
        raise ValueError(f"metric_for_best_model={metric_for_best_model!r}: {hint}evaluation reports, for {', '.join(set_names)}: "
                         f"{', '.join(keys)}; use one of them.")


def mean_rewards(
    sets: Mapping[str, Sequence[dict]], metric_key_prefix: str, sample: Sample, *, reward_names: list[str],
    reward_weights: torch.Tensor, num_generations: int, batch_size: int, accelerator, on_batch: Callable[[], None] = lambda: None,
    loss: Callable[[Rollout], tuple[torch.Tensor, dict]] | None = None, on_set: Callable[[Sequence[dict]], None] = lambda rows: None,
    into: Callable[[Window], ContextManager] = lambda window: nullcontext(),
) -> dict[str, float]:
    """TRL's eval metrics per eval dataset, over all processes: the rewards, completion lengths, the loss and its terms, speed.

    Args:
        sets: {"eval": rows} or {"eval_<name>": rows} (dataset_kinds.eval_sets); an iterable without
            random access (an IterableDataset) is read through once, as TRL's eval dataloader reads it.
        metric_key_prefix: replaces "eval" in each set's name (transformers' argument).
        sample: G scored completions per row, as the trainer samples for training.
        reward_names: the R reward functions' log names.
        reward_weights: (R,) weights of the weighted sum (TRL's reward_weights).
        num_generations: G, completions per prompt.
        batch_size: per_device_eval_batch_size, completions per `sample` call (at least one prompt's G).
        accelerator: splits the rows and sums the metrics over processes.
        on_batch: called after each `sample` call (the trainer's on_prediction_step).
        loss: a sampled batch → its 0-d loss and metric sums (TRL's prediction_step; OptimizerStep.eval_loss); None: no loss.
        on_set: called with each set's rows (all processes'; an IterableDataset's read through) before its first batch
            (the trainer hands the callbacks that set's eval_dataloader, as Trainer's evaluation_loop does).
        into: a set's window → a context inside which each batch is sampled: the reward functions' `log_metric` values
            go to that window (RewardHooks.into), logged as `<prefix>_<name>` as TRL's eval mode logs them.
    Returns:
        {"<prefix>_<key>"} with TRL's keys, as its eval mode logs them: loss (the batches' losses averaged over
        completions, with `loss`), reward and reward_std (weighted, over the completions some function applied to),
        rewards/<fn>/mean and /std (each over the completions it applied to; NaN where it applied to none, as TRL),
        frac_reward_zero_std, completions/mean_length, min/max_length, clipped_ratio, mean/min/max_terminated_length,
        entropy, clip_ratio/* and kl (with `loss`, as training logs them; `metrics.window_record`), the reward functions'
        `log_metric` names (`into`), and
        transformers' runtime, samples_per_second and steps_per_second (`speed_metrics`: eval prompts, as transformers
        counts len(eval_dataset), and sampled batches).
    """
    acc, prompts_per_call = accelerator, max(batch_size // num_generations, 1)
    metrics = {}
    for set_name, dataset in sets.items():
        prefix = metric_key_prefix + set_name[len("eval") :]  # "eval" or "eval_<name>" → "<prefix>[_<name>]" (as eval_metric_names)
        start_time = time.time()
        dataset = dataset if hasattr(dataset, "__len__") else list(dataset)  # an IterableDataset: read through
        on_set(dataset)
        rows = [dataset[i] for i in range(acc.process_index, len(dataset), acc.num_processes)]
        window = Window()
        for key in ("completions", "loss_sum", "loss_completions", "batches"):  # the denominators, on a process without rows too
            window.add(key, 0.0)
        for start in range(0, len(rows), prompts_per_call):
            # Nothing trains on these: their Â and log_extra columns go to the completions buffer only (the caller's `sample`).
            with into(window):
                rollout, _ = sample(rows[start : start + prompts_per_call], PhaseTimer())
            window.record(rollout_metrics(rollout, reward_names, reward_weights, num_generations))
            window.add("batches", 1)
            if loss is not None:  # transformers' evaluation loop: each batch's loss repeated per sample, then the mean
                value, terms = loss(rollout)
                window.record(terms)
                window.add("loss_sum", float(value) * len(rollout))
                window.add("loss_completions", len(rollout))
            on_batch()
        window.align(acc)  # a process with fewer rows (or none) holds fewer keys
        sums, extremes = window.reduce(acc)
        record = window_record(0, sums, extremes, {}, reward_names)
        record.pop("step")
        record.pop("truncated_prompts", None)  # not one of TRL's eval keys
        head = {"loss": sums["loss_sum"] / max(sums["loss_completions"], 1)} if loss is not None else {}
        record = {**head, "reward": None, **record}  # None where no completion was scored (TRL's log() of its nanmean's NaN)
        for name in reward_names:  # a function that applied to no eval completion: None, as TRL's log() gives
            record.setdefault(f"rewards/{name}/mean", None)
            record.setdefault(f"rewards/{name}/std", None)
        batches = math.ceil(sums.pop("batches") / acc.num_processes)  # sampled batches per process (transformers' eval steps)
        metrics.update({f"{prefix}_{k}": v for k, v in record.items()})
        metrics.update(speed_metrics(prefix, start_time, num_samples=len(dataset), num_steps=batches))  # samples: prompts, as len(eval_dataset)
    return metrics
