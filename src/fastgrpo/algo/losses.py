"""The GRPO maths as pure tensor functions: log-probs, importance ratios, KL
estimators, loss aggregation and the entropy bonus.

Shapes: B sequences (completions) in a micro-batch, T completion tokens, V the
vocabulary; G completions per prompt. Every function takes tensors and plain
numbers and returns tensors; none reads a config, the trainer or calls
`.item()`, so each is testable on a 2×3 example by hand (tests/test_losses.py).

The split follows STYLE.md: a per-token objective makes a (B, T) loss; an
aggregation reduces it by `loss_type` (`LOSS_TYPES`) with normalisers fixed
for the optimizer step (`StepCounts`). Masked positions never contribute,
whatever they hold (`masked`).

Not here: the per-token objectives (objectives.py), advantages
(advantages.py), the adaptive entropy coefficient (entropy_control.py), the
model forward (trainer.py), reward calling (rewards.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .clip_metrics import CLIPPED_LOSS_TYPES, clip_metrics
from .objectives import ObjectiveParams, cispo, clipped_surrogate, sapo, vespo

# ---------------------------------------------------------------------------
# log-probs and entropy
# ---------------------------------------------------------------------------


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[index] without a full (B, T, V) log-softmax tensor.

    Args:
        logits: (B, T, V), already divided by the sampling temperature.
        index: (B, T) token ids whose log-probs are wanted.
    Returns:
        (B, T) log-probs. Computed one sequence at a time as
        `logit[index] − logsumexp(logit)`, so the peak extra memory is one
        (T, V) row instead of (B, T, V) (the same trick as TRL's helper).
    """
    picked = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1)  # (B, T)
    logsumexp = torch.stack([torch.logsumexp(row.float(), dim=-1) for row in logits])  # (B, T)
    return picked.float() - logsumexp


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy H = −Σ_v p_v log p_v of the sampling distribution, in nats.

    Args:
        logits: (B, T, V), divided by the sampling temperature.
    Returns:
        (B, T) entropies, computed one sequence at a time (memory as above),
        differentiable (the entropy bonus); call it under `torch.no_grad()` for
        a metric or a token filter.
    """
    rows = []
    for row in logits:  # (T, V)
        logp = torch.log_softmax(row.float(), dim=-1)
        rows.append(-(logp.exp() * logp).sum(-1))
    return torch.stack(rows)


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` where `mask` is non-zero, exactly 0 elsewhere (NaN and inf included).

    torch.where, not a product: 0 · inf and 0 · NaN are NaN, so a non-finite
    value at a masked position would otherwise reach the loss, its gradient
    and the metrics. Shapes broadcast; the result has the broadcast shape.
    """
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ of `values` over active positions (all of them, or along `dim`); masked ones never contribute."""
    kept = masked(values, mask)
    return kept.sum() if dim is None else kept.sum(dim)


# ---------------------------------------------------------------------------
# importance ratios
# ---------------------------------------------------------------------------


def log_importance_weights(
    logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """log ρ, the log importance weight of π_θ against π_old.

    Args:
        logps: (B, T) log π_θ, with gradient.
        old_logps: (B, T) log π_old, no gradient.
        mask: (B, T) 1 on completion tokens.
        level: "token": log ρ_t = log π_θ − log π_old (PPO/GRPO).
            "sequence": GSPO (arXiv 2507.18071) eq. (7): log s_i =
            mean_t(log ρ_t) over the sequence's active tokens, with gradient
            through the mean (as TRL), so a token whose policy term is masked
            (e.g. by `top_entropy_quantile`) still moves with its sequence.
    Returns:
        (B, T) log ratios; 0 at masked positions, whatever log π there (NaN
        included). For "sequence" every active position holds the sequence value.
    Raises:
        ValueError: unknown level.
    """
    log_ratio = masked(logps - old_logps, mask)
    if level == "token":
        return log_ratio
    if level == "sequence":
        seq = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # (B, 1)
        return masked(seq.expand_as(log_ratio), mask)
    raise ValueError(f"importance_sampling_level={level!r}: use 'token' or 'sequence'.")


# ---------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------


def kl_k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π_θ‖π_ref) per token: e^(r) − r − 1, r = log π_ref − log π_θ.

    DeepSeekMath eq. (4). Unbiased, always ≥ 0; exactly 0 where the two agree.
    Args and result: (B, T).
    """
    diff = ref_logps - logps
    return torch.exp(diff) - diff - 1


def kl_full(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Exact per-token KL(π_θ‖π_ref) = Σ_v π_θ(v)(log π_θ(v) − log π_ref(v)).

    Args:
        logits, ref_logits: (B, T, V), both divided by the sampling temperature;
            gradient flows through `logits` only.
    Returns:
        (B, T), computed one sequence at a time to bound memory.
    """
    rows = []
    for row, ref_row in zip(logits, ref_logits):
        logp = torch.log_softmax(row.float(), dim=-1)
        ref_logp = torch.log_softmax(ref_row.float(), dim=-1)
        rows.append((logp.exp() * (logp - ref_logp)).sum(-1))
    return torch.stack(rows)


def entropy_threshold(active_entropies: torch.Tensor, quantile: float) -> torch.Tensor | None:
    """The entropy at the (1 − ρ)-quantile of the active tokens of every process.

    "Beyond the 80/20 rule" (arXiv 2506.01939): training on the ~20 % highest
    entropy ("forking") tokens matches or beats training on all of them. As
    TRL's `get_high_entropy_mask`, the quantile is taken over the gathered
    micro-batch of all processes, as if one process held every token.

    Args:
        active_entropies: (K,) entropies of the active tokens, all processes.
        quantile: ρ in (0, 1].
    Returns:
        A scalar threshold, or None when no token is active anywhere.
    """
    if active_entropies.numel() == 0:
        return None
    return torch.quantile(active_entropies.float(), 1 - quantile)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, threshold: torch.Tensor | None) -> torch.Tensor:
    """Active tokens whose entropy is ≥ `threshold` (ties kept, as TRL).

    Args:
        entropy: (B, T) per-token entropy (no gradient).
        mask: (B, T) 1 on completion tokens.
        threshold: from `entropy_threshold`; None keeps no token (nothing active).
    Returns:
        (B, T) float mask, a subset of `mask`.
    """
    if threshold is None:
        return torch.zeros_like(mask, dtype=torch.float)
    return (mask.bool() & (entropy >= threshold)).float()


# ---------------------------------------------------------------------------
# aggregation: one signature, selected by loss_type
# ---------------------------------------------------------------------------


class StepCounts(NamedTuple):
    """Normalisers fixed for one optimizer step (before its first micro-batch).

    tokens: the dapo/cispo normaliser (`step_tokens`): active tokens per
        optimizer step and per process, averaged over the rollout.
    sequences: completions per process in the step.
    micro_batches: micro-batches per process in the step.
    max_completion_length: L, in tokens (Dr. GRPO's constant).
    """

    tokens: float
    sequences: float
    micro_batches: int
    max_completion_length: int


def step_tokens(rollout_tokens: float, num_processes: int, optimizer_steps: int) -> float:
    """The dapo/cispo normaliser of every optimizer step of one rollout, in tokens.

    TRL 1.16's `num_items_in_batch / num_processes · GA / steps_per_generation`:
    the rollout's active tokens on all processes, divided by the world size
    (DDP averages gradients over processes) and by the optimizer steps one pass
    over the rollout makes. Every step of the rollout divides by the same
    number, so every token of the rollout weighs the same, whichever step it
    falls in and however a step is split into micro-batches.

    Args:
        rollout_tokens: active (loss-carrying) completion tokens of the rollout, all processes.
        num_processes: world size.
        optimizer_steps: steps_per_generation / gradient_accumulation_steps.
    Returns:
        The normaliser, at least 1 / (num_processes · optimizer_steps) (TRL clamps the count at 1).
    """
    return max(rollout_tokens, 1.0) / num_processes / optimizer_steps


def aggregate_grpo(per_token_loss, mask, counts: StepCounts):
    """Mean over each sequence's tokens, then mean over the step's sequences (DeepSeekMath eq. 3)."""
    per_seq = masked_sum(per_token_loss, mask, -1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / counts.sequences


def aggregate_bnpo(per_token_loss, mask, counts: StepCounts):
    """Token mean within the micro-batch, averaged over the step's micro-batches (TRL's "bnpo")."""
    return masked_sum(per_token_loss, mask) / mask.sum().clamp(min=1) / counts.micro_batches


def aggregate_dapo(per_token_loss, mask, counts: StepCounts):
    """Σ over active tokens / the rollout's tokens per step (DAPO eq. 8, TRL's normaliser).

    `counts.tokens` is fixed for the whole rollout (`step_tokens`), so the
    gradient does not depend on how a step is split into micro-batches or processes.
    """
    return masked_sum(per_token_loss, mask) / counts.tokens


def aggregate_dr_grpo(per_token_loss, mask, counts: StepCounts):
    """Sum over tokens divided by the constant L × sequences (Dr. GRPO, arXiv 2503.20783, eq. 2).

    No length normalisation per sequence, so long wrong answers are not
    favoured (the bias Dr. GRPO identifies in eq. 3's 1/|o_i|).
    """
    return masked_sum(per_token_loss, mask) / (counts.sequences * counts.max_completion_length)


def aggregate_luspo(per_token_loss, mask, counts: StepCounts):
    """Sum over each sequence's tokens, mean over the step's sequences (LUSPO, arXiv 2602.05261).

    With GSPO's sequence ratio s_i (every token of a sequence holds the same
    loss ℓ_i) the sum is |o_i|·ℓ_i: GSPO's per-sequence loss scaled by its
    length, which removes GSPO's bias towards short completions:
    L = (1/N) Σ_i |o_i| · −min(s_i Â_i, clip(s_i, 1−ε, 1+ε) Â_i) (TRL 1.16's form).
    """
    return masked_sum(per_token_loss, mask) / counts.sequences


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, counts: StepCounts) -> torch.Tensor:
    """The micro-batch's mean entropy over `mask`, / micro-batches of the step: the H of L − c·H.

    TRL 1.16's form (`entropy_coef`): the mean per-token entropy of the tokens
    the policy term acts on, whatever `loss_type` normalises the policy term by,
    so c means the same for every loss type; each micro-batch counts 1/GA.

    Args:
        entropy: (B, T) H in nats, with gradient.
        mask: (B, T) the tokens the bonus acts on.
    Returns:
        A scalar, differentiable through `entropy`.
    """
    return masked_sum(entropy, mask) / mask.sum().clamp(min=1) / counts.micro_batches


# loss_type → (per-token objective, aggregation). Every objective takes
# (log_ratio, logps, advantages, ObjectiveParams); every aggregation (loss, mask, counts).
LOSS_TYPES = {
    "grpo": (clipped_surrogate, aggregate_grpo),
    "bnpo": (clipped_surrogate, aggregate_bnpo),
    "dapo": (clipped_surrogate, aggregate_dapo),
    "dr_grpo": (clipped_surrogate, aggregate_dr_grpo),
    "cispo": (cispo, aggregate_dapo),
    "sapo": (sapo, aggregate_grpo),  # per sequence, as TRL
    "luspo": (clipped_surrogate, aggregate_luspo),  # GSPO's ratio (importance_sampling_level="sequence")
    "vespo": (vespo, aggregate_dapo),  # as TRL
}


class LossOutput(NamedTuple):
    """`grpo_loss` result: the scalar to backpropagate and metric sums over active tokens."""

    loss: torch.Tensor  # scalar, this micro-batch's share of the step's loss
    metrics: dict[str, torch.Tensor]  # detached sums; divide by metrics["tokens"]


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    counts: StepCounts,
    *,
    loss_type: str = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    temperature_pos: float = 1.0,
    temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    vespo_ratio: torch.Tensor | None = None,
    beta: float = 0.0,
    per_token_kl: torch.Tensor | None = None,
    use_bias_correction_kl: bool = True,
    policy_mask: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    policy_weight: torch.Tensor | None = None,
) -> LossOutput:
    """The GRPO objective for one micro-batch: objective per token, + β·KL, aggregated, − c·H.

    Args:
        logps: (B, T) log π_θ at the sampling temperature, with gradient.
        old_logps: (B, T) log π_old (= logps.detach() when the policy cannot
            have moved since generation; then ρ = 1 exactly).
        advantages: (B,) Â, one per completion.
        mask: (B, T) completion mask (1 up to and including the first EOS).
        counts: the optimizer step's normalisers.
        per_token_kl: (B, T) KL(π_θ‖π_ref) per token, required when beta > 0.
        use_bias_correction_kl: multiply the per-token KL by ρ (with gradient
            through ρ), the importance-sampling correction for tokens sampled
            from π_old (DeepSeek-V3.2, arXiv 2512.02556; TRL 1.16's default).
        policy_mask: (B, T) tokens that carry the policy term (e.g. the top
            entropy ones); default `mask`. The KL term always uses `mask`.
        entropy: (B, T) per-token entropy H with gradient: given, the loss
            is L − entropy_coef·`entropy_bonus` over the policy tokens (TRL's
            entropy bonus; its coefficient may be 0 this step, entropy_control.py).
        policy_weight: (B, T) or (B, 1) factor on the policy term, no gradient (TRL's
            sampler importance ratio × off-policy mask, algo/sampling_correction.py); None: 1.
        vespo_ratio: (B, T) or (B, 1) the sampler's IS ratio that vespo folds into φ(w) (TRL's), no gradient; None: none.
        The other keywords are `ObjectiveParams` (objectives.py).
    Returns:
        `LossOutput`. Metric sums (over `mask`): kl_old (k3 KL(π_θ‖π_old)), tokens,
        kl (to π_ref, the term as the loss weighs it: k3·ρ with use_bias_correction_kl,
        TRL's `kl`), the `clip_metrics` of the clipped types and cispo; with
        `entropy`: policy_loss (the loss without the bonus), bonus_entropy and
        bonus_tokens (Σ H and the count over the bonus's tokens, for the
        adaptive coefficient); for vespo: vespo/phi_seq (Σ φ(w)) and sequences.
        Masked positions never contribute, whatever their values (NaN, inf).
    Raises:
        ValueError: unknown loss_type, or beta > 0 without per_token_kl.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r}: use one of {', '.join(LOSS_TYPES)}.")
    if beta > 0 and per_token_kl is None:
        raise ValueError("beta > 0 needs per_token_kl, the per-token KL(π_θ‖π_ref).")
    objective, aggregate = LOSS_TYPES[loss_type]
    mask = mask.float()
    logps, old_logps = masked(logps, mask), masked(old_logps, mask)  # finite everywhere from here on
    log_ratio = log_importance_weights(logps, old_logps, mask, importance_sampling_level)
    params = ObjectiveParams(
        epsilon_low, epsilon_high, delta, temperature_pos, temperature_neg, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg,
        vespo_ratio,
    )
    token_ratio = log_ratio if importance_sampling_level == "token" else log_importance_weights(logps, old_logps, mask)
    out = objective(token_ratio if loss_type == "vespo" else log_ratio, logps, advantages.unsqueeze(-1), params)  # vespo: per-token ρ at any level (TRL)
    policy_mask = mask if policy_mask is None else mask * policy_mask
    per_token = masked(out.loss, policy_mask)
    if policy_weight is not None:
        per_token = masked(per_token * policy_weight, mask)
    if per_token_kl is not None:
        per_token_kl = masked(per_token_kl, mask)
    if beta > 0:
        kl_term = per_token_kl * torch.exp(log_ratio) if use_bias_correction_kl else per_token_kl
        per_token = per_token + beta * kl_term
    loss = policy_loss = aggregate(per_token, mask, counts)
    if entropy is not None:
        loss = policy_loss - entropy_coef * entropy_bonus(entropy, policy_mask, counts)

    with torch.no_grad():
        metrics = {"kl_old": masked_sum(kl_k3(logps, old_logps), mask), "tokens": mask.sum()}
        if loss_type in CLIPPED_LOSS_TYPES or loss_type == "cispo":
            metrics.update(clip_metrics(out.clipped_low, out.clipped_high, mask, importance_sampling_level, loss_type == "cispo"))
        if per_token_kl is not None:  # TRL's `kl`: the KL term as the loss has it (k3·ρ with the bias correction)
            metrics["kl"] = masked_sum(kl_term if beta > 0 else per_token_kl, mask)
        if entropy is not None:
            metrics.update(policy_loss=policy_loss.detach(), bonus_entropy=masked_sum(entropy.detach(), policy_mask), bonus_tokens=policy_mask.sum())
        if out.seq_weight is not None:
            metrics.update({"vespo/phi_seq": out.seq_weight.sum(), "sequences": torch.tensor(float(len(mask)))})
    return LossOutput(loss, metrics)
