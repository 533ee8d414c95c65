"""The rollout record and `collect()`: prompts → G completions each (a producer) → rewards → advantages.

A `Rollout` is everything one generation produced for this process, as
tensors (docs/design.md, "Data that flows"). Groups of G completions are
contiguous rows; micro-batches are row slices with their padding trimmed, so
a micro-batch of short completions costs only its own tokens.

A producer makes the completions: `SingleTurn` here (one sampled reply per
row), or the agent producers (agents/: multi-turn with tools or environments,
a user's `rollout_func`); `collect` scores whatever a producer returns.

Not here: generating (generation.py), calling reward functions (rewards.py),
the advantage maths (advantages.py), log-prob passes (trainer.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch


def completion_mask(completion_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """1 on every token up to and including the first EOS, 0 after.

    Args:
        completion_ids: (N, T) generated tokens (right-padded; pad may equal EOS).
        eos_token_ids: every id that ends a completion.
    Returns:
        (N, T) long mask. A completion without EOS is all ones (truncated).
    """
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_token_ids), device=completion_ids.device))
    # eos_before[t] = number of EOS strictly before t: 0 means t is at or before the first EOS.
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()
    return (eos_before == 0).long()


@dataclass(frozen=True)
class Rollout:
    """One rollout of N completions (N = generation_batch_size / world_size).

    Rows i·G … i·G+G−1 are the G completions of prompt i (the group).
    """

    prompt_ids: torch.Tensor  # (N, P) prompt tokens, left-padded
    prompt_mask: torch.Tensor  # (N, P) 1 on real prompt tokens
    completion_ids: torch.Tensor  # (N, T) sampled tokens, right-padded
    completion_mask: torch.Tensor  # (N, T) 1 on the completion's tokens: up to and including the first EOS (single turn), every turn (multi-turn)
    is_truncated: torch.Tensor  # (N,) bool: the completion does not end with EOS (cut by max_completion_length)
    rewards: torch.Tensor  # (N, R) r per reward function; NaN = not applicable
    advantages: torch.Tensor  # (N,) Â, group-relative
    prompts: list  # N prompts as in the dataset (text or messages)
    completions: list  # N completions as reward functions saw them
    old_logps: torch.Tensor | None = None  # (N, T) log π_old; None: π_old = π_θ detached
    ref_logps: torch.Tensor | None = None  # (N, T) log π_ref; None when beta = 0
    num_truncated_prompts: int = 0  # prompts cut to max_prompt_length (left side)
    tool_mask: torch.Tensor | None = None  # (N, T) 1 on model tokens, 0 on tool/environment tokens (TRL's tool_mask / env_mask); None: all model
    tool_calls: int | None = None  # tool calls made in this rollout; None: no tools (nothing to log)
    tool_failures: int = 0  # calls that returned {"error": …}

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def model_mask(self) -> torch.Tensor:
        """(N, T) 1 on the tokens the policy sampled: completion_mask without tool/environment tokens.

        Every sum over "completion tokens" (loss, its normaliser, ratio, KL, entropy,
        clip statistics, logged lengths) runs over this mask; tool tokens stay in the
        sequence (completion_mask) as context only.
        """
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    def select(self, rows: slice) -> Rollout:
        """Rows `rows` with all-padding columns trimmed: prompt columns on the left, completion columns on the right."""
        prompt_mask, completion_mask_ = self.prompt_mask[rows], self.completion_mask[rows]
        first_prompt = int((prompt_mask.sum(0) > 0).long().argmax())  # left padding: first used column
        length = max(int(completion_mask_.sum(-1).max()), 1)
        cut_prompt = lambda t: t[rows, first_prompt:]  # noqa: E731
        cut = lambda t: None if t is None else t[rows, :length]  # noqa: E731
        return dataclasses.replace(
            self,
            prompt_ids=cut_prompt(self.prompt_ids),
            prompt_mask=cut_prompt(self.prompt_mask),
            completion_ids=cut(self.completion_ids),
            completion_mask=cut(self.completion_mask),
            is_truncated=self.is_truncated[rows],
            rewards=self.rewards[rows],
            advantages=self.advantages[rows],
            prompts=self.prompts[rows],
            completions=self.completions[rows],
            old_logps=cut(self.old_logps),
            ref_logps=cut(self.ref_logps),
            tool_mask=cut(self.tool_mask),
        )

    def micro_batches(self, size: int) -> list[Rollout]:
        """Consecutive views of `size` completions each (the last N/size of them); N must divide."""
        if len(self) % size:
            raise ValueError(f"a rollout of {len(self)} completions does not split into micro-batches of {size}.")
        return [self.select(slice(start, start + size)) for start in range(0, len(self), size)]


@dataclass(frozen=True)
class Generated:
    """What a producer returns for B prompt rows: N = B·G completions, groups contiguous, not yet scored."""

    prompt_ids: torch.Tensor  # (N, P) left-padded
    prompt_mask: torch.Tensor  # (N, P)
    completion_ids: torch.Tensor  # (N, T) right-padded
    completion_mask: torch.Tensor  # (N, T) 1 on the completion's tokens
    is_truncated: torch.Tensor  # (N,) bool
    prompts: list  # N prompts as the model saw them (an environment's reset() may add to them)
    completions: list  # N completions as reward functions take them (text, or a list of messages)
    num_truncated_prompts: int = 0
    tool_mask: torch.Tensor | None = None  # (N, T) 1 on model tokens, 0 on tool/environment tokens
    reward_kwargs: dict = field(default_factory=dict)  # extra keywords for the reward functions, N values each
    tool_calls: int | None = None
    tool_failures: int = 0
    sampling_logps: torch.Tensor | None = None  # (N, T) log-probs of the sampled tokens under the sampler; 0 on tool tokens


class SingleTurn:
    """The single-turn producer: G sampled replies per prompt, each ending at its first EOS.

    Args:
        encode: prompts → (prompt_ids (B, P), prompt_mask (B, P), number truncated).
        generate: (prompt_ids (B, P), prompt_mask (B, P), G) → completion_ids
            (B·G, T), the `Generator` protocol (each prompt once: the backend
            shares its prefill among the G completions).
        decode: (completion_ids, completion_mask, prompts) → completions as
            reward functions take them (text, or assistant messages).
        eos_token_ids: every id that ends a completion.
    """

    def __init__(self, encode: Callable, generate: Callable, decode: Callable, eos_token_ids: Sequence[int]):
        self.encode, self.generate, self.decode, self.eos_token_ids = encode, generate, decode, eos_token_ids

    def __call__(self, rows: list[dict], num_generations: int) -> Generated:
        prompts = [row["prompt"] for row in rows]
        prompt_ids, prompt_mask, num_truncated = self.encode(prompts)
        completion_ids = self.generate(prompt_ids, prompt_mask, num_generations)  # (B·G, T)
        mask = completion_mask(completion_ids, self.eos_token_ids)
        is_eos = torch.isin(completion_ids, torch.tensor(list(self.eos_token_ids), device=completion_ids.device))
        repeated = [p for p in prompts for _ in range(num_generations)]
        return Generated(
            prompt_ids=prompt_ids.repeat_interleave(num_generations, dim=0),  # (B·G, P), groups contiguous
            prompt_mask=prompt_mask.repeat_interleave(num_generations, dim=0),
            completion_ids=completion_ids, completion_mask=mask, is_truncated=~is_eos.any(-1), prompts=repeated,
            completions=self.decode(completion_ids, mask, repeated), num_truncated_prompts=num_truncated,
        )


def collect(
    rows: list[dict],
    *,
    num_generations: int,
    produce: Callable[[list[dict], int], Generated],
    score: Callable[..., torch.Tensor],
    advantages: Callable[[torch.Tensor], torch.Tensor],
    timer: Callable[[str], AbstractContextManager],
) -> Rollout:
    """Produce G completions for each prompt row, score them and compute Â.

    Args:
        rows: B dataset rows (dicts with "prompt" and any other columns).
        produce: (rows, G) → `Generated` (`SingleTurn`, or an agent producer).
        score: (prompts, completions, completion_ids, **columns) → rewards (B·G, R).
            completion_ids are each row's completion tokens (every turn's, tool
            tokens included, as TRL passes them).
        advantages: rewards (B·G, R) → Â (B·G,) (group maths in advantages.py).
        timer: phase timer; phases "generate" and "score".
    Returns:
        A `Rollout` of B·G completions, groups contiguous, without π_old/π_ref log-probs.
    """
    with timer("generate"):
        out = produce(rows, num_generations)
    with timer("score"):
        columns = {key: [row[key] for row in rows for _ in range(num_generations)] for key in rows[0] if key != "prompt"}
        token_lists = [ids[m.bool()].tolist() for ids, m in zip(out.completion_ids, out.completion_mask)]
        rewards = score(out.prompts, out.completions, token_lists, **columns, **out.reward_kwargs)
        adv = advantages(rewards)
    return Rollout(
        prompt_ids=out.prompt_ids,
        prompt_mask=out.prompt_mask,
        completion_ids=out.completion_ids,
        completion_mask=out.completion_mask,
        is_truncated=out.is_truncated,
        rewards=rewards,
        advantages=adv,
        prompts=out.prompts,
        completions=out.completions,
        num_truncated_prompts=out.num_truncated_prompts,
        tool_mask=out.tool_mask,
        tool_calls=out.tool_calls,
        tool_failures=out.tool_failures,
    )
