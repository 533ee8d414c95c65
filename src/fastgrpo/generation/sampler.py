"""fastgrpo's own sampler: each prompt prefilled once, a preallocated KV cache, finished rows leave the batch.

`Sampler` runs the decoder of a Llama-family model (Llama, Mistral, Qwen2)
module by module — the model's own projections, norms, MLP and rotary
embedding, so LoRA layers injected by peft run too — with a KV cache it owns:

- the B prompts are prefilled once and their keys/values written into the
  cache rows of all G completions (B·G rows), instead of G identical prefills;
- the cache is allocated once per call, (B·G, KV heads, P + T, head dim) per
  layer, and each decode step writes its column in place;
- a row that samples EOS leaves the batch: the live rows are moved to the
  front of the cache, so later steps compute only unfinished completions;
- sampling uses transformers' own logits processors, built from the
  configured values only (never the model's `generation_config.json`), and
  they read the real tokens only (`fill_pads`).

Randomness is one uniform draw per row and step, drawn for all B·G rows
whether they still run or not (inverse-CDF sampling: token i with probability
p_i), so a row's tokens do not depend on which other rows are still running.

`Sampler` is a `GenerationBackend` (contract.py): with a weight copy of its own
(weight_copy.py: the bf16 copy, or FSDP's gathered one) the loop pushes the
policy's weights into it with `update_weights` once per rollout.

Not here: the cache and the forward passes (kv_cache.py), each step's draw (draw.py), the processors
(processors.py), choosing a backend (build.py), masks after EOS (rollout/record.py).
"""

from __future__ import annotations

import torch
from transformers import StopStringCriteria

from ..model.loading import decoder_of
from .cached_turns import CachedTurns
from .contract import Samples, SamplingSettings
from .draw import draw
from .kv_cache import KVCache
from .processors import fill_pads, logits_processors, reads_tail
from .reprefill import Reprefill
from .weight_copy import WeightCopy

# Decoders whose layers are exactly: RMSNorm → q/k/v/o attention with rotary embeddings → RMSNorm → MLP.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why `Sampler` cannot run `model` (one phrase), or None when it can.

    Supported: Llama, Mistral and Qwen2 causal LMs with full attention in every
    layer (no sliding window), plain or wrapped by peft.
    """
    lm = decoder_of(model)
    config = getattr(lm, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} (it handles {', '.join(SUPPORTED_MODEL_TYPES)})"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return "sliding-window attention layers"
    if model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return f"Mistral's sliding window of {config.sliding_window} tokens"
    inner = getattr(lm, "model", None)
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")) or not hasattr(lm, "lm_head"):
        return f"{type(lm).__name__}'s module layout"
    return None


class Sampler:
    """fastgrpo's own `GenerationBackend`: G completions per prompt with a static KV cache and batch compaction.

    Args:
        model: a causal LM that `unsupported_reason` accepts (check first; the
            constructor raises otherwise), or a peft model around one.
        sampling: the `SamplingSettings` (T = max_completion_length tokens, EOS and
            padding ids, and the values transformers' `generate` samples with).
        weight_copy: the weights it samples from when not `model`'s own (weight_copy.py:
            the bf16 `MergedCopy`, or FSDP's `GatheredCopy`), written by `update_weights`
            once per rollout, never cast during decoding; None: sample from `model` itself.
        stops: transformers' `StopStringCriteria` for the stop strings (stops.stop_criteria), read on each row's completion
            tokens after every step: a row whose text completes one ends there, as at EOS; None: no stop strings.
    Attributes:
        owns_weights: True with a `MergedCopy` (a second policy: `Samples.logps` are given and
            corrected for); False with no copy or with FSDP's gathered copy (the trained weights,
            gathered: `Samples.logps` is None).
    Raises:
        ValueError: the model is not one the sampler handles (the message says why).
    """

    def __init__(self, model: torch.nn.Module, sampling: SamplingSettings, *, weight_copy: WeightCopy | None = None,
                 stops: StopStringCriteria | None = None):
        if (reason := unsupported_reason(model)) is not None:
            raise ValueError(f"the fastgrpo sampler cannot run {reason}; use generation_backend='transformers'.")
        self.model = model
        self.sampling = sampling
        self.processors = logits_processors(sampling)  # cached turns' (turns() picks them only when no processor reads the position)
        self.weight_copy, self.stops = weight_copy, stops
        self.owns_weights = weight_copy is not None and weight_copy.second_policy

    def decoder(self) -> torch.nn.Module:
        """The causal LM that samples: the weight copy's, or the model's own decoder."""
        return decoder_of(self.model if self.weight_copy is None else self.weight_copy.module)

    def update_weights(self, policy: torch.nn.Module) -> None:
        """Write the policy's current weights into the weight copy (contract.py); nothing without one."""
        if self.weight_copy is not None:
            self.weight_copy.update(policy)

    def turns(self) -> CachedTurns | Reprefill:
        """Turns that keep each row's KV cache between turns (cached_turns.py); with a processor that reads where the
        completion stands (`processors.reads_tail`: min_new_tokens, bad_words_ids) turns that re-run each row's sequence
        (reprefill.py), where every row's history is its prompt then its own tokens and each turn counts from 0, as each
        `generate` call does."""
        return Reprefill(self, self.sampling.pad_token_id, self.sampling.eos_token_ids) if reads_tail(self.sampling) else CachedTurns(self)

    def notices(self) -> list[str]:
        """The weight copy's start-up sentence, if it has one."""
        return self.weight_copy.notices() if self.weight_copy is not None else []

    def close(self) -> None:
        """Nothing to release: the cache lives for one call."""

    @torch.no_grad()
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, max_new_tokens: int | None = None) -> Samples:
        """G completions for each of B left-padded prompts, and the log-probs of the sampled tokens.

        Args:
            prompt_ids: (B, P) prompt tokens, left-padded.
            prompt_mask: (B, P) 1 on real prompt tokens.
            num_generations: G, completions per prompt.
            max_new_tokens: T for this call (a later turn's remaining budget); None: max_completion_length.
        Returns:
            `Samples` of B·G rows, T' ≤ max_new_tokens columns (T' = the longest completion; generation
            stops once every row has ended); logps (B·G, T') float32 when `owns_weights`, else None; stop_lengths
            (B·G,) with stop strings (`Samples`), else None.
        Raises:
            ValueError: the model's logits hold inf or NaN.
        """
        completion_ids, logps, stop_lengths = self.decode(prompt_ids, prompt_mask, num_generations, max_new_tokens)
        return Samples(completion_ids, logps if self.owns_weights else None, stop_lengths)

    @torch.no_grad()
    def decode(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, max_new_tokens: int | None = None):
        """`sample`'s decode loop: (B·G, T') completion ids, (B·G, T') log-probs under the sampling weights, always, and
        (B·G,) stop lengths (`Samples.stop_lengths`; None without stop strings)."""
        lm = self.decoder()
        device = prompt_ids.device
        B, P = prompt_ids.shape
        G, T = num_generations, max_new_tokens or self.sampling.max_completion_length
        N, L = B * G, P + T
        processors = logits_processors(self.sampling, P)  # min_new_tokens counts the columns after the P prompt ones
        cache = KVCache(lm, N, L, device)
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded tokens
        logits = cache.prefill(prompt_ids, prompt_mask.bool(), positions, G).repeat_interleave(G, dim=0)  # (N, V)
        tokens = torch.cat([fill_pads(prompt_ids, prompt_mask), prompt_ids.new_zeros(B, T)], dim=1).repeat_interleave(G, dim=0)  # (N, L), for the processors
        next_position = (positions[:, -1] + 1).repeat_interleave(G)  # (N,)
        eos = torch.tensor(self.sampling.eos_token_ids, device=device)
        out = torch.full((N, T), self.sampling.pad_token_id, dtype=prompt_ids.dtype, device=device)
        logps = torch.zeros(N, T, device=device)
        stop_lengths = None if self.stops is None else torch.zeros(N, dtype=torch.long, device=device)
        rows = torch.arange(N, device=device)  # original index of each live row, live rows first in the cache
        for t in range(T):
            uniform = torch.rand(N, 1, device=device, dtype=torch.float64)[rows]
            token, logps[rows, t] = draw(logits, tokens[rows, : P + t], uniform, processors, self.sampling.temperature, f"completion token {t}")
            out[rows, t], tokens[rows, P + t] = token, token
            live = ~torch.isin(token, eos)
            if self.stops is not None:  # the row's text so far completes a stop string: it ends at this token
                stopped = live & self.stops(tokens[rows, P : P + t + 1], None).to(device)
                stop_lengths[rows[stopped]], live = t + 1, live & ~stopped
            if t + 1 == T or not live.any():
                break
            if not live.all():  # finished rows leave the batch
                keep = live.nonzero().squeeze(1)
                cache.compact(keep, P + t)
                rows, token = rows[keep], token[keep]
            logits = cache.decode(token, next_position[rows] + t, P + t)
        return out[:, : t + 1], logps[:, : t + 1], stop_lengths
