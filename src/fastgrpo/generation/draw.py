"""One token per row from a decode step's logits: the finiteness check, the processors, the draw and its log-prob.

Both in-process decode loops (sampler.py: one turn; cached_turns.py: turns that keep the cache) call `draw`
once per step. Nothing here makes an (n, V) float64 block or an (n, V) boolean one: at 32 rows of SmolLM2's
49 152 tokens, 2 threads, a step's maths went from 5.5 to 3.3 ms at T = 1 and from 5.8 to 4.0 ms at T = 0.7
(benchmarks/sampler_draw.py, Intel Xeon with AMX), against ≈ 80 ms for the decoder pass itself.

Not here: the decoder passes (kv_cache.py), the processors (processors.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import LogitsProcessorList

BLOCK = 256  # tokens per block of the two-level draw: a power of two that divides most vocabularies


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Token i with probability probs[i] / Σ probs: the first index whose cumulative probability exceeds u · Σ probs.

    Two levels, both summed in float64: the block totals of `BLOCK` tokens (or of gcd(V, `BLOCK`)
    when that is ≥ 64; otherwise the row is padded with zeros) pick the block, then the cumulative sum
    inside the one block picks the token. This is the single float64 cumulative sum over V to within
    float64 rounding (a different token only when u · Σ falls within ≈ 1e-15 · Σ of a boundary), at a
    fraction of its cost: no (n, V) float64 block is made.

    A token of probability 0 (cut by top-k/top-p/min-p) is never picked: its cumulative value equals
    its predecessor's, so it is never the first to exceed u · Σ; where rounding puts u · Σ at or past
    the end (u within 2⁻⁵³ of 1, or a block's sum and its cumulative sum disagreeing in the last bit),
    the draw falls back to the last token of positive probability instead of the last index.

    Args:
        probs: (n, V) non-negative, any float dtype (float32 from softmax); rows need not sum to 1.
        uniform: (n, 1) float64 in [0, 1).
    Returns:
        (n,) int64 token ids; (0,) for no rows.
    Raises:
        ValueError: a row's total is NaN, infinite or 0 (no distribution to draw from), naming the rows.
    """
    n, V = probs.shape
    width = math.gcd(V, BLOCK)
    if width < 64:  # a vocabulary with few factors of two: zero-mass padding is never drawn
        probs, width = F.pad(probs, (0, -V % BLOCK)), BLOCK
    blocks = probs.reshape(n, probs.shape[1] // width, width)  # (n, V / width, width)
    cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # (n, blocks)
    total = cdf[:, -1:]  # (n, 1)
    broken = ~((total > 0) & torch.isfinite(total)).squeeze(1)  # (n,)
    if broken.any():
        rows = broken.nonzero().squeeze(1).tolist()
        raise ValueError(f"rows {rows[:8]} have no distribution to draw from: their probabilities sum to NaN, inf or 0.")
    x = uniform * total
    block = first_above(cdf, x)  # (n, 1)
    below = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)  # mass of the blocks before it
    inner = blocks[torch.arange(n, device=probs.device), block.squeeze(1)].double().cumsum(-1)  # (n, width)
    return (block * width + first_above(inner, x - below)).squeeze(1)


def first_above(cdf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(n, 1): the first column of the non-decreasing (n, m) `cdf` whose value exceeds x (n, 1), at most the last column that increases."""
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)  # first column reaching the total: the last that adds mass
    return torch.minimum(torch.searchsorted(cdf, x, right=True), last)


def draw(
    logits: torch.Tensor, history: torch.Tensor, uniform: torch.Tensor, processors: LogitsProcessorList, temperature: float, where: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's tokens and their log-probs under the sampling temperature (what `generate` samples, and π_old's values).

    Args:
        logits: (n, V) the model's next-token logits, any float dtype (computed on in float32).
        history: (n, t) the tokens so far, as the processors read them (pads filled: processors.fill_pads).
        uniform: (n, 1) float64 in [0, 1), one number per row (`inverse_cdf`).
        processors: transformers' processors (processors.logits_processors); they choose the distribution drawn from.
        temperature: T of the log-probs, log softmax(logits / T) — no truncation, no penalty, as TRL's and vLLM's
            processed log-probs.
        where: the step, for the error ("completion token 3").
    Returns:
        token (n,) int64, logp (n,) float32.
    Raises:
        ValueError: the logits hold inf or NaN (a diverged run or a bad checkpoint), as `generate` refuses to sample;
            or finite logits so large that the processors' distribution is not finite.
    """
    logits = logits.float()
    if not torch.isfinite(logits.sum()) and not torch.isfinite(logits).all():  # a finite sum: all finite, in one cheap pass
        raise ValueError(
            f"the model's logits hold inf or NaN at {where}; its weights are not finite "
            "(a diverged run, or a bad checkpoint): resume from an earlier checkpoint or reload the model."
        )
    try:
        token = inverse_cdf(processors(history, logits).softmax(-1), uniform)  # (n,)
    except ValueError as error:  # finite logits that the processors (T < 1, a penalty < 1) pushed past float32
        raise ValueError(
            f"the sampling distribution at {where} is not finite although the logits are (largest |logit| "
            f"{float(logits.abs().max()):.3g}, temperature {temperature}): {error} The weights have diverged: "
            "resume from an earlier checkpoint or reload the model."
        ) from None
    scaled = logits if temperature == 1.0 else logits / temperature
    top = scaled.max(-1, keepdim=True).values  # (n, 1): log softmax's own shift, so large logits keep their precision
    logp = (scaled.gather(1, token[:, None]) - top).squeeze(1) - (scaled - top).exp_().sum(-1).log_()
    return token, logp
