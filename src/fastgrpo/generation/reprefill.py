"""Multi-turn sampling for any backend: each continuing row's whole sequence (prompt and every turn) sampled again.

What TRL does (relying on vLLM's prefix cache); transformers' `generate` and vLLM use it as their `Turns`.

Not here: the turn loop and tool calls (rollout/agents/multiturn.py), turns that keep the KV cache (cached_turns.py).
"""

from __future__ import annotations

from collections.abc import Sequence
import torch

from .contract import GenerationBackend, Turn


def until_eos(tokens: list[int], eos_token_ids: Sequence[int]) -> list[int]:
    """The tokens up to and including the first EOS (all of them when there is none)."""
    for i, token in enumerate(tokens):
        if token in eos_token_ids:
            return tokens[: i + 1]
    return tokens


class Reprefill:
    """`Turns` that re-run each continuing row's whole sequence through `backend.sample`: the simple reference, for any backend.

    Args:
        backend: a `GenerationBackend`; its log-probs (when it owns weights) come with each turn.
        pad_token_id, eos_token_ids: as the backend pads and stops.
    """

    def __init__(self, backend: GenerationBackend, pad_token_id: int, eos_token_ids: Sequence[int]):
        self.backend, self.pad, self.eos = backend, pad_token_id, tuple(eos_token_ids)
        self.own_weights = backend.owns_weights  # a second policy's log-probs, corrected for
        self.sequences: list[list[int]] = []
        self.device: torch.device | None = None

    def _sample(self, ids: torch.Tensor, mask: torch.Tensor, G: int, budget: int) -> list[Turn]:
        out = self.backend.sample(ids, mask, G, budget)
        tokens, logps = out.completion_ids.tolist(), None if out.logps is None else out.logps.tolist()
        turns = []
        for r, row in enumerate(tokens):
            row = until_eos(row, self.eos)[:budget]
            turns.append(Turn(row, None if logps is None else logps[r][: len(row)]))
        return turns

    def first(self, prompt_ids, prompt_mask, num_generations, budget):
        self.device = prompt_ids.device
        prompts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
        turns = self._sample(prompt_ids, prompt_mask, num_generations, budget)
        self.sequences = [prompts[r // num_generations] + t.tokens for r, t in enumerate(turns)]
        return turns

    def extend(self, rows, appended, budgets):
        for r, tokens in zip(rows, appended):
            self.sequences[r] = self.sequences[r] + tokens
        seqs = [self.sequences[r] for r in rows]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([[self.pad] * (width - len(s)) + s for s in seqs], device=self.device)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=self.device)
        turns = self._sample(ids, mask, 1, max(budgets))
        turns = [Turn(t.tokens[:b], None if t.logps is None else t.logps[:b]) for t, b in zip(turns, budgets)]
        for r, t in zip(rows, turns):
            self.sequences[r] = self.sequences[r] + t.tokens
        return turns
