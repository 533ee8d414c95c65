"""Advantages: per-function rewards of a rollout → one Â per completion, as pure tensor functions.

Rewards are shaped (num_prompts, G) (or (num_prompts, G, R) per function) so
the group is in the shape; NaN marks a reward that does not apply. The
statistics that span the whole rollout (the "batch" std, GDPO's final
normalisation) come in through a `gather` callable, so each process computes
its own share exactly as one process holding everything would (TRL 1.16's
advantage block; tests/test_trl_parity.py runs it as the oracle).

Not here: calling reward functions (rewards.py), the loss (losses.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def nan_stats(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased (n − 1) std of the non-NaN entries along `dim` (kept), TRL's nanmean/nanstd.

    NaN marks a reward that does not apply. With fewer than 2 entries the std is 0
    (TRL's is NaN; either way such a group gets Â = 0, see `no_signal`).
    """
    present = ~torch.isnan(x)
    count = present.sum(dim, keepdim=True)
    mean = torch.where(present, x, 0.0).sum(dim, keepdim=True) / count.clamp(min=1)
    var = torch.where(present, (x - mean) ** 2, 0.0).sum(dim, keepdim=True) / (count - 1).clamp(min=1)
    return mean, var.sqrt()


def no_signal(x: torch.Tensor, dim: int) -> torch.Tensor:
    """True where the non-NaN entries along `dim` (kept) are all equal, or absent: nothing to compare.

    Compared with the max of the present entries, so such a group gets Â = 0
    exactly, never a float residue of the mean divided by a tiny std.
    """
    present = ~torch.isnan(x)
    top = torch.where(present, x, -torch.inf).amax(dim, keepdim=True)
    return torch.where(present, x == top, True).all(dim, keepdim=True)


def group_advantages(
    rewards: torch.Tensor, scale_rewards: str = "group", batch_std: torch.Tensor | None = None, eps: float = 1e-4
) -> torch.Tensor:
    """Group-relative advantages Â = (r − mean_group) / (std + eps).

    DeepSeekMath (arXiv 2402.03300) §4.1.2, outcome supervision. The std is the
    unbiased (n − 1) one, as in TRL. A NaN reward (an unscorable completion)
    is left out of its group's mean and std and gets Â = 0, as in TRL 1.16.

    Args:
        rewards: (num_prompts, G) total reward per completion, NaN = unscorable.
        scale_rewards: "group" (std within the group), "batch" (std of the
            whole rollout, `batch_std`), "none" (no scaling; Dr. GRPO).
        batch_std: scalar tensor, the std over the rollout on all processes;
            required for "batch".
        eps: added to the std (TRL: 1e-4).
    Returns:
        (num_prompts, G). A group whose rewards are all equal gets exactly 0.
    Raises:
        ValueError: unknown `scale_rewards`, or "batch" without `batch_std`.
    """
    mean, std = nan_stats(rewards, 1)
    if scale_rewards == "group":
        scale = std + eps
    elif scale_rewards == "batch":
        if batch_std is None:
            raise ValueError("scale_rewards='batch' needs batch_std, the std of all rewards of the rollout.")
        scale = batch_std + eps
    elif scale_rewards == "none":
        scale = torch.ones_like(mean)
    else:
        raise ValueError(f"scale_rewards={scale_rewards!r}: use 'group', 'batch' or 'none'.")
    keep = ~torch.isnan(rewards) & ~no_signal(rewards, 1)
    return torch.where(keep, (rewards - mean) / scale, 0.0)


def weighted_rewards(rewards: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_k w_k r_k over the reward functions, NaN (= not applicable) skipped.

    Args:
        rewards: (N, R), NaN where a function returned None.
        weights: (R,).
    Returns:
        (N,) weighted sum (TRL's `nansum` behaviour).
    """
    return torch.nansum(rewards * weights, dim=-1)


def normalize_then_sum(rewards: torch.Tensor, weights: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """GDPO: normalise each reward within its group, then take the weighted sum.

    Each reward k gets its own group advantage (r_k − mean_group) / (std_group
    + eps), so a reward with a large range cannot drown a small one (GDPO,
    "Group reward-Decoupled normalization Policy Optimization", arXiv 2601.05242).
    NaN entries (not applicable) contribute 0.

    Args:
        rewards: (num_prompts, G, R).
        weights: (R,).
    Returns:
        (num_prompts, G) weighted sums (`batch_normalize` makes them advantages).
    """
    mean, std = nan_stats(rewards, 1)
    keep = ~torch.isnan(rewards) & ~no_signal(rewards, 1)
    return (torch.where(keep, (rewards - mean) / (std + eps), 0.0) * weights).sum(dim=-1)


def batch_normalize(values: torch.Tensor, everyone: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(x − mean) / (std + eps) with the mean and unbiased std of the whole rollout.

    GDPO's last step (arXiv 2601.05242, as TRL 1.16's `normalize_then_sum`):
    after `normalize_then_sum`, the weighted sums are normalised once more over
    the batch, so Â has unit scale whatever the weights.

    Args:
        values: (N,) this process's weighted sums; NaN = unscorable (Â = 0).
        everyone: (N·world_size,) the same on all processes (gathered); NaN left out.
    Returns:
        (N,) advantages. A rollout whose sums are all equal gets exactly 0.
    """
    mean, std = nan_stats(everyone, 0)
    if bool(no_signal(everyone, 0).all()):
        return torch.zeros_like(values)
    return torch.where(torch.isnan(values), 0.0, (values - mean) / (std + eps))


def rollout_advantages(
    rewards: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    scale_rewards: str,
    aggregation: str,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Â for this process's completions from their per-function rewards (TRL 1.16's advantage block).

    "sum_then_normalize": weighted sum, then `group_advantages` (the "batch"
    std over every process). "normalize_then_sum": `normalize_then_sum`, then
    `batch_normalize` over every process (GDPO).

    A completion for which every function returned None is unscorable: it is
    left out of every mean and std and gets Â = 0 (TRL 1.16).

    Args:
        rewards: (N, R), NaN where a function does not apply; groups of G contiguous.
        weights: (R,).
        gather: (N,) → (N·world_size,), every process's values (identity on one process).
    Returns:
        (N,) advantages.
    Raises:
        ValueError: unknown `scale_rewards` or `aggregation`.
    """
    unscorable = torch.isnan(rewards).all(dim=-1)  # every function returned None: Â = 0, in no baseline (TRL)
    if aggregation == "normalize_then_sum":
        summed = normalize_then_sum(rewards.view(-1, num_generations, rewards.shape[1]), weights).view(-1)
        summed = torch.where(unscorable, torch.nan, summed)
        return batch_normalize(summed, gather(summed))
    if aggregation != "sum_then_normalize":
        raise ValueError(f"multi_objective_aggregation={aggregation!r}: use 'sum_then_normalize' or 'normalize_then_sum'.")
    total = torch.where(unscorable, torch.nan, weighted_rewards(rewards, weights))
    batch_std = nan_stats(gather(total), 0)[1] if scale_rewards == "batch" else None
    return group_advantages(total.view(-1, num_generations), scale_rewards, batch_std).view(-1)
