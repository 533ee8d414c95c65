"""Tools as TRL 1.16 takes them: plain or `async def` functions, their JSON schemas, and calling them.

A tool is a function with type hints and a Google-style docstring (an
`Args:` line per parameter); transformers' `get_json_schema` turns it into
the schema the chat template renders. The model calls tools by name with
JSON arguments; `call_tools` runs a turn's calls, sync ones in order, async
ones concurrently, and turns anything that goes wrong into a result the model
reads (TRL's rule):

- the tool raises → `{"error": "<message>"}`, counted as a failure;
- no tool of that name → `{"error": "Tool <name> not found."}`, a failure;
- a result `str()` cannot turn into text (an int of more than 4300 digits: Python's limit) → `{"error": …}`, a
  failure (TRL's `str(result)` raised out of the rollout and stopped the run);
- a sync tool raising SystemExit (code it runs calling `exit()`), an async one raising any BaseException
  (`asyncio.CancelledError`, SystemExit) → `{"error": …}`, a failure: TRL's run exited silently on the first, hung
  on an async SystemExit, and handed the model an empty reply, counted a success, for a CancelledError;
- an exception whose message is empty (`asyncio.TimeoutError()`) → `{"error": "TimeoutError"}`, its type, where
  TRL's `str(e)` gives the model `{"error": ""}`;
- lone UTF-16 surrogates in a result (a tool echoing a `"\ud800"` the model wrote in its JSON arguments) become
  U+FFFD: the tokenizer cannot encode them (TRL stopped the run with "TextEncodeInput must be Union[…]").

Not here: environments whose methods are tools (environments.py), the loop (multiturn.py).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable
from typing import NamedTuple

from transformers.utils import get_json_schema

from .. import event_loop


def tool_schema(tool: Callable) -> dict:
    """The JSON schema of one tool (transformers' `get_json_schema`), checked up front.

    Raises:
        ValueError: a tool that is not callable or not a function (a `functools.partial`, a callable object: no name
            to call it by, no schema), a generator function (sync or async: a call runs none of its body), one taking
            *args or **kwargs (the schema offers a parameter named "args"/"kwargs"), or one whose signature/docstring
            the schema cannot be read from (naming the tool and the fix).
    """
    if not callable(tool):
        raise ValueError(f"tools holds {tool!r}, which is not callable; give functions (sync or async).")
    if not (inspect.isfunction(tool) or inspect.ismethod(tool) or inspect.isbuiltin(tool)):  # get_json_schema reads a function
        raise ValueError(
            f"tools holds {tool!r:.80} ({type(tool).__name__}), which is not a function: the model calls a tool by its __name__ "
            "and its schema is read from a function's signature and docstring (transformers' get_json_schema). Wrap it in a "
            "documented def (for a functools.partial, a def taking the remaining arguments; for an object, a def calling it)."
        )
    if inspect.isgeneratorfunction(tool) or inspect.isasyncgenfunction(tool):  # TRL calls it and str()s the generator object
        raise ValueError(
            f"tool {getattr(tool, '__name__', repr(tool))!r} is a generator function (it yields): a call returns a generator object, so "
            "its body never runs and the model reads '<generator object …>'; return the result instead."
        )
    try:
        parameters = inspect.signature(tool).parameters.values()
    except ValueError:  # a builtin without a signature: get_json_schema refuses it below
        parameters = []
    packed = next((p for p in parameters if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)), None)
    if packed is not None:  # its schema names one parameter "args"/"kwargs", which tool(**arguments) never fills as meant
        positional = packed.kind == packed.VAR_POSITIONAL
        shown = ("*" if positional else "**") + packed.name
        effect = "every call fails" if positional else f"{shown} receives {{{packed.name!r}: <value>}}"
        raise ValueError(
            f"tool {tool.__name__!r} takes {shown}: the model's arguments are passed as keywords (TRL's tool(**arguments)) and "
            f"its schema offers one parameter named {packed.name!r}, so {effect}; name each parameter the model may pass, "
            "with a type hint and an Args: line."
        )
    try:
        return get_json_schema(tool)
    except Exception as err:  # transformers raises its own TypeError subclasses for missing hints or docstrings
        name = getattr(tool, "__name__", repr(tool))
        raise ValueError(
            f"tool {name!r} has no JSON schema ({err}); give it type hints and a Google-style docstring with an "
            "Args: line per parameter (transformers' get_json_schema)."
        ) from err


def check_tools(tools) -> list[Callable]:
    """`GRPOTrainer(tools=…)` as TRL takes it: None, or a list (or tuple) of documented tools with distinct names.

    Returns:
        The tools as a list ([] for None).
    Raises:
        TypeError: tools that are not a list (a single function, a string, …), naming what was given and the fix.
        ValueError: an entry that is not callable or has no JSON schema (`tool_schema`), or two tools under
            one name (`check_distinct_names`).
    """
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)):
        if callable(tools):
            name = getattr(tools, "__name__", type(tools).__name__)
            raise TypeError(f"tools is the function {name!r}, not a list; give a list of tools: tools=[{name}] (TRL's tools=).")
        raise TypeError(f"tools is {tools!r} ({type(tools).__name__}), not a list; give a list of functions (sync or async), "
                        "e.g. tools=[multiply] (TRL's tools=).")
    for tool in tools:
        tool_schema(tool)
    check_distinct_names([(f"tools[{i}]", t) for i, t in enumerate(tools)], "tools")
    return list(tools)


def check_distinct_names(tools: list[tuple[str, Callable]], offered: str) -> None:
    """Refuse two tools under one name in one prompt: the model calls a tool by its name (`__name__`, the schema's), so
    the second would silently replace the first while both schemas are rendered into the prompt.

    Args:
        tools: (how the user gave it, e.g. "tools[1]" or "its method", callable) for each tool one prompt offers.
        offered: what holds them, for the message ("tools", "tools and environment Counter's methods").
    Raises:
        ValueError: naming the name and both functions (as given, qualified name, file and line).
    """
    seen: dict[str, str] = {}
    for given, tool in tools:
        name = getattr(tool, "__name__", repr(tool))
        if name in seen:
            raise ValueError(
                f"{offered} hold two tools named {name!r}: {seen[name]} and {given} {_where(tool)}; the model calls tools by name, "
                "so one would silently shadow the other. Rename one of them."
            )
        seen[name] = f"{given} {_where(tool)}"


def _where(fn: Callable) -> str:
    """A function as a user finds it: its qualified name, and its file and first line when it has code."""
    code = getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__code__", None)
    place = f", {os.path.basename(code.co_filename)}:{code.co_firstlineno}" if code is not None else ""
    return f"({getattr(fn, '__qualname__', repr(fn))}{place})"


class ToolResults(NamedTuple):
    """What one turn's calls returned, in call order, and the counts TRL logs."""

    messages: list[list[dict]]  # per row: {"role": "tool", "name", "content"} messages
    calls: int
    failures: int


def call_tools(calls: list[list[dict]], toolboxes: list[dict[str, Callable]]) -> ToolResults:
    """Run the tool calls of several rows: sync tools in order, all async ones concurrently, on the one event loop every
    call shares (event_loop.py: TRL's, so a tool may keep loop-bound state between calls).

    Args:
        calls: per row, the parsed `tool_calls` of its last turn
            ([{"type": "function", "function": {"name", "arguments"}}]).
        toolboxes: per row, {name: callable} of the tools it may call.
    Returns:
        `ToolResults`: one tool message per call (content: the result as `str`,
        or `{"error": …}` for a failure: the call raised, named no tool, or its result has no `str`), the number of
        calls and failures.
    """
    results: list[list] = [[None] * len(row) for row in calls]
    pending, failures, total = [], 0, 0
    for r, (row, tools) in enumerate(zip(calls, toolboxes)):
        for c, call in enumerate(row):
            total += 1
            function = call.get("function", {}) if call.get("type") == "function" else None
            name = function.get("name", "unknown") if function is not None else call.get("name", "unknown")
            try:
                if function is None:
                    raise ValueError(f"Unsupported tool call type: {call.get('type')}")
                if name not in tools:
                    raise ValueError(f"Tool {name} not found.")
                value = tools[name](**function.get("arguments", {}))
                if inspect.isawaitable(value):
                    pending.append((r, c, name, value))
                    continue
                results[r][c] = (name, value)
            except (Exception, SystemExit) as err:  # the model reads the error; training goes on (exec'd code calling exit())
                failures += 1
                results[r][c] = (name, {"error": _message(err)})
    if pending:
        for (r, c, name, _), value in zip(pending, event_loop.gather([p[3] for p in pending])):
            failed = isinstance(value, BaseException)  # asyncio.CancelledError, SystemExit too (event_loop.gather)
            failures += failed
            results[r][c] = (name, {"error": _message(value)} if failed else value)
    messages = []
    for row in results:
        messages.append([])
        for name, value in row:
            try:
                content = str(value)
            except Exception as err:  # the result has no text: an int past Python's 4300 digits (power(10, 5000)), a broken __str__
                failures += 1
                content = str({"error": _message(err)})
            messages[-1].append({"role": "tool", "name": name, "content": SURROGATE.sub("\ufffd", content)})
    return ToolResults(messages, total, failures)


SURROGATE = re.compile("[\ud800-\udfff]")  # code points UTF-8 cannot encode, so no tokenizer can


def _message(err: BaseException) -> str:
    """What the model reads of a failed call: TRL's `str(err)`; the exception's type where that is empty ("TimeoutError")
    or the exception is no Exception ("SystemExit: 3", where str gives "3")."""
    text = str(err)
    if isinstance(err, Exception) and text:
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
