"""Producing and scoring one batch: prompts → G completions each (a producer) → rewards.

A producer makes the completions: `SingleTurn` here (one sampled reply per
row), or the agent producers (agents/: multi-turn with tools or environments,
a user's `rollout_func`); `collect` scores whatever a producer returns.

Not here: generating (generation/), calling reward functions (rewards.py), Â (assembly.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from ..generation.contract import GenerationBackend
from .record import Generated, Rollout, completion_mask, stopped_mask
from .rewards import reward_columns


class SingleTurn:
    """The single-turn producer: G sampled replies per prompt, each ending at its first EOS or stop string.

    Args:
        encode: prompts → (prompt_ids (B, P), prompt_mask (B, P), number truncated).
        backend: the `GenerationBackend`; its `sample(prompt_ids (B, P), prompt_mask (B, P), G)` gives
            completion_ids (B·G, T) and the sampler's log-probs or None (each prompt once: the
            backend shares its prefill among the G completions).
        decode: (completion_ids, completion_mask, prompts) → completions as
            reward functions take them (text, or assistant messages).
        eos_token_ids: every id that ends a completion.
    """

    def __init__(self, encode: Callable, backend: GenerationBackend, decode: Callable, eos_token_ids: Sequence[int]):
        self.encode, self.backend, self.decode, self.eos_token_ids = encode, backend, decode, eos_token_ids

    def __call__(self, rows: list[dict], num_generations: int) -> Generated:
        prompts = [row["prompt"] for row in rows]
        prompt_ids, prompt_mask, num_truncated = self.encode(prompts)
        completion_ids, sampling_logps, stop_lengths = self.backend.sample(prompt_ids, prompt_mask, num_generations)  # (B·G, T) each
        mask, stopped = stopped_mask(completion_mask(completion_ids, self.eos_token_ids), stop_lengths)  # a stop string's row ends there
        is_eos = torch.isin(completion_ids, torch.tensor(list(self.eos_token_ids), device=completion_ids.device))
        repeated = [p for p in prompts for _ in range(num_generations)]
        return Generated(
            prompt_ids=prompt_ids.repeat_interleave(num_generations, dim=0),  # (B·G, P), groups contiguous
            prompt_mask=prompt_mask.repeat_interleave(num_generations, dim=0),
            completion_ids=completion_ids, completion_mask=mask, is_truncated=~(is_eos.any(-1) | stopped), prompts=repeated,
            completions=self.decode(completion_ids, mask, repeated), num_truncated_prompts=num_truncated,
            sampling_logps=sampling_logps,
        )


def collect(
    rows: list[dict],
    *,
    num_generations: int,
    produce: Callable[[list[dict], int], Generated],
    score: Callable[..., torch.Tensor],
    timer: Callable[[str], AbstractContextManager],
) -> Rollout:
    """Produce G completions for each prompt row and score them (Â comes once the rollout is assembled: assembly.py).

    Args:
        rows: B dataset rows (dicts with "prompt" and any other columns).
        produce: (rows, G) → `Generated` (`SingleTurn`, or an agent producer).
        score: (prompts, completions, completion_ids, columns) → rewards (B·G, R); columns
            is {dataset column or producer keyword: B·G values} (a dict: no column name meets a
            parameter name). completion_ids are each row's completion tokens (every turn's, tool
            tokens included, as TRL passes them).
        timer: phase timer; phases "generate" and "score".
    Returns:
        A `Rollout` of B·G completions, groups contiguous, with the sampler's log-probs
        (if any) but without Â and π_old/π_ref log-probs.
    """
    with timer("generate"):
        out = produce(rows, num_generations)
    with timer("score"):
        columns = {key: [row[key] for row in rows for _ in range(num_generations)] for key in reward_columns(rows[0])}
        token_lists = [ids[m.bool()].tolist() for ids, m in zip(out.completion_ids, out.completion_mask)]
        rewards = score(out.prompts, out.completions, token_lists, {**columns, **out.reward_kwargs})
    return Rollout.scored(out, rewards)
