"""What a generation backend samples with and what it returns: `SamplingSettings` in, `Samples` out.

Not here: the backends (sampler.py, generation.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class SamplingSettings:
    """What both backends sample with, built once from GRPOConfig's fields of the same names.

    Fields:
        max_completion_length: T, the most completion tokens per row (TRL's field;
            transformers' `max_new_tokens`).
        eos_token_ids: token ids that end a completion (transformers' `eos_token_id`
            as a list); stored as a tuple.
        pad_token_id: token id that fills a row after its EOS, as `generate` pads.
        temperature: logits are divided by it before sampling (> 0; 1.0 = off);
            training log-probs are taken at the same value (TRL's rule).
        top_p: nucleus sampling, the smallest set of tokens whose probability reaches
            it (1.0 = off), as transformers' `TopPLogitsWarper`.
        top_k: keep the k most likely tokens (0 = off: TRL's meaning; transformers'
            own default would be 50).
        min_p: drop tokens below min_p × the top token's probability (None = off),
            as transformers' `MinPLogitsWarper`.
        repetition_penalty: transformers' `RepetitionPenaltyLogitsProcessor` over the
            prompt and completion tokens so far (1.0 = off).
    """

    max_completion_length: int
    eos_token_ids: Sequence[int]
    pad_token_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0

    @classmethod
    def from_config(cls, args, eos_token_ids: Sequence[int], pad_token_id: int) -> SamplingSettings:
        """The settings from a `GRPOConfig`'s fields of the same names, with the model's EOS and pad ids."""
        return cls(
            args.max_completion_length, eos_token_ids, pad_token_id, args.temperature, args.top_p, args.top_k, args.min_p, args.repetition_penalty
        )

    def __post_init__(self):
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))  # no list the caller could change later


class Samples(NamedTuple):
    """What a generator returns for B prompts and G (rows grouped: i·G … i·G+G−1 belong to prompt i)."""

    completion_ids: torch.Tensor  # (B·G, T) sampled tokens, right-padded with pad_token_id after EOS
    logps: torch.Tensor | None  # (B·G, T) the sampler's log softmax(logits / temperature) of each token, 0 after EOS;
    # None where the tokens were sampled by the trained weights themselves (sampling = π_old, no correction)
