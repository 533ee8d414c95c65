"""transformers' `generate` as a generation backend, for a model fastgrpo's own sampler cannot run (or when asked for).

It samples with the configured values only: the model's own `generation_config.json` (a top_k, a minimum length …)
never changes what is sampled, since the training log-probs assume the configured distribution.

Not here: the contract (contract.py), choosing the backend (build.py), masks after EOS (rollout/record.py).
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList, StopStringCriteria

from ..model.experts import router_kwargs
from ..model.loading import decoder_of
from .contract import Samples, SamplingSettings
from .processors import OnRealTokens, fill_pads, logits_processors
from .reprefill import Reprefill
from .stops import OnCompletion, stop_lengths
from .weight_copy import WeightCopy


class TransformersGenerator:
    """The `GenerationBackend` that samples with `model.generate` (KV cache on), one call per rollout, prompts repeated G times.

    Args:
        model: the policy (the unwrapped module; DDP wrappers do not generate).
        sampling: the `SamplingSettings`, passed to `transformers.GenerationConfig`.
        weight_copy: FSDP's gathered copy (weight_copy.GatheredCopy) it runs instead of `model`; None: `model` itself.
        stops: transformers' `StopStringCriteria` for the stop strings (stops.stop_criteria), given to `generate` on the
            completion's tokens (`stops.OnCompletion`): a row ends at the token completing one, pads after, as transformers'
            `stop_strings` end it; None: no stop strings.
    The model's own `generation_config` is swapped for transformers' defaults
    during the call: `generate` would otherwise fill every value left unset
    here (min_new_tokens, no_repeat_ngram_size, …) from it. The sampling
    values reach `generate` as the sampler's own processor list
    (`processors.logits_processors`, transformers' classes in `generate`'s
    order), reading the prompt without its left pads (`processors.fill_pads`);
    the config itself leaves every processor off. It samples with the trained
    weights: `owns_weights` is False and `Samples.logps` None.
    """

    owns_weights = False

    def __init__(self, model: PreTrainedModel, sampling: SamplingSettings, *, weight_copy: WeightCopy | None = None,
                 stops: StopStringCriteria | None = None):
        self.model = model if weight_copy is None else weight_copy.module
        self.weight_copy, self.sampling, self.stops = weight_copy, sampling, stops
        self.config = GenerationConfig(
            do_sample=True,
            max_new_tokens=sampling.max_completion_length,
            top_k=0,  # off here (the processors apply the value); None would let transformers fill in its default of 50
            eos_token_id=list(sampling.eos_token_ids),
            pad_token_id=sampling.pad_token_id,
            use_cache=True,
        )

    def update_weights(self, policy: torch.nn.Module) -> None:
        """FSDP: gather the policy's shards into the copy `generate` runs; otherwise nothing (it runs the policy)."""
        if self.weight_copy is not None:
            self.weight_copy.update(policy)

    def turns(self) -> Reprefill:
        """Turns that re-run each continuing row's whole sequence (reprefill.py)."""
        return Reprefill(self, self.sampling.pad_token_id, self.sampling.eos_token_ids)

    def notices(self) -> list[str]:
        """Nothing to say at start-up."""
        return []

    def close(self) -> None:
        """Nothing to release."""

    @torch.no_grad()
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, max_new_tokens: int | None = None) -> Samples:
        """(B, P) left-padded prompts → `Samples` of B·G rows, at most `max_new_tokens` (None: max_completion_length) columns,
        with each row's stop length (`stops.stop_lengths`) when there are stop strings."""
        config = self.config
        if max_new_tokens is not None:  # a later turn's remaining budget
            config = copy.deepcopy(self.config)
            config.max_new_tokens = max_new_tokens
        lm = decoder_of(self.model)
        was_training, own_config = self.model.training, lm.generation_config
        self.model.eval()  # no dropout, and gradient checkpointing (train-only) keeps the cache on
        lm.generation_config = GenerationConfig()
        try:
            out = self.model.generate(
                input_ids=prompt_ids.repeat_interleave(num_generations, dim=0),
                attention_mask=prompt_mask.repeat_interleave(num_generations, dim=0),
                generation_config=config,
                logits_processor=LogitsProcessorList([OnRealTokens(logits_processors(self.sampling, prompt_ids.shape[1]),
                                                                   fill_pads(prompt_ids, prompt_mask).repeat_interleave(num_generations, dim=0))]),
                stopping_criteria=StoppingCriteriaList([] if self.stops is None else [OnCompletion(self.stops, prompt_ids.shape[1])]),
                **router_kwargs(lm.config, False),  # a config's output_router_logits=True fails in the cached steps (model/experts.py)
            )
        finally:
            self.model.train(was_training)
            lm.generation_config = own_config
        completion_ids = out[:, prompt_ids.shape[1] :]
        lengths = None if self.stops is None else stop_lengths(completion_ids, self.sampling.eos_token_ids, self.stops)
        return Samples(completion_ids, None, lengths)  # the trained weights sampled: no log-probs of its own
