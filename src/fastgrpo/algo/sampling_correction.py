"""The sampler–trainer mismatch: TRL 1.16's importance-sampling correction and off-policy sequence mask.

The sampler generates from its own weight copy (bf16, generation/weight_copy.py), so the
probability a token was sampled with, μ_s(y), differs slightly from π_old(y),
the trainer's. TRL corrects the same gap for vLLM (`vllm_importance_sampling_*`,
grpo_trainer.py `_generate_and_score_completions`); these are its formulas,
applied to fastgrpo's sampler:

    token modes:     w_t = exp(log π_old(y_t) − log μ_s(y_t))        (B, T)
    sequence modes:  w   = exp(Σ_t log π_old(y_t) − log μ_s(y_t))     (B, 1)
    *_truncate:      w ← clamp(w, C_min, C_max)          (truncated IS, Ionides 2008)
    *_mask:          w ← 0 where w < C_min or w > C_max  (masked IS)

and the per-token policy loss is multiplied by w. `off_policy_mask` is
DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, eq. 9): a
sequence with Â < 0 whose mean KL(μ_s‖π_θ) estimate exceeds δ carries no loss.

Pure functions over tensors; no config, no `.item()`. Not here: where the
trainer applies them (trainer.py `_optimizer_step`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

def importance_sampling_ratio(
    old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str, clip_min: float | None, clip_max: float | None
) -> torch.Tensor:
    """TRL's `vllm_importance_sampling_ratio`: π_old / μ_s per token or sequence, truncated or masked.

    Args:
        old_logps: (B, T) log π_old of the sampled tokens (the trainer's).
        sampling_logps: (B, T) log μ_s, the sampler's; NaN where it has none (ratio 1 there, as TRL).
        mask: (B, T) completion mask.
        mode: one of `config_checks.IMPORTANCE_SAMPLING_MODES`.
        clip_min, clip_max: C_min, C_max (None: no bound on that side).
    Returns:
        (B, T) for token modes, (B, 1) for sequence modes; no gradient flows
        (π_old and μ_s are constants of the rollout).
    """
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)  # (B, T)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)  # (B, 1)
    ratio = torch.exp(diff)
    if mode.endswith("_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def mismatch_metrics(old_logps: torch.Tensor, sampling_logps: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor) -> dict:
    """Sums and extremes behind TRL's `sampling/*` metrics for one micro-batch.

    Args:
        old_logps, sampling_logps, mask: (B, T) as in `importance_sampling_ratio`.
        ratio: its output, (B, T) or (B, 1).
    Returns:
        Tensors: `logp_diff_sum`, `logp_diff_count` (|log π_old − log μ_s| over
        masked tokens with a sampler log-prob), `logp_diff_max`; `is_ratio_sum`,
        `is_ratio_count`, `is_ratio_min`, `is_ratio_max` and `is_masked` (ratios
        set to 0) over masked tokens (token modes) or all sequences (sequence
        modes), as TRL flattens them.
    """
    delta = (old_logps - sampling_logps).abs()
    delta = delta[mask.bool() & ~torch.isnan(delta)]
    flat = ratio.flatten() if ratio.shape[-1] == 1 else ratio[mask.bool()]
    zero = torch.zeros((), device=ratio.device)
    return {
        "logp_diff_sum": delta.sum(), "logp_diff_count": torch.tensor(float(delta.numel())),
        "logp_diff_max": delta.max() if delta.numel() else zero,
        "is_ratio_sum": flat.sum(), "is_ratio_count": torch.tensor(float(flat.numel())),
        "is_ratio_min": flat.min() if flat.numel() else zero, "is_ratio_max": flat.max() if flat.numel() else zero,
        "is_masked": (flat == 0).sum().float(),
    }


def behaviour_metrics(logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor) -> dict:
    """Sums behind TRL 1.16 AsyncGRPOTrainer's `ratio` and `kl`: π_θ against the sampler's log-probs μ_s.

    TRL's async loss takes μ_s as its π_old, so the ratio it logs is exp(log π_θ − log μ_s) and its kl the k3
    estimate (ratio − 1) − log ratio, each a token mean over the loss tokens (its `compute_loss`); tokens
    without a sampler log-prob (NaN) are left out.

    Args:
        logps, sampling_logps, mask: (B, T): log π_θ (detached), log μ_s (NaN where none), the loss mask.
    Returns:
        Tensors: `behaviour_ratio_sum`, `behaviour_kl_sum`, `behaviour_tokens`.
    """
    log_ratio = logps - sampling_logps
    keep = mask.bool() & ~torch.isnan(log_ratio)
    log_ratio = log_ratio[keep]
    ratio = torch.exp(log_ratio)
    return {"behaviour_ratio_sum": ratio.sum(), "behaviour_kl_sum": ((ratio - 1) - log_ratio).sum(), "behaviour_tokens": keep.sum().float()}


def off_policy_mask(
    advantages: torch.Tensor, per_token_logps: torch.Tensor, sampling_per_token_logps: torch.Tensor, mask: torch.Tensor,
    off_policy_threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask, TRL's `GRPOTrainer.get_off_policy_mask` (same signature).

    Args:
        advantages: (B, 1) Â.
        per_token_logps: (B, T) log π_θ (detached here).
        sampling_per_token_logps: (B, T) log-probs the tokens were sampled with
            (the sampler's, else π_old's); NaN tokens count as KL 0.
        mask: (B, T) completion mask.
        off_policy_threshold: δ.
    Returns:
        (B, 1) in mask's dtype: 1 keeps the sequence (Â ≥ 0, or mean
        log μ_s − log π_θ over its tokens ≤ δ), 0 drops it.
    """
    kl_div = torch.nan_to_num(sampling_per_token_logps - per_token_logps.detach(), nan=0.0)
    avg_seq_kl = (kl_div * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (avg_seq_kl <= off_policy_threshold)).to(dtype=mask.dtype)


class SamplingCorrection(NamedTuple):
    """The correction one run applies: GRPOConfig's fields of the same names, as plain values.

    Call: `(advantages (B,), logps (B, T), old_logps (B, T), sampling_logps (B, T) or None, mask (B, T))
    → (weight or None, metrics, vespo_ratio or None)`: the factor on the per-token policy loss — TRL's
    IS ratio where the correction is on and the sampler has log-probs of its own,
    times the off-policy mask where `off_policy_mask_threshold` is set (on the
    sampler's log-probs, else π_old's, as TRL) — and `mismatch_metrics` ({} without
    sampler log-probs). For loss_type="vespo" the IS ratio is not a factor on the
    loss but `vespo_ratio`, folded into vespo's sequence weight φ(w) (TRL's
    `get_gamma_weights(importance_sampling_ratio=…)`). Order and products as TRL's `_compute_loss`.
    """

    correction: bool
    mode: str
    clip_min: float | None
    clip_max: float | None
    off_policy_threshold: float | None
    into_vespo: bool = False  # loss_type == "vespo": the ratio goes into φ(w), not onto the loss

    @classmethod
    def from_config(cls, args, own_weights: bool = False, rollout_func: bool = False) -> SamplingCorrection:
        """The values of a `GRPOConfig`'s fields of the same names; `own_weights`: the sampler samples from its own copy (TRL's use_vllm);
        `rollout_func`: a user's rollout_func returns the log-probs, whose IS ratio TRL applies only under use_vllm (without
        vLLM it trains on them as π_θ's own: placeholder log-probs of 0 made every ratio ≈ 1e-19, and nothing trained);
        the off-policy mask still reads them, as TRL's.

        Raises:
            ValueError: loss_type="vespo" with the correction on, a sampler of its own weights and a sequence mode:
                φ(w) folds in per-token ratios, so TRL 1.16 refuses it in the same words (token modes train).
        """
        if own_weights and args.loss_type == "vespo" and args.vllm_importance_sampling_correction \
                and args.vllm_importance_sampling_mode not in ("token_truncate", "token_mask"):
            raise ValueError(
                "VESPO loss requires `vllm_importance_sampling_mode` to be either 'token_truncate' or 'token_mask'. "
                f"Got: {args.vllm_importance_sampling_mode} (TRL's check: the sampler samples from its own bf16 weights here; "
                "or set vllm_importance_sampling_correction=False, or bf16=False)."
            )
        correction = args.vllm_importance_sampling_correction and (args.use_vllm or not rollout_func)
        return cls(correction, args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
                   args.vllm_importance_sampling_clip_max, args.off_policy_mask_threshold, args.loss_type == "vespo")

    def __call__(self, advantages, logps, old_logps, sampling_logps, mask) -> tuple[torch.Tensor | None, dict, torch.Tensor | None]:
        weight, metrics, vespo_ratio = None, {}, None
        if self.off_policy_threshold is not None:
            sampled = sampling_logps if sampling_logps is not None else old_logps
            weight = off_policy_mask(advantages.unsqueeze(-1), logps, sampled, mask, self.off_policy_threshold)
        if self.correction and sampling_logps is not None:
            ratio = importance_sampling_ratio(old_logps, sampling_logps, mask, self.mode, self.clip_min, self.clip_max)
            metrics = mismatch_metrics(old_logps, sampling_logps, ratio, mask)
            if self.into_vespo:
                vespo_ratio = ratio
            else:
                weight = ratio if weight is None else weight * ratio
        return weight, metrics, vespo_ratio
