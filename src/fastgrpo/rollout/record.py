"""The rollout records: `Generated` (what a producer returns) and `Rollout` (scored, with Â and log-probs).

A `Rollout` is everything one generation produced for this process, as
tensors (docs/design.md, "Data that flows"). Groups of G completions are
contiguous rows; micro-batches are row slices with their padding trimmed, so
a micro-batch of short completions costs only its own tokens.

Both records share their per-row fields (`Completions`); each field declares
how it is laid out (`ROWS` metadata: prompt columns, completion columns, one
value per row, a list per row, or one count per rollout), and `select`, `take`
and `concat` read that, so a new field is one line here.

Not here: producing and scoring (collect.py), generating (generation/),
the advantage maths (algo/advantages.py), log-prob passes (update/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

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


def stopped_mask(mask: torch.Tensor, stop_lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The completion mask with each stop-string row's end put where the backend says it ended, and which rows ended there.

    Args:
        mask: (N, T) `completion_mask` (up to the first EOS; all ones without one).
        stop_lengths: (N,) long `Samples.stop_lengths` (a row a stop string ended holds that many tokens; 0: read from
            EOS), or None (no stop strings).
    Returns:
        (N, T) long mask (1 on a stopped row's tokens through the one completing the stop string, 0 on the pads after it),
        (N,) bool stopped rows (finished, as at EOS; TRL's rule, "last id is EOS or pad", counts them truncated).
    """
    if stop_lengths is None:
        return mask, torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    stopped = stop_lengths > 0
    within = torch.arange(mask.shape[1], device=mask.device) < stop_lengths[:, None]  # (N, T)
    return torch.where(stopped[:, None], within.long(), mask), stopped


# How a field is laid out, read by select/take/concat: (N, P) left-padded prompt columns, (N, T) right-padded
# completion columns, one tensor row per completion, one list entry per completion, or one count per rollout.
PROMPT, COMPLETION, ROW, LIST, COUNT = "prompt", "completion", "row", "list", "count"


def _layout(kind: str, default=None, factory=None):
    """A dataclass field of layout `kind` (no default: required)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"rows": kind})
    if default is _REQUIRED:
        return field(metadata={"rows": kind})
    return field(default=default, metadata={"rows": kind})


_REQUIRED = object()


@dataclass(frozen=True, kw_only=True)
class Completions:
    """The fields every record of N completions holds, groups of G contiguous (rows i·G … i·G+G−1: prompt i)."""

    prompt_ids: torch.Tensor = _layout(PROMPT, _REQUIRED)  # (N, P) prompt tokens, left-padded
    prompt_mask: torch.Tensor = _layout(PROMPT, _REQUIRED)  # (N, P) 1 on real prompt tokens
    completion_ids: torch.Tensor = _layout(COMPLETION, _REQUIRED)  # (N, T) sampled tokens, right-padded
    completion_mask: torch.Tensor = _layout(COMPLETION, _REQUIRED)  # (N, T) 1 on the completion's tokens: up to and including the first EOS (single turn), every turn (multi-turn)
    is_truncated: torch.Tensor = _layout(ROW, _REQUIRED)  # (N,) bool: the completion ends at neither EOS nor a stop string (cut by max_completion_length)
    prompts: list = _layout(LIST, _REQUIRED)  # N prompts as the model saw them (text or messages; an environment's reset() may add to them)
    completions: list = _layout(LIST, _REQUIRED)  # N completions as reward functions take them (text, or a list of messages)
    sampling_logps: torch.Tensor | None = _layout(COMPLETION)  # (N, T) log-prob under the sampler's own weights (0 on tool tokens); None: π_old sampled
    num_truncated_prompts: int = _layout(COUNT, 0)  # prompts cut to max_prompt_length (left side)
    tool_mask: torch.Tensor | None = _layout(COMPLETION)  # (N, T) 1 on model tokens, 0 on tool/environment tokens (TRL's tool_mask / env_mask); None: all model
    tool_calls: int | None = _layout(COUNT)  # tool calls made in this rollout; None: no tools (nothing to log)
    tool_failures: int = _layout(COUNT, 0)  # calls that returned {"error": …}

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def model_mask(self) -> torch.Tensor:
        """(N, T) 1 on the tokens the policy sampled: completion_mask without tool/environment tokens.

        Every sum over "completion tokens" (loss, its normaliser, ratio, KL, entropy,
        clip statistics, logged lengths) runs over this mask; tool tokens stay in the
        sequence (completion_mask) as context only.
        """
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask


@dataclass(frozen=True, kw_only=True)
class Generated(Completions):
    """What a producer returns for B prompt rows: N = B·G completions, groups contiguous, not yet scored."""

    reward_kwargs: dict = field(default_factory=dict)  # extra keywords for the reward functions, N values each


@dataclass(frozen=True, kw_only=True)
class Rollout(Completions):
    """One rollout of N completions (N = generation_batch_size / world_size), scored.

    Â is set once, on the assembled rollout (assembly.py); π_old and π_ref by the log-prob passes (update/).
    """

    rewards: torch.Tensor = _layout(ROW, _REQUIRED)  # (N, R) r per reward function; NaN = not applicable
    advantages: torch.Tensor | None = _layout(ROW)  # (N,) Â, group-relative; None until the rollout is assembled
    old_logps: torch.Tensor | None = _layout(COMPLETION)  # (N, T) log π_old; NaN: still to compute; None: π_old = π_θ detached
    ref_logps: torch.Tensor | None = _layout(COMPLETION)  # (N, T) log π_ref; None when beta = 0

    @classmethod
    def scored(cls, out: Generated, rewards: torch.Tensor) -> Rollout:
        """A producer's completions with their (N, R) rewards; no Â, π_old or π_ref yet."""
        shared = {f.name: getattr(out, f.name) for f in fields(Completions)}
        return cls(**shared, rewards=rewards)

    def select(self, rows: slice) -> Rollout:
        """Rows `rows` with all-padding columns trimmed: prompt columns on the left, completion columns on the right."""
        first_prompt = int((self.prompt_mask[rows].sum(0) > 0).long().argmax())  # left padding: first used column
        length = max(int(self.completion_mask[rows].sum(-1).max()), 1)
        cut = {
            PROMPT: lambda t: t[rows, first_prompt:], COMPLETION: lambda t: t[rows, :length], ROW: lambda t: t[rows],
            LIST: lambda t: t[rows], COUNT: lambda t: t,
        }
        return self._apply(cut)

    def take(self, rows: torch.Tensor) -> Rollout:
        """The rows at long indices `rows` (n,), in that order, untrimmed (whole groups: index them group by group)."""
        index = rows.tolist()
        pick = lambda t: t[rows.to(t.device)]  # noqa: E731
        return self._apply({PROMPT: pick, COMPLETION: pick, ROW: pick, LIST: lambda t: [t[i] for i in index], COUNT: lambda t: t})

    def _apply(self, by_layout: dict) -> Rollout:
        """Every field through the function of its layout (None stays None)."""
        changes = {}
        for f in fields(self):
            value = getattr(self, f.name)
            changes[f.name] = None if value is None else by_layout[f.metadata["rows"]](value)
        return dataclasses.replace(self, **changes)

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
    `tool_mask` is kept when any part has it (a part without: its model_mask).
    `advantages` are kept when every part has them. `ref_logps` must be absent
    from every part (π_ref is computed on the assembled rollout). Counts add up
    (`tool_calls` stays None when it is None in every part).

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
    device = parts[0].rewards.device
    pad = {
        PROMPT: lambda t: torch.nn.functional.pad(t, (P - t.shape[1], 0), value=0),
        COMPLETION: lambda t: torch.nn.functional.pad(t, (0, T - t.shape[1]), value=0),
        ROW: lambda t: t,
    }
    # What each part contributes to a field that some part has (the rest: the result is None unless every part has it).
    contribution = {
        "old_logps": lambda p: p.old_logps if p.old_logps is not None else torch.full(p.completion_ids.shape, float("nan"), device=p.completion_ids.device),
        "tool_mask": lambda p: p.model_mask(),
    }
    values = {}
    for f in fields(Rollout):
        kind, got = f.metadata["rows"], [getattr(p, f.name) for p in parts]
        if kind == LIST:
            values[f.name] = [x for g in got for x in g]
        elif kind == COUNT:
            values[f.name] = None if all(g is None for g in got) else sum(g or 0 for g in got)
        elif all(g is None for g in got) or (f.name not in contribution and any(g is None for g in got)):
            values[f.name] = None
        else:
            filled = [contribution[f.name](p) for p in parts] if f.name in contribution else got
            values[f.name] = torch.cat([pad[kind](g).to(device) for g in filled])
    return Rollout(**values)
