"""A user's `rollout_func` as a producer (TRL 1.16's contract), its output checked before anything is scored.

    rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs", ["env_mask"], **extra}

It gets this process's B prompts each repeated G times, contiguously (B·G
prompts, as TRL 1.16's sampler makes the batch: G = num_generations, or
num_generations_eval in evaluation; copies, so changing them leaves the
dataset's rows as they are), and returns one completion per prompt
received: N = B·G entries per list, in the order received. Each
`completion_ids[i]` is the whole completion (every turn); `logprobs[i]` has
one value per token (None or NaN where the sampler has none: that token's
sampler–trainer ratio is 1 and it is left out of `sampling/sampling_logp_difference/*`,
as TRL 1.16; `"logprobs": None` says so for every token, as TRL 1.16 accepts it); `env_mask[i]` marks the model's tokens 1 and the
environment's 0 (TRL's `tool_mask`). Every other key reaches the reward
functions as a keyword: a list as one value per completion, anything else
as the same value for every completion (TRL's broadcast).

Not here: scoring (rollout.collect), the built-in multi-turn loop (multiturn.py).
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..prompts import check_token_ids, is_conversational
from ..rewards import RESERVED_COLUMNS, reward_columns
from ..record import Generated

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")
# What a per-token row of logprobs / env_mask holds, for the error naming a row that is not a list.
ROW_FIX = {"logprobs": ' (None for a token the sampler gave none; "logprobs": None for none in any row)',
           "env_mask": " (1 = model token, 0 = environment token)"}
LOGP_SLACK = 1e-4  # a sampler's log-softmax may round a certain token's 0 up by float error; above this it is not a log-prob


def _as_list(row):
    """A tensor's or array's values as a list; anything else as given."""
    return row.tolist() if isinstance(row, (torch.Tensor, np.ndarray)) else list(row) if isinstance(row, tuple) else row


def _is_logp(value) -> bool:
    """None or NaN (no sampler log-prob), or a real number ≤ 0 (up to LOGP_SLACK)."""
    if value is None:
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and (value != value or value <= LOGP_SLACK)


def check_rollout_func(rollout_func) -> None:
    """Refuse a `rollout_func` that cannot be called as TRL 1.16 calls it, `rollout_func(prompts, trainer)`, before any
    model loads (it was Python's TypeError at the first rollout). A callable whose signature cannot be read is left to run.

    Raises:
        ValueError: not callable, async (`async def`: TRL never awaits it), or its parameters cannot take (prompts, trainer),
            naming them and the call it must take.
    """
    if not callable(rollout_func):
        raise ValueError(f"rollout_func is {rollout_func!r}; give a function (prompts, trainer) -> dict.")
    if inspect.iscoroutinefunction(rollout_func):  # it returned a coroutine, refused at the first rollout after the model loaded
        name = getattr(rollout_func, "__name__", repr(rollout_func))
        raise ValueError(f"rollout_func is the async function {name!r}; TRL calls rollout_func(prompts, trainer) synchronously and "
                         "reads the dict it returns: make it a plain def that returns the dict (run its coroutines inside, e.g. with "
                         "asyncio.run).")
    try:
        signature = inspect.signature(rollout_func)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return
    try:
        signature.bind(None, None)
    except TypeError as err:
        raise ValueError(f"rollout_func{signature} cannot be called as rollout_func(prompts, trainer) ({err}); TRL calls it with the "
                         "rollout's prompts and the trainer: def rollout_func(prompts, trainer) -> dict.") from None


def check_output(output, num_prompts: int, num_generations: int) -> None:
    """Refuse a rollout_func output that does not follow the contract, naming the key and the fix.

    Args:
        output: what rollout_func returned.
        num_prompts: how many prompts it received (B·G: each prompt num_generations times).
        num_generations: G, named in the errors.
    Raises:
        ValueError: not a dict, a required key missing, a list whose length is not num_prompts (G× too many: the
            old fastgrpo contract, said so),
            a logprobs/env_mask row that is not a list (None, a number) or whose length differs from its completion_ids, an empty
            prompt, no completion token in any row, an id that is not a whole number, a log-prob
            that is not a number ≤ 0 (or None/NaN), env_mask values other than 0/1 or no 1 in any row, an extra key
            the reward protocol reserves, or an extra list with other than one value per prompt received
            (a value that is not a list reaches every completion, as TRL broadcasts it); a required key
            that is not a list (a generator).
    """
    if not isinstance(output, dict):
        raise ValueError(f"rollout_func returned type {type(output).__name__}; return a dict with keys {list(REQUIRED_KEYS)}.")
    clash = [k for k in output if k in RESERVED_COLUMNS and k not in REQUIRED_KEYS]
    if clash:
        raise ValueError(f"rollout_func returned a key {clash[0]!r}, which reward functions already receive; rename it.")
    missing = [k for k in REQUIRED_KEYS if k not in output]
    if missing:
        raise ValueError(f"rollout_func must return keys {sorted(missing)} in its output dict (got {sorted(output)}).")
    for key in (*REQUIRED_KEYS, *(["env_mask"] if "env_mask" in output else [])):
        if key == "logprobs" and output[key] is None:  # TRL 1.16: no sampler log-probs at all
            continue
        if not hasattr(output[key], "__len__"):
            raise ValueError(f"rollout_func returned {key} of type {type(output[key]).__name__}; return a list (one entry per prompt "
                             "received), e.g. list(...) around a generator.")
        if len(output[key]) == num_prompts * num_generations != num_prompts:
            raise ValueError(
                f"rollout_func returned {len(output[key])} {key} for {num_prompts} prompts, num_generations={num_generations} per prompt "
                f"received: {num_generations}× too many (fastgrpo's earlier contract, which passed each prompt once); return one "
                f"completion per prompt received: TRL 1.16 passes each prompt num_generations={num_generations} times, contiguously."
            )
        if len(output[key]) != num_prompts:
            raise ValueError(
                f"rollout_func returned {len(output[key])} {key} for {num_prompts} prompts; return one completion per prompt received: "
                f"TRL 1.16 passes each prompt num_generations={num_generations} times, contiguously."
            )
    for key, values in output.items():  # an extra list is per completion (TRL gives row i its i-th value); anything else all rows
        if key not in (*REQUIRED_KEYS, "env_mask") and isinstance(values, list) and len(values) != num_prompts:
            raise ValueError(f"rollout_func returned {len(values)} values under {key!r} for {num_prompts} prompts; return one per prompt "
                             "received, or a single value (not a list) that every completion's reward functions get.")
    for key in ("prompt_ids", "completion_ids"):
        for i, row in enumerate(output[key]):
            row = _as_list(row)
            if not isinstance(row, list) or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in row):
                raise ValueError(f"rollout_func's {key}[{i}] is {row!r:.60}; give a list of token ids (whole numbers).")
    for key in ("logprobs", "env_mask"):  # a row that is not a list (None: a sampler that returned none for one completion)
        for i, row in enumerate([] if output.get(key) is None else output[key]):
            if not isinstance(_as_list(row), list):
                raise ValueError(f"rollout_func's {key}[{i}] is {row!r:.60} ({type(row).__name__}); give a list with one value per "
                                 f"completion token{ROW_FIX[key]}.")
    for i, row in enumerate([] if output["logprobs"] is None else output["logprobs"]):
        bad = next((v for v in _as_list(row) if not _is_logp(v)), None)
        if bad is not None:
            raise ValueError(f"rollout_func's logprobs[{i}] holds {bad!r:.60}, which is not a log-probability (a number ≤ 0); give the "
                             "sampler's log π(token) per completion token, or None where it has none.")
    if all(len(c) == 0 for c in output["completion_ids"]):
        raise ValueError("rollout_func returned no completion token in any of its rows; return each completion's tokens (ending in EOS where it ended).")
    for i in range(num_prompts):
        if len(output["prompt_ids"][i]) == 0:
            raise ValueError(f"rollout_func returned an empty prompt_ids[{i}]; every row needs its prompt tokens.")
        for key in ("logprobs", "env_mask"):
            if output.get(key) is not None and len(output[key][i]) != len(output["completion_ids"][i]):
                raise ValueError(
                    f"rollout_func's {key}[{i}] has {len(output[key][i])} values for {len(output['completion_ids'][i])} "
                    "completion_ids; give one per completion token."
                )
        if "env_mask" in output and any(v not in (0, 1) for v in output["env_mask"][i]):
            raise ValueError(f"rollout_func's env_mask[{i}] holds values other than 0 and 1 (1 = model token, 0 = environment token).")
    if "env_mask" in output and not any(v == 1 for row in output["env_mask"] for v in _as_list(row)):  # TRL: a step of loss 0
        raise ValueError("rollout_func's env_mask is 0 for every token of every row: no token is the model's, so nothing would train. "
                         "env_mask marks the model's tokens 1 and the environment's 0 (TRL's tool_mask); leave it out when every "
                         "token is the model's.")


class RolloutFunc:
    """The `rollout_func` producer (a `rollout.collect` producer).

    Args:
        rollout_func: the user's function.
        trainer: passed to it as its second argument (TRL's).
        tokenizer: decodes the completions for the reward functions.
        eos_token_ids, pad_token_id: a completion not ending in one of them is truncated; padding.
        device: where the rollout's tensors live.
        vocab_size: rows of the policy's input embedding: ids beyond them are refused (prompts.check_token_ids); None: not checked.
        max_completion_length: GRPOConfig's; a completion longer than it trains whole (TRL's contract), with one warning
            per run (a multi-turn rollout_func that forgot its budget makes the update's memory grow with it).
        context: the model's config.max_position_embeddings; None: not known, not checked.
    Raises (on call):
        ValueError: `check_output`'s; an id the embedding has no row for (prompts.check_token_ids); a row whose prompt
            and completion together pass `context` (a model with learned positions failed in the update with "index out
            of range in self"; the own sampler refuses such prompts alike, prompts.PromptEncoder).
    """

    def __init__(self, rollout_func: Callable, trainer, tokenizer, eos_token_ids: Sequence[int], pad_token_id: int, device=None,
                 vocab_size: int | None = None, max_completion_length: int | None = None, context: int | None = None):
        self.rollout_func, self.trainer, self.tokenizer = rollout_func, trainer, tokenizer
        self.eos, self.pad, self.device, self.vocab_size = tuple(eos_token_ids), pad_token_id, device, vocab_size
        self.max_completion_length, self.context, self.warned_long = max_completion_length, context, False

    def __call__(self, rows: list[dict], num_generations: int) -> Generated:
        repeated = [row["prompt"] for row in rows for _ in range(num_generations)]  # TRL's RepeatSampler order
        output = self.rollout_func([copy.deepcopy(p) for p in repeated], self.trainer)  # each its own copy, as TRL's rows
        check_output(output, len(repeated), num_generations)
        extra = {k: v if isinstance(v, list) else [v] * len(repeated) for k, v in output.items()  # TRL's broadcast; TRL drops a
                 if k not in (*REQUIRED_KEYS, "env_mask") and k in reward_columns([k])}  # "prompt" or "completion" extra, as the columns
        prompt_ids, completion_ids = [list(p) for p in output["prompt_ids"]], [list(c) for c in output["completion_ids"]]
        for key, rows in (("prompt_ids", prompt_ids), ("completion_ids", completion_ids)):
            check_token_ids(rows, self.vocab_size, [f"rollout_func's {key}[{i}]" for i in range(len(rows))], self.tokenizer)
        lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
        if self.context is not None and max(lengths) > self.context:
            i = lengths.index(max(lengths))
            raise ValueError(
                f"rollout_func's row {i} holds {len(prompt_ids[i])} prompt_ids + {len(completion_ids[i])} completion_ids = {lengths[i]} "
                f"tokens, more than the model's context of {self.context} (config.max_position_embeddings): the update would read "
                "positions the model has none for. Keep each row within it in rollout_func (e.g. its engine's max_model_len)."
            )
        longest = max(len(c) for c in completion_ids)
        if self.max_completion_length is not None and longest > self.max_completion_length and not self.warned_long:
            self.warned_long = True
            warnings.warn(f"rollout_func returned a completion of {longest} tokens, above max_completion_length={self.max_completion_length}; "
                          "it trains whole (the update's memory grows with it): cut completions in rollout_func, or raise "
                          "max_completion_length. Said once per run.", stacklevel=2)
        P, T = max(len(p) for p in prompt_ids), max(1, max(len(c) for c in completion_ids))
        left = lambda rows, value: torch.tensor([[value] * (P - len(r)) + r for r in rows], device=self.device)  # noqa: E731
        right = lambda rows, value: torch.tensor([r + [value] * (T - len(r)) for r in rows], device=self.device)  # noqa: E731
        texts = [self.tokenizer.decode(c, skip_special_tokens=True) for c in completion_ids]
        completions = [[{"role": "assistant", "content": t}] if is_conversational(p) else t for t, p in zip(texts, repeated)]
        env_mask, logprobs = output.get("env_mask"), output["logprobs"]
        if logprobs is None:  # TRL 1.16's "no sampler log-probs": every token's ratio is 1
            logprobs = [[None] * len(c) for c in completion_ids]
        return Generated(
            prompt_ids=left(prompt_ids, self.pad), prompt_mask=left([[1] * len(p) for p in prompt_ids], 0),
            completion_ids=right(completion_ids, self.pad), completion_mask=right([[1] * len(c) for c in completion_ids], 0),
            is_truncated=torch.tensor([not c or c[-1] not in self.eos for c in completion_ids], device=self.device),
            prompts=repeated, completions=completions,
            tool_mask=None if env_mask is None else right([list(m) for m in env_mask], 1),
            reward_kwargs=extra, sampling_logps=right([[math.nan if v is None else float(v) for v in lp] for lp in logprobs], 0.0).float(),
        )
