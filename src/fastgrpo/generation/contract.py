"""The generation contract: what every backend implements and the loop calls, and the records that cross it.

`GenerationBackend` is implemented by fastgrpo's own sampler (sampler.py), transformers' `generate`
(transformers_generate.py) and, for GPU users, vLLM; `build.build_backend` chooses one once, and nothing
after that asks which it is (no attribute probing). `SamplingSettings` go in, `Samples` come out; a
multi-turn rollout samples through the backend's `Turns`.

Weights: a backend may sample from a weight copy of its own (weight_copy.py); the loop calls
`update_weights(policy)` once per rollout, before sampling, when an optimizer step happened since the
last call (TRL syncs before generation). `owns_weights` says whether that copy is a second policy (the
own sampler's bf16 copy, vLLM): its log-probs come back in `Samples.logps` and TRL's
vllm_importance_sampling_* corrects for them. FSDP's gathered copy is updated the same way but holds the
trained weights themselves (the dtype the sharded forward computes in), so it owns no second policy.

Not here: the backends (sampler.py, transformers_generate.py), choosing one (build.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from ..config.generation_kwargs import end_token_ids, masks, stop_strings, vllm_params
from ..config.structured_outputs import resolve as structured_outputs


class EngineError(RuntimeError):
    """A generation engine that is down, slow or wrong (a vLLM server that does not answer, dies, or serves another model).

    Its message is one sentence naming the engine and the fix; the command line prints it without a traceback.
    """


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
        stop_strings: texts that end a completion at the token completing one (transformers'
            `stop_strings`, vLLM's `stop`: config/generation_kwargs.py); that token is kept.
        vllm_params: further vLLM `SamplingParams` fields, sent as given (penalties, the masks `bad_words`, `logit_bias` with
            int keys and `allowed_token_ids`, the flags of vLLM's text).
        structured_outputs: vLLM's `StructuredOutputsParams` as a dict ({"regex": "(yes|no)"}): every completion
            matches it (vllm_structured_outputs_regex, else generation_kwargs' dict: config/structured_outputs.py); None: off.
        suppress_tokens, bad_words_ids, min_new_tokens: transformers' masks from generation_kwargs (without vLLM): ids never
            sampled, id sequences never completed, no EOS before this many completion tokens (0 = off); applied by transformers'
            own processors (processors.py), which change only which tokens are drawn, never the log-probs.
    """

    max_completion_length: int
    eos_token_ids: Sequence[int]
    pad_token_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    stop_strings: tuple[str, ...] = ()
    vllm_params: dict = field(default_factory=dict)
    structured_outputs: dict | None = None
    suppress_tokens: tuple[int, ...] = ()
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    min_new_tokens: int = 0

    @classmethod
    def from_config(cls, args, eos_token_ids: Sequence[int], pad_token_id: int, vocab_size: int | None = None) -> SamplingSettings:
        """The settings from a `GRPOConfig`'s fields of the same names, with the model's EOS and pad ids; `generation_kwargs`'
        stop strings and ids as the run's engine means them (config/generation_kwargs.py: vLLM's `stop_token_ids` join the
        EOS ids, transformers' `eos_token_id` replaces them).

        Raises:
            ValueError: a stop or masked token id ≥ `vocab_size` (the policy's embedding rows; None: not checked), before any engine starts.
        """
        kwargs, vllm = args.generation_kwargs, args.generation_backend == "vllm"
        return cls(
            args.max_completion_length, end_token_ids(kwargs, vllm, eos_token_ids, vocab_size), pad_token_id, args.temperature, args.top_p, args.top_k,
            args.min_p, args.repetition_penalty, stop_strings(kwargs, vllm), vllm_params(kwargs, vocab_size) if vllm else {},
            structured_outputs(args.vllm_structured_outputs_regex, kwargs) if vllm else None, **masks(kwargs, vllm, vocab_size),
        )

    def __post_init__(self):
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))  # no list the caller could change later


class Samples(NamedTuple):
    """What a generator returns for B prompts and G (rows grouped: i·G … i·G+G−1 belong to prompt i)."""

    completion_ids: torch.Tensor  # (B·G, T) sampled tokens, right-padded with pad_token_id after EOS
    logps: torch.Tensor | None  # (B·G, T) the sampler's log softmax(logits / temperature) of each token, 0 after EOS;
    # None where the tokens were sampled by the trained weights themselves (sampling = π_old, no correction)
    stop_lengths: torch.Tensor | None = None  # (B·G,) long: a row a stop string ended holds this many tokens (through the
    # token completing it; pads after), 0 for the others (they end at their first EOS, or run to T); None: no stop strings


class Turn(NamedTuple):
    """One sampled turn of one row."""

    tokens: list[int]  # up to and including its EOS (none when cut by its budget)
    logps: list[float] | None  # the sampler's log-prob of each token (None: the backend gives none)


class Turns(Protocol):
    """Samples the turns of one multi-turn rollout, row by row (rollout/agents/multiturn.py drives it)."""

    own_weights: bool  # sampled from a weight copy of its own (bf16, vLLM): its log-probs are a second policy to correct for

    def first(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, budget: int) -> list[Turn]:
        """(B, P) left-padded prompts → B·G first turns (rows i·G … i·G+G−1 for prompt i), each ≤ budget tokens."""
        ...

    def extend(self, rows: list[int], appended: list[list[int]], budgets: list[int]) -> list[Turn]:
        """Rows `rows` (indices among the N) continue after `appended` tokens each; → one turn each, ≤ its budget."""
        ...


class GenerationBackend(Protocol):
    """What samples a rollout's completions; the loop calls exactly these (module docstring)."""

    owns_weights: bool  # True: samples from a second policy of its own; Samples.logps are given. False: logps is None

    def update_weights(self, policy: torch.nn.Module) -> None:
        """Push the policy's current full weights (LoRA merged, FSDP shards gathered) into the backend's copy; no-op without one."""
        ...

    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, max_new_tokens: int | None = None) -> Samples:
        """(B, P) left-padded prompt ids + mask, G, T_max (None: max_completion_length) → `Samples`: (B·G, T) completion ids
        (rows i·G … i·G+G−1 are prompt i's), right-padded with pad after EOS, T ≤ T_max; (B·G, T) sampler log-probs or None."""
        ...

    def turns(self) -> Turns:
        """A fresh multi-turn engine for one rollout (the own sampler's keeps each row's KV cache; the others re-prefill)."""
        ...

    def notices(self) -> list[str]:
        """One start-up sentence per thing the user should know (its weight copy and its memory), else []."""
        ...

    def close(self) -> None:
        """Release engine resources; the trainer calls it at the end of train(). The backend stays usable: `evaluate()` or
        another `train()` may follow (a colocated vLLM engine starts again at its next use)."""
        ...
