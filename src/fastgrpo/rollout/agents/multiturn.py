"""The multi-turn producer: sample, run the tool calls, append the replies as tokens, sample again.

TRL 1.16's loop (`_tool_call_loop`), on fastgrpo's sampler:

1. each of the N = B·G rows gets its environment (reset from its row) and its
   prompt rendered with its tools; G completions per prompt are sampled;
2. a turn that calls tools has them run (tools.py); the tool messages are
   rendered as the tokens that follow the turn's EOS (`tool_suffix_ids`) and
   appended: the sequence grows by token concatenation, never re-tokenised;
3. rows with tool calls continue from prompt + every turn so far, the others
   are done; at most `max_tool_calling_iterations` rounds of tool calls.

The whole completion (every turn and every tool reply) shares one
`max_completion_length`: a tool reply that would pass it is dropped and ends
its row (its turn stays, as TRL does); one far past it (a million characters)
is known to be so from its length, without tokenising it (`tool_suffix_floor`).
A later turn samples at most the tokens left. Tool tokens get `tool_mask` 0: they are context, never loss.

Who samples a turn is the backend's `Turns` (generation/contract.py):
`Reprefill` re-runs each continuing row's whole sequence (prompt and every
turn), the reference; the own sampler's cached turns
(generation/cached_turns.py) keep each row's KV cache and prefill only the
appended tool tokens.

Not here: parsing and rendering tool calls (chat_format.py), calling tools
(tools.py), environments (environments.py), scoring (rollout/collect.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...generation.contract import Turns
from ..prompts import is_conversational
from ..record import Generated
from .chat_format import longest_token_bytes, parse_assistant, tool_suffix_floor, tool_suffix_ids
from .environments import Environments
from .tools import call_tools, tool_schema


class MultiTurn:
    """The multi-turn producer (a `rollout.collect` producer): tools and/or environments, TRL's semantics.

    Args:
        tokenizer: renders prompts with tools and parses tool calls (`chat_format.prepare_tool_tokenizer` first).
        encode: `PromptEncoder` (its `tools=` renders each prompt with its own tools).
        turns: a factory of `Turns`, one per rollout.
        tools: standalone tool functions.
        environments: `Environments`, or None.
        max_completion_length: the budget every row's turns and tool replies share.
        max_tool_calling_iterations: rounds of tool calls; None: no limit (the budget ends the loop).
        chat_template_kwargs: for rendering the tool replies.
        eos_token_ids, pad_token_id: as the sampler stops and pads.
        device: where the tensors of the rollout live.
    Raises (on call):
        ValueError: a prompt that is not chat messages (tools need them; a dataset's is refused before the model
            loads, `producers.check_agent_datasets`, but an IterableDataset is read only to its first row there).
        TypeError, EnvironmentFunctionError: an environment's reset could not take the row, returned neither a str,
            content parts nor None, or raised (`Environments.reset`).
    """

    def __init__(
        self, tokenizer, encode, turns: Callable[[], Turns], tools: list[Callable], environments: Environments | None, *,
        max_completion_length: int, max_tool_calling_iterations: int | None, chat_template_kwargs: dict,
        eos_token_ids: Sequence[int], pad_token_id: int, device=None,
    ):
        self.tokenizer, self.encode, self.turns, self.tools, self.environments = tokenizer, encode, turns, tools, environments
        self.schemas = [tool_schema(t) for t in tools]
        self.budget, self.max_rounds = max_completion_length, max_tool_calling_iterations
        self.chat_template_kwargs, self.eos, self.pad, self.device = chat_template_kwargs, tuple(eos_token_ids), pad_token_id, device
        self.token_bytes = longest_token_bytes(tokenizer)  # bounds a tool reply's tokens from its bytes (tool_suffix_floor)

    def __call__(self, rows: list[dict], num_generations: int) -> Generated:
        G, N = num_generations, len(rows) * num_generations
        rows_n = [row for row in rows for _ in range(G)]
        prompts = [row.get("prompt", [{"role": "user", "content": ""}]) if self.environments else row["prompt"] for row in rows_n]
        for p in prompts:
            if not is_conversational(p):
                raise ValueError(f"prompt {p!r} is text; tools and environments need chat prompts (lists of messages).")
        envs, extra = None, {}
        if self.environments is not None:
            envs = self.environments.draw(rows_n)
            prompts = self.environments.reset(envs, rows_n, prompts)
            schemas = self.environments.schemas_of(rows_n)
            toolboxes = Environments.toolboxes(envs, self.tools)
            extra["environments"] = envs
        else:
            schemas = [self.schemas] * N
            toolboxes = Environments.toolboxes([object()] * N, self.tools)
        turns = self.turns()
        shared = all(prompts[i] == prompts[i - i % G] and schemas[i] == schemas[i - i % G] for i in range(N))
        if shared:  # each group's G rows see one prompt: encode and prefill it once
            ids, mask, truncated = self.encode(prompts[::G], tools=schemas[::G])
            first = turns.first(ids.to(self.device), mask.to(self.device), G, self.budget)
            ids, mask = ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0)
            truncated *= G
        else:
            ids, mask, truncated = self.encode(prompts, tools=schemas)
            first = turns.first(ids.to(self.device), mask.to(self.device), 1, self.budget)
        prompt_lists = [i[m.bool()].tolist() for i, m in zip(ids, mask)]
        completion = [t.tokens for t in first]
        model = [[1] * len(t.tokens) for t in first]  # tool_mask: 1 = sampled by the model
        logps = [t.logps for t in first]
        messages = [[parse_assistant(self.tokenizer, t.tokens, p, s)] for t, p, s in zip(first, prompt_lists, schemas)]
        calls = failures = rounds = 0
        active = [r for r in range(N) if messages[r][-1].get("tool_calls")]
        while active and (self.max_rounds is None or rounds < self.max_rounds):
            results = call_tools([messages[r][-1]["tool_calls"] for r in active], [toolboxes[r] for r in active])
            calls, failures = calls + results.calls, failures + results.failures
            going, appended = [], []
            for r, replies in zip(active, results.messages):
                left = self.budget - len(completion[r])  # the reply must leave room to answer, or the row ends here
                if sum(len(m["content"]) for m in replies) > self.token_bytes * left and (  # past the budget, told untokenised
                        tool_suffix_floor(self.tokenizer, replies, self.chat_template_kwargs, self.token_bytes) >= left):
                    continue
                suffix = tool_suffix_ids(self.tokenizer, replies, self.chat_template_kwargs)
                if len(suffix) >= left:
                    continue
                self.encode.check([suffix], [f"the tool reply {' '.join(m['content'][:80] for m in replies)!r:.80}"])
                messages[r].extend(replies)
                going.append(r)
                appended.append(suffix)
            if not going:
                break
            budgets = [self.budget - len(completion[r]) - len(s) for r, s in zip(going, appended)]
            new = turns.extend(going, appended, budgets)
            for r, suffix, turn in zip(going, appended, new):
                prefix = prompt_lists[r] + completion[r] + suffix
                completion[r] = completion[r] + suffix + turn.tokens
                model[r] = model[r] + [0] * len(suffix) + [1] * len(turn.tokens)
                if logps[r] is not None:
                    logps[r] = logps[r] + [0.0] * len(suffix) + turn.logps
                if turn.tokens:
                    messages[r].append(parse_assistant(self.tokenizer, turn.tokens, prefix, schemas[r]))
            active = [r for r in going if turn_calls(messages[r])]
            rounds += 1
        if not turns.own_weights:  # sampled with the trained weights: π_old is the sampler, no correction (algo/sampling_correction.py)
            logps = [None] * N
        return self._generated(ids, mask, truncated, prompts, completion, model, logps, messages, extra, calls, failures)

    def _generated(self, ids, mask, truncated, prompts, completion, model, logps, messages, extra, calls, failures) -> Generated:
        width = max(1, max(len(c) for c in completion))
        pad = lambda rows, value: torch.tensor([r + [value] * (width - len(r)) for r in rows], device=self.device)  # noqa: E731
        return Generated(
            prompt_ids=ids.to(self.device), prompt_mask=mask.to(self.device),
            completion_ids=pad(completion, self.pad), completion_mask=pad([[1] * len(c) for c in completion], 0),
            is_truncated=torch.tensor([not c or c[-1] not in self.eos for c in completion], device=self.device),
            prompts=prompts, completions=messages, num_truncated_prompts=truncated, tool_mask=pad(model, 1),
            reward_kwargs=extra, tool_calls=calls, tool_failures=failures,
            sampling_logps=None if any(lp is None for lp in logps) else pad(logps, 0.0).float(),
        )


def turn_calls(messages: list[dict]) -> bool:
    """True when the row's last message is an assistant turn that called tools."""
    return messages[-1].get("role") == "assistant" and bool(messages[-1].get("tool_calls"))
