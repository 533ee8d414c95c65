"""Stop strings for the in-process backends: transformers' `StopStringCriteria`, read on the completion's tokens only.

A completion ends at the token whose text completes a stop string (transformers' `stop_strings`, vLLM's `stop`); that
token is kept, as transformers' `generate` keeps it and vLLM keeps it in `token_ids`. Both in-process backends stop there
(the own sampler in its loop, `generate` through `OnCompletion`) and report each row's length (`stop_lengths`), so the
mask and `is_truncated` read where the row ended rather than looking for an EOS that is not there.

Not here: which keys set them (config/generation_kwargs.py), vLLM's own stop strings (vllm/backend.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import StopStringCriteria, StoppingCriteria


def stop_criteria(tokenizer, strings: Sequence[str]) -> StopStringCriteria | None:
    """transformers' `StopStringCriteria` for `strings` with the policy's tokenizer; None for no strings."""
    return StopStringCriteria(tokenizer, list(strings)) if strings else None


class OnCompletion(StoppingCriteria):
    """A `StoppingCriteria` running `criteria` on `generate`'s tokens after the first `prompt_length` (the completion only:
    a stop string is looked for in the completion's text, as vLLM looks for it in its output text)."""

    def __init__(self, criteria: StopStringCriteria, prompt_length: int):
        self.criteria, self.prompt_length = criteria, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.criteria(input_ids[:, self.prompt_length :], scores)


def stop_lengths(completion_ids: torch.Tensor, eos_token_ids: Sequence[int], criteria: StopStringCriteria) -> torch.Tensor:
    """(N,) long: for each row of (N, T) completion ids, the tokens through the first one completing a stop string when
    that comes before any EOS (the row ended there), else 0 (it ended at EOS, or ran to T).

    One `criteria` call per column on the tokens so far, as `generate` calls it after each step.
    """
    N, T = completion_ids.shape
    lengths = torch.zeros(N, dtype=torch.long, device=completion_ids.device)
    open_rows = torch.ones(N, dtype=torch.bool, device=completion_ids.device)  # no EOS and no stop string yet
    eos = torch.tensor(list(eos_token_ids), device=completion_ids.device)
    for t in range(T):
        hit = criteria(completion_ids[:, : t + 1], None).to(completion_ids.device) & open_rows
        lengths[hit] = t + 1
        open_rows &= ~hit & ~torch.isin(completion_ids[:, t], eos)
        if not open_rows.any():
            break
    return lengths
