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

Not here: choosing between this and transformers' `generate`, the fallback
for other architectures (generation.py), masks after EOS (rollout.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .models import decoder_of
from .sampling import Samples, SamplingSettings

if TYPE_CHECKING:
    from .weight_sync import WeightSync

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


def logits_processors(sampling: SamplingSettings) -> LogitsProcessorList:
    """transformers' processors for these settings, in the order `generate` applies them when sampling.

    Matches `GenerationMixin._get_logits_processor` (transformers 5): the
    repetition penalty first, then temperature, top-k, top-p, min-p; a value
    that means "off" (1.0, 0, None) adds nothing.
    """
    processors = LogitsProcessorList()
    if sampling.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty))
    if sampling.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k != 0:
        processors.append(TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
    if sampling.top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    if sampling.min_p is not None:
        processors.append(MinPLogitsWarper(min_p=sampling.min_p, min_tokens_to_keep=1))
    return processors


def fill_pads(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """(B, P) left-padded prompts with every pad replaced by its row's first real token: what logits processors read.

    A processor that reads the tokens so far (`repetition_penalty`) then sees
    only the real tokens: a token set is unchanged by repeating one of its
    members, so a prompt batched with longer prompts gets the distribution it
    gets alone. Read raw, the pads (EOS for SmolLM2) would be penalised as if
    the prompt held them, so a short prompt would rarely end its reply.
    transformers' `generate` reads the pads; neither backend here does.
    """
    first = prompt_ids.gather(1, prompt_mask.argmax(1, keepdim=True))  # (B, 1): argmax finds the first 1 (left padding)
    return torch.where(prompt_mask.bool(), prompt_ids, first)


class Sampler:
    """Samples G completions per prompt with a static KV cache and batch compaction.

    Args:
        model: a causal LM that `unsupported_reason` accepts (check first; the
            constructor raises otherwise), or a peft model around one.
        sampling: the `SamplingSettings` (T = max_completion_length tokens, EOS and
            padding ids, and the values transformers' `generate` samples with).
        weight_sync: the sampler's own copy of the weights (e.g. bf16, weight_sync.py),
            refreshed from the policy at the start of each `sample` (once per
            rollout), never cast during decoding; None: sample from `model` itself.
    Raises:
        ValueError: the model is not one the sampler handles (the message says why).
    """

    def __init__(self, model: torch.nn.Module, sampling: SamplingSettings, *, weight_sync: WeightSync | None = None):
        if (reason := unsupported_reason(model)) is not None:
            raise ValueError(f"the fastgrpo sampler cannot run {reason}; use generation_backend='transformers'.")
        self.model = model
        self.sampling = sampling
        self.processors = logits_processors(sampling)
        self.weight_sync = weight_sync

    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int) -> Samples:
        """(B, P) left-padded prompts → `Samples` (the `Generator` protocol): log-probs only from a weight copy."""
        samples = self.sample(prompt_ids, prompt_mask, num_generations)
        return samples if self.weight_sync is not None else samples._replace(logps=None)

    @torch.no_grad()
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, max_new_tokens: int | None = None) -> Samples:
        """G completions for each of B left-padded prompts, and the log-probs of the sampled tokens.

        Args:
            prompt_ids: (B, P) prompt tokens, left-padded.
            prompt_mask: (B, P) 1 on real prompt tokens.
            num_generations: G, completions per prompt.
            max_new_tokens: T for this call (a later turn's remaining budget); None: max_completion_length.
        Returns:
            `Samples` of B·G rows, T' ≤ max_completion_length columns (T' = the
            longest completion; generation stops once every row has ended).
        Raises:
            ValueError: the model's logits hold inf or NaN.
        """
        if self.weight_sync is not None:
            self.weight_sync.refresh()  # the policy's weights after the last optimizer step
        lm = decoder_of(self.model) if self.weight_sync is None else self.weight_sync.model
        device = prompt_ids.device
        B, P = prompt_ids.shape
        G, T = num_generations, max_new_tokens or self.sampling.max_completion_length
        N, L = B * G, P + T
        cache = _Cache(lm, N, L, device)
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded tokens
        logits = cache.prefill(prompt_ids, prompt_mask.bool(), positions, G).repeat_interleave(G, dim=0)  # (N, V)
        tokens = torch.cat([fill_pads(prompt_ids, prompt_mask), prompt_ids.new_zeros(B, T)], dim=1).repeat_interleave(G, dim=0)  # (N, L), for the processors
        next_position = (positions[:, -1] + 1).repeat_interleave(G)  # (N,)
        eos = torch.tensor(self.sampling.eos_token_ids, device=device)
        out = torch.full((N, T), self.sampling.pad_token_id, dtype=prompt_ids.dtype, device=device)
        logps = torch.zeros(N, T, device=device)
        rows = torch.arange(N, device=device)  # original index of each live row, live rows first in the cache
        for t in range(T):
            logits = logits.float()
            if not torch.isfinite(logits).all():  # as generate() refuses it: never sample from a broken distribution
                raise ValueError(
                    f"the model's logits hold inf or NaN at completion token {t}; its weights are not finite "
                    "(a diverged run, or a bad checkpoint): resume from an earlier checkpoint or reload the model."
                )
            scores = self.processors(tokens[rows, : P + t], logits)  # (n, V)
            token = _inverse_cdf(scores.softmax(-1), torch.rand(N, 1, device=device, dtype=torch.float64)[rows])  # (n,)
            out[rows, t], tokens[rows, P + t] = token, token
            logps[rows, t] = (logits / self.sampling.temperature).log_softmax(-1).gather(1, token[:, None]).squeeze(1)
            live = ~torch.isin(token, eos)
            if t + 1 == T or not live.any():
                break
            if not live.all():  # finished rows leave the batch
                keep = live.nonzero().squeeze(1)
                cache.compact(keep, P + t)
                rows, token = rows[keep], token[keep]
            logits = cache.decode(token, next_position[rows] + t, P + t)
        return Samples(out[:, : t + 1], logps[:, : t + 1])


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Token i with probability probs[i]: the first index whose cumulative probability exceeds u · total.

    probs (n, V), uniform (n, 1) in [0, 1) → (n,). The sum runs in float64 so a
    token of probability 0 (cut by top-k/top-p/min-p) is never picked, and
    scaling by the total absorbs the rounding of the float32 probabilities.
    """
    cdf = probs.double().cumsum(-1)  # (n, V)
    return torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(1).clamp(max=probs.shape[1] - 1)


class _Cache:
    """The static KV cache of one `Sampler.sample` call and the forward passes that fill it.

    keys/values[layer]: (N, KV heads, L, head dim); row r of the first n is
    the r-th live completion; column c holds the token at sequence column c
    (prompt columns 0…P−1, completion token t at P + t). `valid` (N, L) marks
    the columns a row may attend to (its real prompt tokens, then all
    generated ones).
    """

    def __init__(self, lm: torch.nn.Module, N: int, L: int, device: torch.device):
        self.lm = lm
        config = lm.config
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = lm.lm_head.weight.dtype  # the weights' own: a bf16 copy keeps a bf16 cache
        shape = (N, heads, L, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in lm.model.layers]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in lm.model.layers]
        self.valid = torch.ones(N, L, dtype=torch.bool, device=device)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, G: int) -> torch.Tensor:
        """Run the B prompts once, write their keys/values into all G rows of each; → last-token logits (B, V)."""
        B, P = ids.shape
        self.valid[:, :P] = mask.repeat_interleave(G, dim=0)
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        # A padding query attends to itself only: never a fully masked row (NaN), never read by real tokens.
        allowed = (causal & mask[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device)  # (B, P, P)

        def attend(layer: int, k: torch.Tensor, v: torch.Tensor):
            self.keys[layer][:, :, :P] = k.repeat_interleave(G, dim=0)
            self.values[layer][:, :, :P] = v.repeat_interleave(G, dim=0)
            return k, v

        return self._forward(ids, positions, allowed[:, None], attend)

    def decode(self, token: torch.Tensor, position: torch.Tensor, column: int) -> torch.Tensor:
        """One step for the n live rows: token (n,) at `position` (n,), written at cache `column`; → logits (n, V)."""
        n = token.shape[0]

        def attend(layer: int, k: torch.Tensor, v: torch.Tensor):
            self.keys[layer][:n, :, column] = k[:, :, 0]
            self.values[layer][:n, :, column] = v[:, :, 0]
            return self.keys[layer][:n, :, : column + 1], self.values[layer][:n, :, : column + 1]

        return self._forward(token[:, None], position[:, None], self.valid[:n, None, None, : column + 1], attend)

    def compact(self, keep: torch.Tensor, columns: int) -> None:
        """Move live rows `keep` (indices among the first n) to the front; columns ≥ `columns` are not yet written."""
        for cache in (*self.keys, *self.values):
            cache[: len(keep), :, :columns] = cache[keep, :, :columns]
        self.valid[: len(keep)] = self.valid[keep]

    def _forward(self, ids, positions, allowed, attend) -> torch.Tensor:
        """The decoder, as the model's own forward computes it (eval mode), with our cache; → logits of the last position."""
        model = self.lm.model
        hidden = model.embed_tokens(ids)  # (n, s, hidden)
        cos_sin = model.rotary_emb(hidden, position_ids=positions)
        n, s = ids.shape
        for index, layer in enumerate(model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(n, s, -1, attn.head_dim).transpose(1, 2)  # (n, heads, s, head dim)
            k = attn.k_proj(x).view(n, s, -1, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(n, s, -1, attn.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, *cos_sin)
            keys, values = attend(index, k, v)
            o = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=allowed, scale=attn.scaling, enable_gqa=True)
            hidden = hidden + attn.o_proj(o.transpose(1, 2).reshape(n, s, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.lm.lm_head(model.norm(hidden[:, -1]))  # (n, V)
