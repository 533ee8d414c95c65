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

from collections.abc import Callable, Mapping, Sequence

import torch

from .metrics import PhaseTimer, Window, reward_stats, rollout_metrics
from ..rollout.record import Rollout

# (rows, timer) → (rollout with Â, reward functions' log_extra columns): sampled and scored as for training.
Sample = Callable[[list[dict], PhaseTimer], tuple[Rollout, dict]]


def eval_metric_names(set_names: Sequence[str], reward_names: list[str], metric_key_prefix: str = "eval") -> list[str]:
    """The keys `mean_rewards` reports for these eval sets (each function's only when it applied to a completion).

    Args:
        set_names: "eval" or "eval_<name>" per set (dataset_kinds.eval_sets' keys).
        reward_names: the reward functions' log names.
        metric_key_prefix: replaces "eval" in each set's name.
    """
    names = []
    for set_name in set_names:
        prefix = metric_key_prefix + set_name[len("eval") :]
        names += [f"{prefix}_loss", f"{prefix}_reward", *(f"{prefix}_rewards/{n}/{part}" for n in reward_names for part in ("mean", "std"))]
    return names


def check_best_metric(metric_for_best_model: str | None, set_names: Sequence[str], reward_names: list[str]) -> None:
    """Refuse a `metric_for_best_model` no evaluation of these sets reports, before the model loads.

    transformers' rule: a name without the "eval_" prefix gets it (`reward` → `eval_reward`).
    Raises:
        ValueError: the metric is not one of `eval_metric_names` (it used to fail at the first evaluation,
            after training steps were spent), naming the metric and the ones there are.
    """
    if metric_for_best_model is None:
        return
    key = metric_for_best_model if metric_for_best_model.startswith("eval_") else f"eval_{metric_for_best_model}"
    names = eval_metric_names(set_names, reward_names)
    if key not in names:
        raise ValueError(f"metric_for_best_model={metric_for_best_model!r}: evaluation reports {', '.join(names)}; use one of them.")


def mean_rewards(
    sets: Mapping[str, Sequence[dict]], metric_key_prefix: str, sample: Sample, *, reward_names: list[str],
    reward_weights: torch.Tensor, num_generations: int, batch_size: int, accelerator, on_batch: Callable[[], None] = lambda: None,
    loss: Callable[[Rollout], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Mean weighted reward and each reward function's mean, per eval dataset, over all processes.

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
        loss: a sampled batch → its 0-d loss (TRL's prediction_step); None: no loss.
    Returns:
        {"<prefix>_loss": the batches' losses averaged over completions (with `loss`), "<prefix>_reward": mean weighted reward per completion (0.0 for none), "<prefix>_rewards/<fn>/mean"
        and "/std": each function over the completions it applied to (not None; left out for none)} (TRL's names).
    """
    acc, prompts_per_call = accelerator, max(batch_size // num_generations, 1)
    metrics = {}
    for set_name, dataset in sets.items():
        prefix = metric_key_prefix + set_name[len("eval") :]  # "eval" or "eval_<name>" → "<prefix>[_<name>]" (as eval_metric_names)
        dataset = dataset if hasattr(dataset, "__len__") else list(dataset)  # an IterableDataset: read through
        rows = [dataset[i] for i in range(acc.process_index, len(dataset), acc.num_processes)]
        window = Window()  # the same keys on every process, even one without eval rows
        for key in ["reward_sum", "completions", "loss_sum", "loss_completions"] + [f"rewards/{n}_{part}" for n in reward_names for part in ("sum", "sqsum", "count")]:
            window.add(key, 0.0)
        for start in range(0, len(rows), prompts_per_call):
            # No advantages (nothing trains on these); log_extra columns describe training rollouts only.
            rollout, _ = sample(rows[start : start + prompts_per_call], PhaseTimer())
            values = rollout_metrics(rollout, reward_names, reward_weights, num_generations)
            for key in list(window.sums):
                if key in values:
                    window.add(key, values[key])
            if loss is not None:  # transformers' evaluation loop: each batch's loss repeated per sample, then the mean
                window.add("loss_sum", float(loss(rollout)) * len(rollout))
                window.add("loss_completions", len(rollout))
            on_batch()
        sums, _ = window.reduce(acc)
        if loss is not None:
            metrics[f"{prefix}_loss"] = sums["loss_sum"] / max(sums["loss_completions"], 1)
        metrics[f"{prefix}_reward"] = sums["reward_sum"] / max(sums["completions"], 1)
        metrics.update(reward_stats(sums, reward_names, f"{prefix}_rewards"))
    return metrics
