"""The per-token objectives of the GRPO family: one signature, selected by `loss_type`.

Every objective maps (log ρ, log π_θ, Â, hyper-parameters) to a (B, T)
per-token loss and the tokens its clip or weight acted on; losses.py pairs
each with an aggregation in `LOSS_TYPES` and reduces it. Shapes: B sequences
of a micro-batch, T completion tokens. Pure tensor functions: no config, no
trainer state, no `.item()`; hand-worked values in tests/test_losses.py and
tests/test_parity_by_hand.py, TRL 1.16's own code as the oracle in
tests/test_trl_parity.py.

Not here: importance ratios, KL and aggregation (losses.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class ObjectiveParams(NamedTuple):
    """The hyper-parameters of every objective (each reads the ones it has; TRL's defaults)."""

    epsilon_low: float = 0.2  # ε: lower clip 1 − ε
    epsilon_high: float = 0.2  # upper clip 1 + ε_high (cispo: the weight's bound itself, ScaleRL's ε_max, as TRL)
    delta: float | None = None  # two-sided clip: ρ ≤ δ on the unclipped branch
    temperature_pos: float = 1.0  # SAPO τ for Â > 0
    temperature_neg: float = 1.05  # SAPO τ for Â ≤ 0
    vespo_k_pos: float = 2.0  # VESPO kernel for Â ≥ 0: power k (down-weights w < 1)
    vespo_lambda_pos: float = 3.0  # … and decay λ (down-weights w > 1)
    vespo_k_neg: float = 3.0  # VESPO kernel for Â < 0
    vespo_lambda_neg: float = 2.0
    vespo_ratio: torch.Tensor | None = None  # (B, T) or (B, 1) the sampler–trainer IS ratio π_old/μ_s folded into w (TRL's)


class Objective(NamedTuple):
    """A per-token objective's output: all (B, T) unless noted."""

    loss: torch.Tensor  # per-token loss (to be minimised)
    clipped_low: torch.Tensor  # bool: lower bound active (gradient zeroed / weight truncated)
    clipped_high: torch.Tensor  # bool: upper bound active
    seq_weight: torch.Tensor | None = None  # (B, 1) a per-sequence weight (VESPO's φ(w)), for its metric


def clipped_surrogate(log_ratio, logps, advantages, params: ObjectiveParams) -> Objective:
    """PPO/GRPO clipped surrogate: −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â).

    DeepSeekMath eq. (3) per token; clip-higher ε_high from DAPO (arXiv
    2503.14476) eq. (10); optional two-sided bound ρ ≤ δ on the unclipped
    branch (INTELLECT-2, arXiv 2505.07291 §3.3), which matters for Â < 0 where
    the min would otherwise let ρÂ grow without bound.

    Args:
        log_ratio: (B, T) log ρ (from `losses.log_importance_weights`).
        logps: (B, T) log π_θ (unused here; part of the uniform signature).
        advantages: (B, 1) or (B, T) Â.
    Returns:
        `Objective`; `clipped_low` marks Â < 0 tokens with ρ < 1 − ε_low,
        `clipped_high` marks Â > 0 tokens with ρ > 1 + ε_high: TRL's
        `clip_ratio/low_mean` and `/high_mean` (the tokens δ bounds, Â < 0 with
        ρ > δ, are not counted, as TRL counts them not either).
    """
    p = params
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - p.epsilon_low, 1 + p.epsilon_high)
    unclipped = ratio if p.delta is None else torch.clamp(ratio, max=p.delta)
    loss = -torch.min(unclipped * advantages, clipped * advantages)
    low = (ratio < 1 - p.epsilon_low) & (advantages < 0)
    high = (ratio > 1 + p.epsilon_high) & (advantages > 0)
    return Objective(loss, low, high)


def cispo(log_ratio, logps, advantages, params: ObjectiveParams) -> Objective:
    """CISPO: −sg[min(ρ, ε_high)] · Â · log π_θ, as TRL 1.16 computes it.

    MiniMax-M1 (arXiv 2506.13585) eq. (4)–(5) with no lower bound, as the
    paper uses it: the importance weight is clipped and detached, so every
    token keeps a gradient (none is zeroed, unlike the PPO clip). The bound is
    `epsilon_high` itself, ScaleRL's ε_max (arXiv 2510.13786; 5.0 recommended),
    which the MiniMax-M1 paper writes 1 + ε_high^IS: TRL's field, TRL's meaning.

    Returns:
        `Objective`; `clipped_high` marks Â > 0 tokens whose weight was truncated (TRL's `cispo_clip_ratio`).
    """
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, max=params.epsilon_high).detach()
    loss = -weight * advantages * logps
    return Objective(loss, torch.zeros_like(ratio, dtype=torch.bool), (ratio > params.epsilon_high) & (advantages > 0))


def sapo(log_ratio, logps, advantages, params: ObjectiveParams) -> Objective:
    """SAPO: a soft, temperature-gated ratio instead of the hard clip.

    Soft Adaptive Policy Optimization (arXiv 2511.20347) eq. (5): per token
    −f_τ(ρ)·Â with f_τ(ρ) = 4·σ(τ(ρ − 1))/τ, τ = τ_pos for Â > 0 and τ_neg
    otherwise. f_τ(1) = 2/τ and f_τ'(1) = 1, so on-policy the gradient is the
    plain policy gradient; off-policy it decays smoothly instead of dropping to 0.

    Returns:
        `Objective` with no hard clipping (both masks all False).
    """
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(advantages, params.temperature_pos), torch.full_like(advantages, params.temperature_neg))
    gate = 4 * torch.sigmoid(tau * (ratio - 1)) / tau
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return Objective(-gate * advantages, none, none)


# VESPO's clamps, TRL 1.16's (`get_gamma_weights`, after the paper's code): per-token log ρ
# in [−20, 20], the sequence's log w in [log 1e-8, 20], λ ≥ 1e-4.
_LOG_RATIO_BOUND, _LOG_W_MIN, _LOG_W_MAX, _LAMBDA_MIN = 20.0, math.log(1e-8), 20.0, 1e-4


def vespo(log_ratio, logps, advantages, params: ObjectiveParams) -> Objective:
    """VESPO: −sg[φ(w)] · Â · log π_θ, a smooth Gamma kernel on the sequence's importance weight.

    Variational sEquence-level Soft Policy Optimization (arXiv 2602.10693): the
    weight is the whole sequence's ratio w = π_θ(o)/π_old(o) = Π_t ρ_t (no
    length normalisation, unlike GSPO), reshaped by the closed-form kernel

        φ(w) = w^k · e^{λ(1 − w)}    (φ(1) = 1; k, λ = k_pos, λ_pos for Â ≥ 0, else k_neg, λ_neg)

    which rises as w^k below w = 1 and decays as e^{−λw} above it, in place of a
    hard clip. φ is detached, so the gradient is φ(w)·Â·∇log π_θ per token. As
    TRL 1.16 computes it: in log space, log ρ_t clamped to [−20, 20] before the
    sum, log w clamped to [log 1e-8, 20], λ ≥ 1e-4, a non-finite φ read as 0.
    With the sampler–trainer correction (`params.vespo_ratio`), w is the ratio to
    the sampler's distribution: Σ_t log ρ_t + Σ log(π_old/μ_s), each log ratio
    clamped to [log 1e-8, 20] (TRL 1.16 folds it in so; the loss is not weighted by it).

    Args:
        log_ratio: (B, T) per-token log ρ, 0 at masked positions (token level).
        logps: (B, T) log π_θ, with gradient.
        advantages: (B, 1) Â.
    Returns:
        `Objective` with no hard clipping (both masks all False) and
        `seq_weight` = φ(w), (B, 1), detached.
    """
    p = params
    with torch.no_grad():
        log_w = log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND).sum(-1, keepdim=True)  # (B, 1) Σ_t log ρ_t
        if p.vespo_ratio is not None:  # w = π_θ/π_old · π_old/μ_s, the sampler's ratio in log space (TRL's clamp)
            log_w = log_w + torch.log(p.vespo_ratio).clamp(_LOG_W_MIN, _LOG_W_MAX).sum(-1, keepdim=True)
        log_w = log_w.clamp(_LOG_W_MIN, _LOG_W_MAX)
        nonneg = advantages >= 0
        k = torch.where(nonneg, torch.full_like(advantages, p.vespo_k_pos), torch.full_like(advantages, p.vespo_k_neg))
        lam = torch.where(nonneg, torch.full_like(advantages, p.vespo_lambda_pos), torch.full_like(advantages, p.vespo_lambda_neg))
        lam = lam.clamp(min=_LAMBDA_MIN)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # (B, 1)
    none = torch.zeros_like(log_ratio, dtype=torch.bool)
    return Objective(-phi * advantages * logps, none, none, phi)
