"""Generation backends behind one small protocol: prompt tokens in, completion tokens out.

The first backend is transformers' own `generate` (sampling, left padding, KV
cache, stop at EOS). A vLLM backend for GPU users can implement the same
`Generator` protocol; nothing else in fastgrpo needs to change.

Not here: repeating prompts G times (rollout.py), masks after EOS (rollout.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import GenerationConfig, PreTrainedModel


class Generator(Protocol):
    """Anything that samples completions for left-padded prompts."""

    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """(N, P) prompt ids and mask → (N, T) completion ids, T ≤ max_completion_length."""
        ...


class TransformersGenerator:
    """Sampling with `model.generate` (KV cache on), one call per rollout.

    Args:
        model: the policy (the unwrapped module; DDP wrappers do not generate).
        max_completion_length: T, in tokens.
        eos_token_ids: ids that end a completion; the first one after padding
            fills finished rows (the mask in rollout.py hides it).
        pad_token_id: padding id (may equal EOS).
        temperature, top_p, top_k, min_p, repetition_penalty: as in
            `transformers.GenerationConfig` (top_k 0 = off; TRL's meaning).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        max_completion_length: int,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float | None = None,
        repetition_penalty: float = 1.0,
    ):
        self.model = model
        self.config = GenerationConfig(
            do_sample=True,
            max_new_tokens=max_completion_length,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,  # 0 disables it; None would let transformers fill in its default of 50
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            eos_token_id=list(eos_token_ids),
            pad_token_id=pad_token_id,
            use_cache=True,
        )

    @torch.no_grad()
    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        was_training = self.model.training
        self.model.eval()  # no dropout, and gradient checkpointing (train-only) keeps the cache on
        try:
            out = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=self.config)
        finally:
            self.model.train(was_training)
        return out[:, prompt_ids.shape[1] :]
