"""The sums behind TRL 1.16's clip metrics (`clip_ratio/*`, `cispo_clip_ratio`): which loss types log which, and
one micro-batch's counts. torch only; `losses.grpo_loss` calls it, run/metrics.py turns the sums into TRL's keys.
"""

from __future__ import annotations

import torch

CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # TRL logs clip_ratio/* for these, cispo_clip_ratio for cispo


def clip_metrics(low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor, level: str, cispo_only: bool = False) -> dict:
    """Sums behind TRL 1.16's clip metrics (`_compute_loss`) for one micro-batch.

    TRL's `global_masked_mean`: over the active tokens at importance_sampling_level
    "token", over the micro-batch's sequences (one ratio each) at "sequence";
    its `clip_ratio/low_min` / `high_max`: the least / greatest per-sequence
    fraction (sequences with no active token left out; +inf / −inf where none has one, so
    the window's min / max skips the micro-batch and a window without any logs None, as TRL's nanmin).

    Args:
        low, high: (B, T) bool, the `Objective`'s clip flags (one value per sequence at "sequence").
        mask: (B, T) loss mask.
        level: importance_sampling_level.
        cispo_only: cispo's one metric (TRL's `cispo_clip_ratio`, from `high`).
    Returns:
        Tensors: clip_units (the denominator), and clip_low, clip_high, clip_region,
        clip_low_min, clip_high_max, or cispo_clipped alone.
    """
    active = mask.bool()
    low, high = low & active, high & active
    if level == "sequence":  # one value per sequence: a sequence counts once, whatever its length
        low, high, active = low.any(-1, keepdim=True), high.any(-1, keepdim=True), torch.ones(len(mask), 1, dtype=torch.bool, device=mask.device)
    units = active.sum().float()
    if cispo_only:
        return {"cispo_clipped": high.sum().float(), "clip_units": units}
    rows = active.any(-1)
    per_seq = lambda flags: flags.sum(-1).float()[rows] / active.sum(-1)[rows]  # noqa: E731
    none = lambda sign: torch.tensor(sign * float("inf"), device=mask.device)  # noqa: E731 (no sequence: the reduction's neutral value)
    return {
        "clip_low": low.sum().float(), "clip_high": high.sum().float(), "clip_region": (low | high).sum().float(), "clip_units": units,
        "clip_low_min": per_seq(low).min() if rows.any() else none(1), "clip_high_max": per_seq(high).max() if rows.any() else none(-1),
    }
