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

from .sampling import Samples


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
    sampling_logps: torch.Tensor | None = None  # (N, T) log-prob under the sampler's own (bf16) weights; None: π_old sampled
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
            sampling_logps=cut(self.sampling_logps),
            ref_logps=cut(self.ref_logps),
            tool_mask=cut(self.tool_mask),
        )

    def take(self, rows: torch.Tensor) -> Rollout:
        """The rows at long indices `rows` (n,), in that order, untrimmed (whole groups: index them group by group)."""
        index = rows.tolist()
        pick = lambda t: None if t is None else t[rows.to(t.device)]  # noqa: E731
        return dataclasses.replace(
            self,
            prompt_ids=pick(self.prompt_ids),
            prompt_mask=pick(self.prompt_mask),
            completion_ids=pick(self.completion_ids),
            completion_mask=pick(self.completion_mask),
            is_truncated=pick(self.is_truncated),
            rewards=pick(self.rewards),
            advantages=pick(self.advantages),
            prompts=[self.prompts[i] for i in index],
            completions=[self.completions[i] for i in index],
            old_logps=pick(self.old_logps),
            sampling_logps=pick(self.sampling_logps),
            ref_logps=pick(self.ref_logps),
            tool_mask=pick(self.tool_mask),
        )

    def micro_batches(self, size: int) -> list[Rollout]:
        """Consecutive views of `size` completions each (the last N/size of them); N must divide."""
        if len(self) % size:
            raise ValueError(f"a rollout of {len(self)} completions does not split into micro-batches of {size}.")
        return [self.select(slice(start, start + size)) for start in range(0, len(self), size)]


def micro_batch_rows(rows: int, count: int) -> list[slice]:
    """`rows` rows in `count` consecutive slices whose sizes differ by at most 1 (the first ones larger).

    A full rollout (rows = count × per_device_train_batch_size) gives slices of
    exactly that size; a smaller one (dynamic sampling at its round cap) keeps
    the same number of micro-batches, each smaller, so every process makes the
    same optimizer steps and the same collectives.

    Raises:
        ValueError: fewer rows than slices (a micro-batch would be empty).
    """
    if rows < count:
        raise ValueError(f"{rows} completions do not fill {count} micro-batches; every micro-batch needs at least one.")
    bounds = [i * rows // count for i in range(count + 1)]
    return [slice(start, end) for start, end in zip(bounds, bounds[1:])]


def concat(parts: Sequence[Rollout]) -> Rollout:
    """The rows of `parts` one after the other, prompt columns left-padded and completion columns right-padded.

    Padding is mask 0 (ids 0). `old_logps` is kept when any part has it: a part
    without it gets NaN rows (π_old still to be computed), and padding columns
    are 0 (never read: the completion mask is 0 there). `sampling_logps` is
    kept when every part has it (a run's sampler keeps them always or never).
    `ref_logps` must be absent from every part (π_ref is computed on the
    assembled rollout).

    Raises:
        ValueError: no parts, a part with ref_logps, or sampling_logps in some parts only.
    """
    if not parts:
        raise ValueError("concat() needs at least one rollout.")
    if any(p.ref_logps is not None for p in parts):
        raise ValueError("concat() takes rollouts without ref_logps; compute π_ref on the concatenated rollout.")
    if len({p.sampling_logps is None for p in parts}) > 1:
        raise ValueError("concat() takes rollouts that all have sampling_logps or none do.")
    P = max(p.prompt_ids.shape[1] for p in parts)
    T = max(p.completion_ids.shape[1] for p in parts)
    left = lambda t, value: torch.nn.functional.pad(t, (P - t.shape[1], 0), value=value)  # noqa: E731
    right = lambda t, value: torch.nn.functional.pad(t, (0, T - t.shape[1]), value=value)  # noqa: E731
    cat = lambda ts: torch.cat([t.to(parts[0].rewards.device) for t in ts])  # noqa: E731
    old = None
    if any(p.old_logps is not None for p in parts):
        nan_rows = lambda p: torch.full(p.completion_ids.shape, float("nan"), device=p.completion_ids.device)  # noqa: E731
        old = cat([right(p.old_logps if p.old_logps is not None else nan_rows(p), 0.0) for p in parts])
    return Rollout(
        prompt_ids=cat([left(p.prompt_ids, 0) for p in parts]),
        prompt_mask=cat([left(p.prompt_mask, 0) for p in parts]),
        completion_ids=cat([right(p.completion_ids, 0) for p in parts]),
        completion_mask=cat([right(p.completion_mask, 0) for p in parts]),
        is_truncated=cat([p.is_truncated for p in parts]),
        rewards=cat([p.rewards for p in parts]),
        advantages=cat([p.advantages for p in parts]),
        prompts=[x for p in parts for x in p.prompts],
        completions=[x for p in parts for x in p.completions],
        old_logps=old,
        sampling_logps=None if parts[0].sampling_logps is None else cat([right(p.sampling_logps, 0.0) for p in parts]),
        num_truncated_prompts=sum(p.num_truncated_prompts for p in parts),
        tool_mask=None if all(p.tool_mask is None for p in parts) else cat([right(p.model_mask(), 0) for p in parts]),
        tool_calls=None if all(p.tool_calls is None for p in parts) else sum(p.tool_calls or 0 for p in parts),
        tool_failures=sum(p.tool_failures for p in parts),
    )


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
        generate: (prompt_ids (B, P), prompt_mask (B, P), G) → `Samples`: completion_ids
            (B·G, T) and the sampler's log-probs or None, the `Generator` protocol
            (each prompt once: the backend shares its prefill among the G completions).
        decode: (completion_ids, completion_mask, prompts) → completions as
            reward functions take them (text, or assistant messages).
        eos_token_ids: every id that ends a completion.
    """

    def __init__(self, encode: Callable, generate: Callable, decode: Callable, eos_token_ids: Sequence[int]):
        self.encode, self.generate, self.decode, self.eos_token_ids = encode, generate, decode, eos_token_ids

    def __call__(self, rows: list[dict], num_generations: int) -> Generated:
        prompts = [row["prompt"] for row in rows]
        prompt_ids, prompt_mask, num_truncated = self.encode(prompts)
        completion_ids, sampling_logps = self.generate(prompt_ids, prompt_mask, num_generations)  # (B·G, T) each
        mask = completion_mask(completion_ids, self.eos_token_ids)
        is_eos = torch.isin(completion_ids, torch.tensor(list(self.eos_token_ids), device=completion_ids.device))
        repeated = [p for p in prompts for _ in range(num_generations)]
        return Generated(
            prompt_ids=prompt_ids.repeat_interleave(num_generations, dim=0),  # (B·G, P), groups contiguous
            prompt_mask=prompt_mask.repeat_interleave(num_generations, dim=0),
            completion_ids=completion_ids, completion_mask=mask, is_truncated=~is_eos.any(-1), prompts=repeated,
            completions=self.decode(completion_ids, mask, repeated), num_truncated_prompts=num_truncated,
            sampling_logps=sampling_logps,
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
        score: (prompts, completions, completion_ids, columns) → rewards (B·G, R); columns
            is {dataset column or producer keyword: B·G values} (a dict: no column name meets a
            parameter name). completion_ids are each row's completion tokens (every turn's, tool
            tokens included, as TRL passes them).
        advantages: rewards (B·G, R) → Â (B·G,) (group maths in advantages.py).
        timer: phase timer; phases "generate" and "score".
    Returns:
        A `Rollout` of B·G completions, groups contiguous, with the sampler's log-probs
        (if any) but without π_old/π_ref log-probs.
    """
    with timer("generate"):
        out = produce(rows, num_generations)
    with timer("score"):
        columns = {key: [row[key] for row in rows for _ in range(num_generations)] for key in rows[0] if key != "prompt"}
        token_lists = [ids[m.bool()].tolist() for ids, m in zip(out.completion_ids, out.completion_mask)]
        rewards = score(out.prompts, out.completions, token_lists, {**columns, **out.reward_kwargs})
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
        sampling_logps=out.sampling_logps,
    )
