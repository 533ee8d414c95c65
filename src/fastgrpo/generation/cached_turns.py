"""Multi-turn sampling that keeps each row's KV cache between turns: only the appended tool tokens are prefilled.

`CachedTurns` is the `Turns` (contract.py) of fastgrpo's `Sampler` (the
same model, precision and logits processors). Where `Reprefill` runs each
continuing row's whole sequence again every turn (what TRL does, relying on
vLLM's prefix cache), this keeps the rollout's cache of (N, KV heads,
P + T, head dim) per layer alive for the whole rollout:

- turn 1: the B prompts are prefilled once into all G rows of each (the
  `KVCache.prefill`), then decoded;
- a later turn: each continuing row prefills its appended tokens only (the
  last sampled token, never fed yet, then the tool reply), written after its
  own last column; rows differ in length, so each row has its own write
  column and position (a ragged cache: no holes, no re-tokenising);
- live rows are kept at the front of the cache (slots) so a decode step
  computes only them; finished rows move behind them instead of being
  overwritten, and a later turn moves its continuing rows to the front.

Each row's budget is the tokens it has left of `max_completion_length`;
`max_completion_length` bounds every row's completion, so P + T columns
always suffice.

Not here: the turn loop and tool calls (rollout/agents/multiturn.py), single-turn sampling (sampler.py).
"""

from __future__ import annotations

import torch

from .contract import Turn
from .draw import draw
from .kv_cache import KVCache
from .processors import fill_pads


class TurnCache(KVCache):
    """The sampler's static cache with a write column and a position per slot (see `KVCache` for the layout).

    slot s holds row `row[s]`; `column[s]` is its next free column, `position[s]`
    its next position id, `tokens[s]` the ids written so far (for the logits
    processors; columns from `column[s]` on are not the row's and are never read
    as its tokens), `pending[s]` its last sampled token (not yet in the cache).
    """

    def __init__(self, lm, N: int, L: int, device, pad_token_id: int):
        super().__init__(lm, N, L, device)
        for cache in (*self.keys, *self.values):  # a row reads up to the longest row's column: never uninitialised memory (0 × NaN)
            cache.zero_()
        self.tokens = torch.full((N, L), pad_token_id, dtype=torch.long, device=device)
        self.row = torch.arange(N, device=device)
        self.column = torch.zeros(N, dtype=torch.long, device=device)
        self.position = torch.zeros(N, dtype=torch.long, device=device)
        self.pending = torch.zeros(N, dtype=torch.long, device=device)

    def permute(self, order: torch.Tensor, columns: int) -> None:
        """Slots `order` (a permutation of the first len(order) slots) move to the front, their first `columns` columns kept."""
        n = len(order)
        for cache in (*self.keys, *self.values):
            cache[:n, :, :columns] = cache[order, :, :columns]
        for name in ("valid", "tokens"):
            getattr(self, name)[:n] = getattr(self, name)[order]
        for name in ("row", "column", "position", "pending"):
            getattr(self, name)[:n] = getattr(self, name)[order]

    def append(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Prefill left-padded blocks ids (m, S) into slots 0…m−1 after each one's last column; → last-token logits (m, V)."""
        m, S = ids.shape
        lengths = mask.sum(-1)  # (m,)
        offset = torch.arange(S, device=ids.device) - (S - lengths)[:, None]  # (m, S) index among the real tokens; < 0 on padding
        real = offset >= 0
        cols = self.column[:m, None] + offset.clamp(min=0)  # (m, S) where each real token goes
        end = int((self.column[:m] + lengths).max())
        rows, where = real.nonzero(as_tuple=True)
        keys = torch.arange(end, device=ids.device)
        old = self.valid[:m, None, :end] & (keys < self.column[:m, None, None])  # (m, 1, end) what the row held before
        new = (keys >= self.column[:m, None, None]) & (keys <= cols[:, :, None]) & real[:, :, None]  # (m, S, end) causal in the block
        allowed = (old | new)[:, None]  # a padding query sees the old columns only (never a fully masked row)
        self.valid[rows, cols[rows, where]] = True
        self.tokens[rows, cols[rows, where]] = ids[rows, where]

        def attend(layer: int, k: torch.Tensor, v: torch.Tensor):
            self.keys[layer][rows, :, cols[rows, where]] = k.transpose(1, 2)[rows, where]
            self.values[layer][rows, :, cols[rows, where]] = v.transpose(1, 2)[rows, where]
            return self.keys[layer][:m, :, :end], self.values[layer][:m, :, :end]

        positions = self.position[:m, None] + offset.clamp(min=0)
        logits = self._forward(ids, positions, allowed, attend)
        self.column[:m] += lengths
        self.position[:m] += lengths
        return logits

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed each of the n live slots its token (n,) at its own column; → logits (n, V)."""
        n = token.shape[0]
        slots, cols = torch.arange(n, device=token.device), self.column[:n]
        end = int(cols.max()) + 1
        self.valid[slots, cols] = True
        self.tokens[slots, cols] = token

        def attend(layer: int, k: torch.Tensor, v: torch.Tensor):
            self.keys[layer][slots, :, cols] = k[:, :, 0]
            self.values[layer][slots, :, cols] = v[:, :, 0]
            return self.keys[layer][:n, :, :end], self.values[layer][:n, :, :end]

        logits = self._forward(token[:, None], self.position[:n, None], self.valid[:n, None, None, :end], attend)
        self.column[:n] += 1
        self.position[:n] += 1
        return logits


class CachedTurns:
    """`Turns` on fastgrpo's `Sampler`, one KV cache per rollout kept across turns (see the module docstring).

    Args:
        sampler: the trainer's `Sampler` (its decoder — the model or its own weight copy, which the loop
            updates once per rollout — settings and processors are used).
    """

    def __init__(self, sampler):  # sampler.Sampler, which builds it (Sampler.turns): not imported here, no circle
        self.sampler = sampler
        self.cache: TurnCache | None = None

    @property
    def own_weights(self) -> bool:
        """Whether the turns are sampled from the sampler's own weight copy (bf16), whose log-probs differ from π_old's."""
        return self.sampler.owns_weights

    @torch.no_grad()
    def first(self, prompt_ids, prompt_mask, num_generations, budget):
        s = self.sampler
        lm = s.decoder()
        device = prompt_ids.device
        B, P = prompt_ids.shape
        N, G = B * num_generations, num_generations
        self.cache = cache = TurnCache(lm, N, P + s.sampling.max_completion_length, device, s.sampling.pad_token_id)
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        logits = cache.prefill(prompt_ids, prompt_mask.bool(), positions, G).repeat_interleave(G, dim=0)
        cache.valid[:, P:] = False
        cache.tokens[:, :P] = fill_pads(prompt_ids, prompt_mask).repeat_interleave(G, dim=0)  # the processors read real tokens only
        cache.column[:] = P
        cache.position[:] = (positions[:, -1] + 1).repeat_interleave(G)
        return self._decode(logits, [budget] * N)

    @torch.no_grad()
    def extend(self, rows, appended, budgets):
        cache, device = self.cache, self.cache.row.device
        slot_of = {int(r): s for s, r in enumerate(cache.row.tolist())}
        front = [slot_of[r] for r in rows]
        order = torch.tensor(front + [s for s in range(len(cache.row)) if s not in set(front)], device=device)
        cache.permute(order, int(cache.column.max()))
        blocks = [[int(cache.pending[i])] + list(tokens) for i, tokens in enumerate(appended)]
        width = max(len(b) for b in blocks)
        pad = self.sampler.sampling.pad_token_id
        ids = torch.tensor([[pad] * (width - len(b)) + b for b in blocks], device=device)
        mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in blocks], device=device)
        return self._decode(cache.append(ids, mask), budgets)

    def _decode(self, logits: torch.Tensor, budgets: list[int]) -> list[Turn]:
        """Sample the slots 0…m−1 (m = len(budgets)) until each samples EOS or spends its budget; → their turns."""
        s, cache = self.sampler, self.cache
        device, m = logits.device, len(budgets)
        eos = torch.tensor(s.sampling.eos_token_ids, device=device)
        budget = torch.tensor(budgets, device=device)
        out = [[] for _ in range(m)]
        logps = [[] for _ in range(m)]
        index = torch.arange(m, device=device)  # which of the m turns each live slot is
        N = len(cache.row)
        for t in range(max(budgets)):
            n = len(index)
            width = int(cache.column[:n].max())
            history = cache.tokens[:n, :width]  # rows hold different lengths: a shorter row's tail is not its own
            own = torch.arange(width, device=device) < cache.column[:n, None]
            history = torch.where(own, history, history[:, :1])  # … so it repeats the row's first token (a set keeps, as fill_pads)
            uniform = torch.rand(N, 1, device=device, dtype=torch.float64)[cache.row[:n]]
            token, logp = draw(logits, history, uniform, s.processors, s.sampling.temperature, f"turn token {t}")  # (n,), (n,)
            for i, tok, lp in zip(index.tolist(), token.tolist(), logp.tolist()):
                out[i].append(tok)
                logps[i].append(lp)
            cache.pending[:n] = token
            live = ~torch.isin(token, eos) & (t + 1 < budget[index])
            if not live.any():
                break
            if not live.all():  # finished slots move behind the live ones, their cache kept for a later turn
                keep = live.nonzero().squeeze(1)
                done = (~live).nonzero().squeeze(1)
                cache.permute(torch.cat([keep, done]), int(cache.column[:n].max()))
                index, token = index[keep], token[keep]
            logits = cache.step(token)
        return [Turn(tokens, lp) for tokens, lp in zip(out, logps)]
