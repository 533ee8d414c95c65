"""Generation backends behind one small protocol: B prompts and G in, B·G completions out.

Two backends: fastgrpo's own `Sampler` (sampler.py: each prompt prefilled
once, a static KV cache, finished rows leave the batch) and transformers' own
`generate`. `build_generator` picks one from `generation_backend` and falls
back to `generate`, with a one-line notice, for a model the sampler cannot
run. A vLLM backend for GPU users can implement the same `Generator`
protocol (vLLM's `SamplingParams(n=G)` takes the same unique prompts and G);
nothing else in fastgrpo needs to change.

Both backends sample with the configured values only: a model's own
`generation_config.json` (a top_k, a minimum length …) never changes what is
sampled, since the training log-probs assume the configured distribution.

Not here: masks after EOS (rollout.py).
"""

from __future__ import annotations

import warnings
from typing import Protocol

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedModel

from .config_checks import GENERATION_BACKENDS
from .models import decoder_of
from .sampler import Sampler, fill_pads, logits_processors, unsupported_reason
from .sampling import Samples, SamplingSettings
from .weight_sync import WeightSync


class Generator(Protocol):
    """Anything that samples G completions for each of B left-padded prompts."""

    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int) -> Samples:
        """(B, P) prompt ids and mask, G → `Samples`: (B·G, T) completion ids, rows i·G … i·G+G−1 for prompt i,
        T ≤ max_completion_length, and the sampler's own log-probs where its weights are not the trained ones."""
        ...


class TransformersGenerator:
    """Sampling with `model.generate` (KV cache on), one call per rollout, prompts repeated G times.

    Args:
        model: the policy (the unwrapped module; DDP wrappers do not generate).
        sampling: the `SamplingSettings`, passed to `transformers.GenerationConfig`.
    The model's own `generation_config` is swapped for transformers' defaults
    during the call: `generate` would otherwise fill every value left unset
    here (min_new_tokens, no_repeat_ngram_size, …) from it. The sampling
    values reach `generate` as the sampler's own processor list
    (`sampler.logits_processors`, transformers' classes in `generate`'s
    order), reading the prompt without its left pads (`sampler.fill_pads`);
    the config itself leaves every processor off.
    """

    def __init__(self, model: PreTrainedModel, sampling: SamplingSettings):
        self.model = model
        self.processors = logits_processors(sampling)
        self.config = GenerationConfig(
            do_sample=True,
            max_new_tokens=sampling.max_completion_length,
            top_k=0,  # off here (the processors apply the value); None would let transformers fill in its default of 50
            eos_token_id=list(sampling.eos_token_ids),
            pad_token_id=sampling.pad_token_id,
            use_cache=True,
        )

    @torch.no_grad()
    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int) -> Samples:
        lm = decoder_of(self.model)
        was_training, own_config = self.model.training, lm.generation_config
        self.model.eval()  # no dropout, and gradient checkpointing (train-only) keeps the cache on
        lm.generation_config = GenerationConfig()
        try:
            out = self.model.generate(
                input_ids=prompt_ids.repeat_interleave(num_generations, dim=0),
                attention_mask=prompt_mask.repeat_interleave(num_generations, dim=0),
                generation_config=self.config,
                logits_processor=LogitsProcessorList([_OnRealTokens(self.processors, fill_pads(prompt_ids, prompt_mask).repeat_interleave(num_generations, dim=0))]),
            )
        finally:
            self.model.train(was_training)
            lm.generation_config = own_config
        return Samples(out[:, prompt_ids.shape[1] :], None)  # the trained weights sampled: no log-probs of its own


def generator_notices(generator: Generator) -> list[str]:
    """One start-up sentence per thing worth knowing about `generator` (the sampler's weight copy and its memory), else []."""
    sync = getattr(generator, "weight_sync", None)
    if sync is None:
        return []
    return [f"the sampler samples from its own {str(sync.dtype).removeprefix('torch.')} copy of the weights "
            f"({sync.nbytes / 2**20:.0f} MiB), refreshed once per rollout."]


class _OnRealTokens(LogitsProcessor):
    """`processors` reading `prompt_ids` (N, P) in place of the first P columns of `generate`'s tokens (pads filled)."""

    def __init__(self, processors: LogitsProcessorList, prompt_ids: torch.Tensor):
        self.processors, self.prompt_ids = processors, prompt_ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        P = self.prompt_ids.shape[1]
        return self.processors(torch.cat([self.prompt_ids, input_ids[:, P:]], dim=1), scores)


def build_generator(backend: str, model: torch.nn.Module, sampling: SamplingSettings, *, weights_dtype: torch.dtype | None = None) -> Generator:
    """The `Generator` for `generation_backend`: fastgrpo's `Sampler`, or transformers' `generate`.

    Args:
        backend: "fastgrpo" or "transformers".
        model: the policy (unwrapped from DDP; a peft model is fine).
        sampling: the `SamplingSettings` both backends sample with.
        weights_dtype: e.g. torch.bfloat16: the sampler samples from its own copy of the
            weights in that dtype (`WeightSync`, refreshed once per rollout); None: from
            the policy itself. `generate` always runs the policy itself.
    Returns:
        A `Sampler`, or a `TransformersGenerator` when asked for or when the
        sampler cannot run this model (a one-line `UserWarning` says why).
    Raises:
        ValueError: an unknown backend.
    """
    if backend not in GENERATION_BACKENDS:
        raise ValueError(f"generation_backend={backend!r}: use one of {', '.join(GENERATION_BACKENDS)}.")
    if backend == "fastgrpo":
        reason = unsupported_reason(model)
        if reason is None:
            return Sampler(model, sampling, weight_sync=WeightSync(model, weights_dtype) if weights_dtype is not None else None)
        warnings.warn(f"fastgrpo's sampler cannot run {reason}; generating with transformers' generate instead.", stacklevel=2)
    return TransformersGenerator(model, sampling)
