"""Choosing how a rollout's completions are produced: single-turn, multi-turn with tools/environments, or rollout_func.

`check_agent_inputs` reads `GRPOTrainer`'s `tools`, `environment_factory`
and `rollout_func` before any model loads (TRL 1.16's rules), and
`check_agent_datasets` the datasets against them (chat prompts, the columns
an environment's `reset` takes); once the model
and tokenizer exist, `build_producer` returns the one producer the trainer's
`collect` calls, so `trainer.py` never branches on which it is.

Not here: the producers themselves (rollout.SingleTurn, multiturn.py, rollout_func.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from datasets import IterableDataset, Value

from ..config.generation_kwargs import stop_strings
from ..generation.contract import GenerationBackend
from .agents.chat_format import check_tool_replies, prepare_tool_tokenizer
from .agents.environments import Environments, placeholder_dataset
from .agents.multiturn import MultiTurn
from .agents.rollout_func import RolloutFunc, check_rollout_func
from .agents.tools import check_tools
from .collect import SingleTurn
from .prompts import PromptEncoder, check_renders, is_conversational
from .rewards import dataset_columns


class AgentInputs(NamedTuple):
    """The agent arguments once checked."""

    tools: list[Callable]
    environments: Environments | None
    rollout_func: Callable | None
    train_dataset: object  # the given one, or TRL's placeholder when the environment owns the data
    reward_funcs: list[Callable]  # one per environment class with get_reward (weight 1, named after the class)


def check_agent_inputs(
    tools, environment_factory, rollout_func, train_dataset, max_steps: int, prompts_per_rollout: int, max_tool_calling_iterations: int | None,
) -> AgentInputs:
    """Check `tools`, `environment_factory` and `rollout_func` (TRL's meanings) before any model loads.

    Raises:
        TypeError: tools that are not a list (tools.check_tools); an environment_factory that is not callable or
            needs arguments, a reset/get_reward that is not a method (environments.Environments).
        ValueError: tools without a schema or two under one name (tools.check_tools), an environment without
            `reset`, an environment method named like a tool (environments.Environments), a rollout_func that is not
            callable or cannot take (prompts, trainer) (rollout_func.check_rollout_func) or that comes with
            tools/environments, no train_dataset without an environment or without max_steps (environments.placeholder_dataset).
        EnvironmentFunctionError: an environment's factory raised (environments.Environments).
    Warns:
        UserWarning: `max_tool_calling_iterations` set without tools or an environment (nothing reads it).
    """
    tools = check_tools(tools)
    if rollout_func is not None:
        check_rollout_func(rollout_func)
    if rollout_func is not None and (tools or environment_factory is not None):
        raise ValueError(
            "rollout_func produces the whole completion itself; give either rollout_func, or tools/environment_factory "
            "for fastgrpo's own multi-turn loop, not both."
        )
    if max_tool_calling_iterations is not None and not tools and environment_factory is None:
        warnings.warn(
            f"max_tool_calling_iterations={max_tool_calling_iterations!r} has no effect without tools or environment_factory "
            "(no tool can be called); pass tools=[…] or environment_factory=… (--tools, --environment), or drop it.", stacklevel=4,
        )
    environments = Environments(environment_factory, tools) if environment_factory is not None else None
    if train_dataset is None and environment_factory is not None:
        train_dataset = placeholder_dataset(environment_factory, max_steps, prompts_per_rollout)
    return AgentInputs(tools, environments, rollout_func, train_dataset, environments.reward_funcs if environments else [])


def check_agent_datasets(agents: AgentInputs, datasets: list[tuple[str, object]]) -> None:
    """Check each dataset against tools and environments before any model loads (after the datasets' own checks).

    Args:
        agents: the checked agent arguments.
        datasets: (name, rows) of the train set and each eval set.
    Raises:
        ValueError: a text prompt with tools or environment_factory (they need chat messages), naming the dataset,
            the row and the fix; a dict environment_factory over rows without an `environment` column, or a row whose
            `environment` names none of its keys (environments.Environments.check_routes).
        TypeError: an environment's reset that cannot take the rows' columns (environments.Environments.check_columns).
    """
    if not (agents.tools or agents.environments):
        return
    given = " and ".join(name for name, on in (("tools", agents.tools), ("environment_factory", agents.environments)) if on)
    for name, rows in datasets:
        text = _text_prompt(rows)
        if text is not None:
            raise ValueError(
                f"{name} row {text[0]}: prompt {text[1]!r:.80} is text, but {given} {'needs' if given == 'environment_factory' else 'need'} chat "
                'prompts (the tools are described in the chat template); give each prompt as messages, [{"role": "user", "content": …}].'
            )
        if agents.environments is not None:
            agents.environments.check_columns(dataset_columns(rows), name)
            agents.environments.check_routes(rows, name)


def _text_prompt(rows) -> tuple[int, str] | None:
    """(row, prompt) of a text prompt, or None: read from the column's type where it is known (a Dataset, an IterableDataset
    with features; never a pass over the rows), else from an IterableDataset's first row, else each row of a list."""
    features = getattr(rows, "features", None)
    if features is not None:
        text = isinstance(features.get("prompt"), Value) and features["prompt"].dtype in ("string", "large_string")
        return (0, next(iter(rows))["prompt"]) if text else None
    for i, row in enumerate([next(iter(rows), {})] if isinstance(rows, IterableDataset) else rows):
        if isinstance(row.get("prompt"), str):
            return i, row["prompt"]
    return None


def check_prompt_rendering(agents: AgentInputs, samples: dict[str, list[tuple[int, list]]], chat_template_kwargs: dict | None, tokenizer) -> None:
    """Render sample chat prompts with the tokenizer the producer will render with, before the policy loads.

    With tools or environments that is `prepare_tool_tokenizer`'s (fastgrpo's ChatML tool template where the model's
    has no tool calling); a rollout_func renders its own prompts, so nothing is checked for it.

    Args:
        samples: {dataset name: [(row, prompt)]} (run/datasets.prompt_shapes).
        tokenizer: the policy's tokenizer, as loaded.
    Raises:
        ValueError: a prompt the chat template cannot render (prompts.check_renders); a template that cannot render
            tool calls (chat_format.prepare_tool_tokenizer), or that a tool reply cannot be appended to as tokens
            (not prefix-preserving: chat_format.check_tool_replies).
    """
    if agents.rollout_func is not None:
        return
    if agents.tools or agents.environments:
        tokenizer = prepare_tool_tokenizer(tokenizer)[0]
        check_tool_replies(tokenizer, chat_template_kwargs or {})
    check_renders(tokenizer, samples, chat_template_kwargs)


def build_producer(
    args, agents: AgentInputs | None, *, tokenizer, encode: PromptEncoder, backend: GenerationBackend, eos_token_ids, device, trainer, notify,
) -> tuple[Callable, object]:
    """The producer `collect` calls: `SingleTurn`, `RolloutFunc`, or `MultiTurn` (the backend's turns), and the tokenizer.

    Args:
        args: the GRPOConfig.
        agents: the checked agent arguments, or None.
        tokenizer, encode: the policy's tokenizer and its prompt encoder.
        backend: the `GenerationBackend` that samples.
        eos_token_ids, device: every id that ends a completion; where the rollout's tensors live.
        trainer: what a user's rollout_func receives as its second argument (TRL's contract).
        notify: prints one start-up notice line.
    Returns:
        (producer, tokenizer): for tools/environments the tokenizer is made to render and parse
        tool calls first (chat_format.prepare_tool_tokenizer; it is saved with the model).
    """
    if agents is None or not (agents.tools or agents.environments or agents.rollout_func):
        return SingleTurn(partial(_encode, encode, device), backend, partial(_decode, tokenizer), eos_token_ids), tokenizer
    if args.generation_kwargs and stop_strings(args.generation_kwargs, args.generation_backend == "vllm"):
        raise ValueError("generation_kwargs' stop strings end single-turn completions only: a multi-turn rollout (tools, "
                         "environment_factories, rollout_func) ends each turn at EOS; remove them, or end turns with a stop "
                         "token id instead (stop_token_ids with vLLM, eos_token_id otherwise).")
    if agents.rollout_func is not None:
        context = None if encode.room is None else encode.room + args.max_completion_length  # room: the context less a completion
        return RolloutFunc(agents.rollout_func, trainer, tokenizer, eos_token_ids, tokenizer.pad_token_id, device, encode.vocab_size,
                           args.max_completion_length, context), tokenizer
    a = args
    tokenizer, notice = prepare_tool_tokenizer(tokenizer)  # saved with the model: inference renders tools alike
    if notice:
        notify(notice)
    multi = MultiTurn(
        tokenizer, PromptEncoder(tokenizer, a.max_prompt_length, a.chat_template_kwargs, encode.vocab_size, encode.room), backend.turns, agents.tools, agents.environments,
        max_completion_length=a.max_completion_length, max_tool_calling_iterations=a.max_tool_calling_iterations,
        chat_template_kwargs=a.chat_template_kwargs or {}, eos_token_ids=eos_token_ids, pad_token_id=tokenizer.pad_token_id, device=device,
    )
    return multi, tokenizer


def _encode(encoder, device, prompts):
    ids, mask, truncated = encoder(prompts)
    return ids.to(device), mask.to(device), truncated


def _decode(tokenizer, completion_ids, mask, prompts):
    texts = [tokenizer.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(completion_ids, mask)]
    return [[{"role": "assistant", "content": t}] if is_conversational(p) else t for t, p in zip(texts, prompts)]
