"""The logits processors both in-process backends sample with, built from `SamplingSettings` only, reading real tokens only.

transformers' own processor classes in the order `generate` applies them; the prompt's left pads are
replaced by its first real token (`fill_pads`) before a processor reads it.

Not here: the backends (sampler.py, transformers_generate.py).
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .contract import SamplingSettings


def logits_processors(sampling: SamplingSettings, prompt_length: int = 0) -> LogitsProcessorList:
    """transformers' processors for these settings, in the order `generate` applies them when sampling.

    Matches `GenerationMixin._get_logits_processor` (transformers 5.19): the
    repetition penalty first, then the masks (bad words, min_new_tokens,
    suppressed tokens), then temperature, top-k, top-p, min-p; a value that
    means "off" (1.0, 0, None, ()) adds nothing.

    Args:
        prompt_length: P, the prompt columns of the history the processors read (P + t columns at completion token t):
            `min_new_tokens` counts the columns after it, as `generate` passes its input length. Only needed with
            `min_new_tokens`.
    """
    processors = LogitsProcessorList()
    if sampling.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty))
    if sampling.bad_words_ids:
        processors.append(NoBadWordsLogitsProcessor([list(w) for w in sampling.bad_words_ids], list(sampling.eos_token_ids)))
    if sampling.min_new_tokens > 0:
        processors.append(MinNewTokensLengthLogitsProcessor(prompt_length, sampling.min_new_tokens, list(sampling.eos_token_ids)))
    if sampling.suppress_tokens:
        processors.append(SuppressTokensLogitsProcessor(list(sampling.suppress_tokens)))
    if sampling.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k != 0:
        processors.append(TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
    if sampling.top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    if sampling.min_p is not None:
        processors.append(MinPLogitsWarper(min_p=sampling.min_p, min_tokens_to_keep=1))
    return processors


def reads_tail(sampling: SamplingSettings) -> bool:
    """Whether a processor reads where the completion stands (`min_new_tokens`, `bad_words_ids`): the history must be the
    prompt's P columns then the row's own tokens, which cached turns' rows of different lengths are not."""
    return sampling.min_new_tokens > 0 or bool(sampling.bad_words_ids)


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


class OnRealTokens(LogitsProcessor):
    """A `LogitsProcessor` running `processors` with `prompt_ids` (N, P) in place of the first P columns of `generate`'s tokens (pads filled)."""

    def __init__(self, processors: LogitsProcessorList, prompt_ids: torch.Tensor):
        self.processors, self.prompt_ids = processors, prompt_ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        P = self.prompt_ids.shape[1]
        return self.processors(torch.cat([self.prompt_ids, input_ids[:, P:]], dim=1), scores)
