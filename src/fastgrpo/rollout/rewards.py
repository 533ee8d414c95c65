"""Calling reward functions and checking what they return.

The protocol is TRL's: a reward function is a plain callable (or `async def`)

    fn(prompts, completions, completion_ids, trainer_state, **columns) -> list[float | None]

called once per rollout with N aligned lists (N completions). `completions`
are strings, or `[{"role": "assistant", "content": text}]` when the prompts are
chat messages; every dataset column but "prompt", "completion" and
"completion_ids" (TRL drops them: `DROPPED_COLUMNS`) arrives as a keyword list, and the trainer adds TRL's `trainer_state`, `log_extra` and `log_metric`.
None means "not applicable" and is skipped in the weighted sum; a list, tuple,
numpy array, 1-D torch tensor or other ordered iterable (a generator) is accepted.
A function is called with keywords only: it takes `**kwargs` or names each keyword
passed (checked when the trainer is built). Async functions are awaited, all
of them concurrently, on one event loop for the run (event_loop.py, TRL's). A
sequence-classification reward model (hub id, local folder or instance) is
wrapped by reward_models.py into such a callable.

Built-ins (`fastgrpo train --reward NAME`): `length` (the TRL quick-start
reward), `format` (answer inside <answer>…</answer>), `brevity` (short
replies), `reasoning_gym`
(reasoning-gym's own scorer for the row's task), and any `module:function`.

Not here: the built-in rewards themselves (tasks/rewards.py), turning rewards into advantages (algo/advantages.py).
"""

from __future__ import annotations

import decimal
import difflib
import functools
import inspect
import math
import numbers
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence, Set

import numpy as np
import torch

from ..tasks import import_module
from . import event_loop
from ..tasks.rewards import BUILTIN_REWARDS

logger = logging.getLogger("fastgrpo.rewards")  # the name users filter on (before the layout it was the module's)
RewardFunc = Callable[..., list]
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # rewards are stored as float32

# Keywords the reward protocol itself passes: a dataset column of the same name would collide with them.
# Every other name is free: columns travel as one dict (`score(..., columns)`) and meet keywords only in
# the reward functions' own call, so a column named like a parameter of fastgrpo's code (`funcs`, `self`) is fine.
RESERVED_COLUMNS = ("prompts", "completions", "trainer_state", "log_extra", "log_metric")

# Dataset columns that never reach the reward functions, as TRL's `_calculate_rewards` drops them: "prompt" arrives
# as `prompts`, a reference "completion" (a prompt–completion dataset's, e.g. TL;DR) is not the sampled one, and a
# "completion_ids" column would shadow the sampled tokens.
DROPPED_COLUMNS = ("prompt", "completion", "completion_ids")


def reward_columns(columns) -> list[str]:
    """Of a dataset's column names (or a row: its keys), those that reach the reward functions as keywords: all but
    `DROPPED_COLUMNS` (TRL's)."""
    return [key for key in columns if key not in DROPPED_COLUMNS]


class RewardFunctionError(RuntimeError):
    """A reward function raised; the user's own exception is chained (`__cause__`) with its traceback."""


def reward_name(fn: RewardFunc) -> str:
    """The name a reward is logged under (`rewards/<name>/mean`, `/std`): the function's `__name__`;
    a `functools.partial` is named after the function it wraps."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def reward_names(funcs: Sequence[RewardFunc]) -> list[str]:
    """Distinct log names for R reward functions: `reward_name`, duplicates suffixed `_2`, `_3`, …

    Two rewards under one name would overwrite each other in metrics.jsonl and
    completions.jsonl.
    """
    names: list[str] = []
    for fn in funcs:
        base = name = reward_name(fn)
        k = 1
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.append(name)
    return names


def dataset_columns(dataset) -> list[str]:
    """A dataset's column names: its features', or for a list of dicts (or an IterableDataset whose features are unknown) its first row's."""
    columns = getattr(dataset, "column_names", None)
    return list(next(iter(dataset), {})) if columns is None else list(columns)


def check_reward_arguments(
    funcs: Sequence[RewardFunc], names: list[str], dataset, dataset_name: str, environments: bool = False, extra_fields: bool = False,
) -> None:
    """Refuse a reward function that cannot take the keywords every call passes (TRL's protocol: keywords only), checked
    when the trainer is built; TRL's, and fastgrpo's before, failed at the first scoring, after generation (or, for an
    eval set, at the first evaluation, after training steps) with Python's "missing 1 required positional argument" or
    "got an unexpected keyword argument".

    Refused: a required parameter no call fills (neither the protocol's arguments nor a column of `dataset`: a
    `def reward(completions, answer, **kw)` over a dataset without "answer"); a required positional-only one
    (`def reward(prompts, completions, /, **kw)`); no `**kwargs` where a keyword passed has no parameter
    (`def reward(completions)`: every call also passes `prompts`, `trainer_state`, the columns, …). With `extra_fields`
    (a rollout_func's, whose names are not known before it runs) a parameter no column fills may be one: not refused.

    Raises:
        ValueError: naming the function, the parameter or keywords, the dataset and its columns, and the fix.
    """
    columns = dataset_columns(dataset)
    given = {*RESERVED_COLUMNS, "completion_ids", *reward_columns(columns), *(("environments",) if environments else ())}
    for fn, name in zip(funcs, names):
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin or C callable: nothing to read
            continue
        if positional := [p.name for p in parameters if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]:
            raise ValueError(f"reward function {name!r} takes {', '.join(map(repr, positional))} positional-only (before `/`), but "
                             "reward functions are called with keywords only (TRL's protocol); remove the `/`.")
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        missing = [p.name for p in parameters if p.default is p.empty and p.kind in kinds and p.name not in given]
        if missing and not extra_fields:
            if dropped := [c for c in missing if c in columns]:
                raise ValueError(f"reward function {name!r} needs {', '.join(map(repr, dropped))}, a {dataset_name} column that reward "
                                 f"functions never receive (TRL drops {', '.join(DROPPED_COLUMNS)}: the prompt arrives as `prompts`, "
                                 "the sampled text as `completions`); rename the column, or give the parameter a default.")
            close = difflib.get_close_matches(missing[0], sorted(given), n=1)  # a misspelt argument: `completions_ids`
            fix = f"did you mean {close[0]!r}? Else add" if close else "add"
            raise ValueError(f"reward function {name!r} needs {', '.join(map(repr, missing))}, which {dataset_name} does not have "
                             f"(columns: {', '.join(columns)}); {fix} the column, or give the parameter a default.")
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            if unknown := sorted(given - {p.name for p in parameters if p.kind in kinds}):
                raise ValueError(f"reward function {name!r} has no **kwargs, but every call on {dataset_name} also passes "
                                 f"{', '.join(map(repr, unknown))} (TRL's protocol: the columns and the trainer's keywords); "
                                 "add **kwargs to its parameters.")


def check_columns(dataset, dataset_name: str = "train_dataset", environments: bool = False) -> None:
    """Refuse dataset columns that the reward protocol passes itself (checked when the trainer is built).

    With `environments`, the `environments` keyword (one environment per completion) is reserved too.

    Raises:
        ValueError: a column named like one of `RESERVED_COLUMNS`, naming it.
    """
    columns = dataset_columns(dataset)
    reserved = (*RESERVED_COLUMNS, "environments") if environments else RESERVED_COLUMNS
    clash = [c for c in columns if c in reserved]
    if clash:
        raise ValueError(
            f"{dataset_name} has a column named {clash[0]!r}, which reward functions already receive as an argument; "
            f"rename the column (reserved: {', '.join(reserved)})."
        )


def score(
    funcs: Sequence[RewardFunc], prompts: list, completions: list, completion_ids: list,
    columns: dict | None = None, reward_kwargs: dict | None = None,
) -> torch.Tensor:
    """Call every reward function once (async ones concurrently) and stack their values.

    Args:
        funcs: R reward functions.
        prompts, completions, completion_ids: N aligned entries each.
        columns: {dataset column: N values}, passed to every function as keywords
            (a dict, not `**columns`, so no column name collides with this function's parameters).
        reward_kwargs: extra keywords for every function (the trainer passes
            `trainer_state`); None for none.
    Returns:
        (N, R) float32 rewards, NaN where a function returned None. A row that
        is NaN everywhere (no function applies) is allowed: it gets Â = 0
        (see `advantages.rollout_advantages`), with TRL's warning on this module's logger
        (the first such completion's prompt, completion and columns).
    Raises:
        ValueError: a function returned the wrong number of values, or inf/NaN
            (naming the function, the value and the completion).
        TypeError: a function returned something that is not a sequence of numbers/None.
        RewardFunctionError: a function raised; its own exception is chained.
    """
    n = len(completions)
    names = reward_names(funcs)
    kwargs = {**(columns or {}), **(reward_kwargs or {}), "prompts": prompts, "completions": completions, "completion_ids": completion_ids}
    results = [_call(fn, name, kwargs) for fn, name in zip(funcs, names)]
    pending = [k for k, r in enumerate(results) if inspect.isawaitable(r)]
    if pending:
        for k, value in zip(pending, _await_all([results[k] for k in pending], [names[k] for k in pending])):
            results[k] = value
    table = torch.empty(n, len(funcs), dtype=torch.float32)
    for k, (name, values) in enumerate(zip(names, results)):
        table[:, k] = _column(name, values, n)
    none = torch.isnan(table).all(dim=1)
    if none.any():
        i = int(none.nonzero()[0])
        row = {**{key: values[i] for key, values in (columns or {}).items()}, "prompt": prompts[i], "completion": completions[i]}
        logger.warning(  # TRL's words, then what fastgrpo does with such a completion
            f"All reward functions returned None for the following kwargs:\n{row}\nPlease ensure that at least one reward "
            f"function returns a valid reward. {int(none.sum())} of {n} completions got None from every reward function "
            f"({', '.join(names)}); they get advantage 0 and are left out of their group's mean and std (logged as frac_reward_none)."
        )
    return table


def _call(fn: RewardFunc, name: str, kwargs: dict):
    try:
        return fn(**kwargs)
    except Exception as err:
        if fn in BUILTIN_REWARDS.values():  # fastgrpo's own rewards raise fastgrpo's own clear errors
            raise
        raise RewardFunctionError(f"reward function {name!r} raised {type(err).__name__}: {err}") from err


def _await_all(awaitables: list, names: list[str]) -> list:
    """Await the async reward functions' results concurrently, on the event loop every call shares (event_loop.py: TRL's).

    Raises:
        RewardFunctionError: one raised, naming it; its exception chained.
        SystemExit, KeyboardInterrupt: one raised it, as a sync reward function's would be (it hung the run before).
    """
    results = event_loop.gather(awaitables)
    for name, value in zip(names, results):
        if isinstance(value, (SystemExit, KeyboardInterrupt)):
            raise value
        if isinstance(value, BaseException):  # asyncio.CancelledError too
            raise RewardFunctionError(f"reward function {name!r} raised {type(value).__name__}: {value}") from value
    return results


def _column(name: str, values, n: int) -> torch.Tensor:
    """One function's N values → (N,) float32, NaN for None; refuses anything else.

    `values` is what TRL's `[r if r is not None else nan for r in values]` reads in order: a list, tuple, 1-D array or
    tensor, or any other iterable (a generator, `map`, a pandas Series) but a string, bytes, a mapping or a set.
    A value is what TRL's `torch.tensor(values, dtype=torch.float32)` reads as one number: a real number (int, float,
    numpy's, `Decimal`), a bool (1.0 / 0.0: `[answer in c for c in completions]`) or a 0-d tensor or array (`list(scores)`).
    """
    if isinstance(values, (np.ndarray, torch.Tensor)):
        if values.ndim != 1:
            raise TypeError(f"reward function {name!r} returned an array of shape {tuple(values.shape)}; return {n} values, shape ({n},).")
        values = values.tolist()
    unordered = isinstance(values, (str, bytes, Mapping, Set))  # TRL would iterate a dict's keys, a set in hash order
    if unordered or not isinstance(values, Iterable):
        raise TypeError(f"reward function {name!r} returned {type(values).__name__}; return a list of {n} floats (None = not applicable).")
    values = list(values)  # a generator, `map` or pandas Series, as TRL's list comprehension reads it
    if len(values) != n:
        raise ValueError(f"reward function {name!r} returned {len(values)} values for {n} completions; return one per completion.")
    column = torch.empty(n, dtype=torch.float32)
    for i, v in enumerate(values):
        if isinstance(v, (np.ndarray, torch.Tensor, np.generic)) and v.ndim == 0:
            v = v.item()
        if isinstance(v, (bool, decimal.Decimal)):
            v = float(v)
        if v is None:
            column[i] = math.nan
        elif isinstance(v, numbers.Real):
            if not math.isfinite(v) or abs(v) > FLOAT32_MAX:
                raise ValueError(
                    f"reward function {name!r} returned {float(v)} for completion {i}; rewards must be finite numbers "
                    f"within ±{FLOAT32_MAX:.3g} (float32; return None when a reward does not apply)."
                )
            column[i] = float(v)
        else:
            raise TypeError(f"reward function {name!r} returned {v!r} ({type(v).__name__}) for completion {i}; return a float or None.")
    return column


def resolve_reward(spec, processing_class=None, init_kwargs: dict | None = None) -> RewardFunc:
    """A reward function from a built-in name, "module:function", a callable, or a reward model.

    Args:
        spec: a callable; a built-in name; "module:function"; a sequence-classification
            model as a `PreTrainedModel`, a local folder or a hub id ("org/name").
        processing_class: the reward model's tokenizer (TRL's reward_processing_classes entry).
        init_kwargs: `from_pretrained` arguments for a reward model given by name.
    Raises:
        ValueError: an unknown name or a module/function that cannot be found.
        TypeError: neither a callable nor a name; a class, not an instance; a torch module that is not a
            `PreTrainedModel` (a compiled reward model, which TRL 1.16 scores only when its tokenizer is given,
            and without setting its pad token).
    """
    from transformers import PreTrainedModel

    from .reward_models import RewardModel, looks_like_model

    if isinstance(spec, PreTrainedModel) or (isinstance(spec, str) and ":" not in spec and spec not in BUILTIN_REWARDS and looks_like_model(spec)):
        return RewardModel(spec, processing_class, init_kwargs)
    if isinstance(spec, torch.nn.Module):  # TRL scores any nn.Module as a reward model; called as a function it met our keywords
        raise TypeError(
            f"reward_funcs entry {type(spec).__name__} is a torch module but not a transformers PreTrainedModel; give the "
            "…ForSequenceClassification model itself (not torch.compile's wrapper), or wrap the module in a reward function."
        )
    if isinstance(spec, type):  # called with the protocol's keywords it builds an instance, not rewards
        raise TypeError(f"reward_funcs entry {spec.__name__} is a class; give an instance, {spec.__name__}(…), whose __call__ scores.")
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"reward_funcs entry {spec!r} has type {type(spec).__name__}; give a callable, a built-in name "
            f"({', '.join(BUILTIN_REWARDS)}), 'module:function', or a reward model."
        )
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            module = import_module(module_name)
        except ImportError as err:
            raise ValueError(f"reward {spec!r}: cannot import {attr!r} from {module_name!r} ({err}).") from err
        if not hasattr(module, attr):  # a user's module, not a backend: what it holds decides the hint
            close = difflib.get_close_matches(attr, [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")], n=1)
            raise ValueError(f"reward {spec!r}: cannot import {attr!r} from {module_name!r} (module {module_name!r} has no attribute "
                             f"{attr!r}){f'; did you mean {module_name}:{close[0]}?' if close else '.'}")
        fn = getattr(module, attr)
        if not callable(fn):
            raise ValueError(f"reward {spec!r} is not callable.")
        return fn
    close = difflib.get_close_matches(spec, list(BUILTIN_REWARDS), n=1)
    raise ValueError(
        f"reward {spec!r} is unknown{f' (did you mean {close[0]!r}?)' if close else ''}; use one of {', '.join(BUILTIN_REWARDS)}, "
        f"'module:function', or a reward model (a local folder or a hub id 'org/name')."
    )
