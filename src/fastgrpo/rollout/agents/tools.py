"""Tools as TRL 1.16 takes them: plain or `async def` functions, their JSON schemas, and calling them.

A tool is a function with type hints and a Google-style docstring (an
`Args:` line per parameter); transformers' `get_json_schema` turns it into
the schema the chat template renders. The model calls tools by name with
JSON arguments; `call_tools` runs a turn's calls, sync ones in order, async
ones concurrently, and turns anything that goes wrong into a result the model
reads (TRL's rule):

- the tool raises → `{"error": "<message>"}`, counted as a failure;
- no tool of that name → `{"error": "Tool <name> not found."}`, a failure.

Not here: environments whose methods are tools (environments.py), the loop (multiturn.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Callable
from typing import NamedTuple

from transformers.utils import get_json_schema


def tool_schema(tool: Callable) -> dict:
    """The JSON schema of one tool (transformers' `get_json_schema`), checked up front.

    Raises:
        ValueError: a tool that is not callable, or whose signature/docstring the
            schema cannot be read from (naming the tool and the fix).
    """
    if not callable(tool):
        raise ValueError(f"tools holds {tool!r}, which is not callable; give functions (sync or async).")
    try:
        return get_json_schema(tool)
    except Exception as err:  # transformers raises its own TypeError subclasses for missing hints or docstrings
        name = getattr(tool, "__name__", repr(tool))
        raise ValueError(
            f"tool {name!r} has no JSON schema ({err}); give it type hints and a Google-style docstring with an "
            "Args: line per parameter (transformers' get_json_schema)."
        ) from err



class ToolResults(NamedTuple):
    """What one turn's calls returned, in call order, and the counts TRL logs."""

    messages: list[list[dict]]  # per row: {"role": "tool", "name", "content"} messages
    calls: int
    failures: int


def call_tools(calls: list[list[dict]], toolboxes: list[dict[str, Callable]]) -> ToolResults:
    """Run the tool calls of several rows: sync tools in order, all async ones concurrently.

    Args:
        calls: per row, the parsed `tool_calls` of its last turn
            ([{"type": "function", "function": {"name", "arguments"}}]).
        toolboxes: per row, {name: callable} of the tools it may call.
    Returns:
        `ToolResults`: one tool message per call (content: the result as `str`,
        or `{"error": …}` for a failure), the number of calls and failures.
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
            except Exception as err:  # the model reads the error; training goes on
                failures += 1
                results[r][c] = (name, {"error": str(err)})
    if pending:
        for (r, c, name, _), value in zip(pending, _await_all([p[3] for p in pending])):
            failures += isinstance(value, Exception)
            results[r][c] = (name, {"error": str(value)} if isinstance(value, Exception) else value)
    messages = [[{"role": "tool", "name": name, "content": str(value)} for name, value in row] for row in results]
    return ToolResults(messages, total, failures)


def _await_all(awaitables: list) -> list:
    """Await the async tools' results concurrently in a private event loop; exceptions are returned, not raised."""

    async def gather():
        return await asyncio.gather(*awaitables, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no loop in this thread
        return asyncio.run(gather())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # inside a running loop (a notebook): ours in a thread
        return pool.submit(asyncio.run, gather()).result()
