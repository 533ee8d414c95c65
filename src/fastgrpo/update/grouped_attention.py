"""Attention over a shared-prompt packed row without its dense (L, L) mask: each piece against only what it sees.

In a packed row with shared prompts (packing.py) a prompt attends causally to
itself and a completion to its own prompt and, causally, to itself: of the row's
L² query–key pairs a pass needs about Σ_pieces queries × keys, a small share
once a row holds several groups. sdpa with the dense mask computes all L², so
its cost grows with the square of the row (measured, SmolLM2's 9 heads,
forward + backward per layer, bf16: 33 → 25 ms at L = 757, 116 → 55 ms at
L = 1642; docs/benchmarks.md "Grouped attention").

`AttentionLayout` lists the pieces as two padded batches (`Pieces`): prompts
(Np, Lp) and completions (Nc, Lc) whose keys are their prompt's, then their own
(Nc, Lp + Lc). `grouped_attention` gathers q, k, v into them and runs softmax
attention in fp32 (autocast off inside: scores and softmax in fp32, as sdpa's
CPU kernels accumulate), with the query heads that share a key head stacked
along the query length instead of repeating keys, and puts the output back in
row order. Like flash attention it keeps only q, k and v for backward and
recomputes the probabilities there. Values equal sdpa's with the dense mask to
float rounding (tests/test_grouped_attention.py).

It is registered with transformers' `AttentionInterface` as `IMPLEMENTATION`.
`LogProbs` switches a model to it for one forward (`attention_implementation`)
and passes the layout as the `attention_layout` keyword, which transformers
hands on to every layer's attention function; without a layout it is sdpa.

Not here: the row's layout (packing.pack), which passes use it (logprobs.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

IMPLEMENTATION = "fastgrpo_grouped_sdpa"


@dataclass(frozen=True)
class Pieces:
    """Pieces of a packed row padded into one batch: N pieces of up to Lq queries and Lk keys.

    Indices are positions in the packed row; padding repeats position 0 and is
    masked. Key slot 0 is always real, and a padded query sees it alone (a finite
    softmax whose output is never read; an all-masked row would give NaN gradients).
    """

    query: torch.Tensor  # (N, Lq) long: row position of each piece's queries
    key: torch.Tensor  # (N, Lk) long: row position of each piece's keys
    mask: torch.Tensor  # (N, Lq, Lk) bool: query i of piece n sees key j
    biases: dict = field(default_factory=dict, compare=False, repr=False)  # rep → its additive mask, made once per row

    def bias(self, rep: int) -> torch.Tensor:
        """(N, 1, rep·Lq, Lk) fp32: 0 where seen, −inf elsewhere, for `rep` query heads per key head (made at the first layer)."""
        if rep not in self.biases:
            blocked = ~self.mask[:, None].repeat(1, 1, rep, 1)
            self.biases[rep] = torch.zeros(blocked.shape, device=blocked.device).masked_fill_(blocked, float("-inf"))
        return self.biases[rep]


@dataclass(frozen=True)
class AttentionLayout:
    """Which keys each query of a packed row sees, as two padded batches of pieces (module docstring)."""

    prompts: Pieces  # each prompt: its own tokens, causal (Lk = Lq = Lp)
    completions: Pieces | None  # each completion: its prompt's tokens (padded to Lp), then its own, causal; None: none
    order: torch.Tensor  # (L,) long: each row position's slot in the flattened [prompt pieces (Np·Lp) | completion pieces (Nc·Lc)] output


def build_layout(prompts: list[tuple[int, int]], completions: list[tuple[int, int, int]], length: int, device) -> AttentionLayout:
    """The layout of a packed row from its pieces.

    Args:
        prompts: (start, length) of each prompt in the row.
        completions: (start, length, index into `prompts` of the prompt it continues) of each completion.
        length: L, the row's length; every position must be in exactly one piece.
    Returns:
        `AttentionLayout`.
    Raises:
        ValueError: no prompt, an empty piece, or pieces that do not cover the row once.
    """
    if not prompts or any(n < 1 for _, n in prompts) or any(n < 1 for _, n, _ in completions):
        raise ValueError(f"build_layout() needs at least one prompt and no empty piece; got prompts {prompts}, completions {completions}.")
    p_start, p_len = (torch.tensor(v, dtype=torch.long, device=device) for v in zip(*prompts))
    p_real = torch.arange(int(p_len.max()), device=device) < p_len[:, None]  # (Np, Lp)
    prompt_query = torch.where(p_real, p_start[:, None] + torch.arange(p_real.shape[1], device=device), 0)
    prompt = Pieces(prompt_query, prompt_query, _padded_causal(p_real, None))
    flat, slots = [prompt_query[p_real]], [torch.arange(p_real.numel(), device=device)[p_real.flatten()]]
    completion = None
    if completions:
        c_start, c_len, c_prompt = (torch.tensor(v, dtype=torch.long, device=device) for v in zip(*completions))
        c_real = torch.arange(int(c_len.max()), device=device) < c_len[:, None]  # (Nc, Lc)
        completion_query = torch.where(c_real, c_start[:, None] + torch.arange(c_real.shape[1], device=device), 0)
        key = torch.cat([prompt_query[c_prompt], completion_query], 1)  # (Nc, Lp + Lc)
        completion = Pieces(completion_query, key, _padded_causal(c_real, p_real[c_prompt]))
        flat.append(completion_query[c_real])
        slots.append(p_real.numel() + torch.arange(c_real.numel(), device=device)[c_real.flatten()])
    flat, slots = torch.cat(flat), torch.cat(slots)
    if len(flat) != length or not torch.equal(torch.sort(flat).values, torch.arange(length, device=device)):
        raise ValueError(f"build_layout(): the pieces cover {len(flat)} positions, not each of the row's {length} once.")
    order = torch.empty(length, dtype=torch.long, device=device)
    order[flat] = slots  # the output slot of each row position
    return AttentionLayout(prompt, completion, order)


def _padded_causal(real: torch.Tensor, prefix: torch.Tensor | None) -> torch.Tensor:
    """(N, Lq, P + Lq) mask: every real key of `prefix` (N, P) (none if None), then causal over the piece's own real tokens.

    `real` (N, Lq) marks the piece's real tokens; a padded query row sees key 0 only.
    """
    N, Lq = real.shape
    i = torch.arange(Lq, device=real.device)
    own = (i[None, None, :] <= i[None, :, None]) & real[:, None, :]  # (N, Lq, Lq)
    mask = own if prefix is None else torch.cat([prefix[:, None, :].expand(N, Lq, -1), own], 2)
    first_only = torch.zeros_like(mask)
    first_only[..., 0] = True
    return torch.where(real[:, :, None], mask, first_only)


def _gathered(q: torch.Tensor, k: torch.Tensor, pieces: Pieces, scale: float):
    """q (H, L, D), k (KV, L, D) fp32 → the pieces' queries (N, KV, rep·Lq, D), keys (N, KV, Lk, D) and masked scores.

    Query heads that share a key head are stacked along the query length (grouped-query attention
    without repeating keys); scores are (N, KV, rep·Lq, Lk), −inf where masked.
    """
    KV, rep = k.shape[0], q.shape[0] // k.shape[0]
    queries = q[:, pieces.query].transpose(0, 1).unflatten(1, (KV, rep)).flatten(2, 3)
    keys = k[:, pieces.key].transpose(0, 1)
    scores = torch.matmul(queries, keys.transpose(-1, -2)).mul_(scale).add_(pieces.bias(rep))
    return queries, keys, scores


def _to_rows(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(N, KV, rep·Lq, D) → (N·Lq, H, D): each query slot's heads, in slot order."""
    return x.unflatten(2, (heads // x.shape[1], -1)).flatten(1, 2).transpose(1, 2).flatten(0, 1)


def _from_rows(x: torch.Tensor, N: int, KV: int) -> torch.Tensor:
    """(N·Lq, H, D) → (N, KV, rep·Lq, D), the inverse of `_to_rows`."""
    return x.unflatten(0, (N, -1)).transpose(1, 2).unflatten(1, (KV, -1)).flatten(2, 3)


class _GroupedAttention(torch.autograd.Function):
    """Softmax attention over a layout's pieces, fp32 inside; saves only q, k and v.

    Backward recomputes the probabilities (flash attention's trade: one more QKᵀ and softmax instead of
    (N, KV, rep·Lq, Lk) blocks kept per layer) and adds each gathered key's gradient into its row
    position, so a prompt's keys sum the gradients of all the completions that read them.
    """

    @staticmethod
    def forward(ctx, query, key, value, layout: AttentionLayout, scale: float):
        heads = query.shape[0]
        q, k, v = query.float(), key.float(), value.float()
        outs = []
        for pieces in _groups(layout):
            _, _, scores = _gathered(q, k, pieces, scale)
            outs.append(_to_rows(torch.softmax(scores, -1) @ v[:, pieces.key].transpose(0, 1), heads))
        ctx.save_for_backward(query, key, value)
        ctx.layout, ctx.scale = layout, scale
        return torch.cat(outs)[layout.order].to(query.dtype)  # (L, H, D) in row order

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value = ctx.saved_tensors
        layout, scale = ctx.layout, ctx.scale
        heads, KV = query.shape[0], key.shape[0]
        q, k, v = query.float(), key.float(), value.float()
        slots = grad_out.new_zeros(layout.order.numel() + _padding(layout), heads, q.shape[-1], dtype=torch.float32)
        slots[layout.order] = grad_out.float()  # padded slots keep a zero gradient
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        start = 0
        for pieces in _groups(layout):
            N, Lq = pieces.query.shape
            queries, keys, scores = _gathered(q, k, pieces, scale)
            values = v[:, pieces.key].transpose(0, 1)
            probs = torch.softmax(scores, -1)  # (N, KV, rep·Lq, Lk)
            d_out = _from_rows(slots[start : start + N * Lq], N, KV)
            start += N * Lq
            d_scores = probs * (d_out @ values.transpose(-1, -2))  # softmax backward: P ∘ (dP − rowsum(P ∘ dP))
            d_scores = torch.addcmul(d_scores, probs, d_scores.sum(-1, keepdim=True), value=-1).mul_(scale)
            dq.index_add_(1, pieces.query.flatten(), _to_rows(d_scores @ keys, heads).transpose(0, 1))
            dk.index_add_(1, pieces.key.flatten(), (d_scores.transpose(-1, -2) @ queries).transpose(0, 1).flatten(1, 2))
            dv.index_add_(1, pieces.key.flatten(), (probs.transpose(-1, -2) @ d_out).transpose(0, 1).flatten(1, 2))
        return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), None, None


def _groups(layout: AttentionLayout) -> list[Pieces]:
    return [layout.prompts] + ([layout.completions] if layout.completions is not None else [])


def _padding(layout: AttentionLayout) -> int:
    """Padded (never read) slots in the flattened output."""
    return sum(p.query.numel() for p in _groups(layout)) - layout.order.numel()


def grouped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      attention_layout: AttentionLayout | None = None, **kwargs):
    """transformers' attention-function signature: `attention_layout` given, the grouped computation; else sdpa's.

    Args:
        query: (1, H, L, D); key, value: (1, KV, L, D) (after rotary embeddings), a packed row.
        attention_mask: ignored with a layout (the layout is the mask); passed to sdpa without one.
        dropout: must be 0 with a layout (`LogProbs` runs the dense mask when attention dropout is on).
        scaling: the softmax scale (default D^-0.5).
        attention_layout: the row's `AttentionLayout`, or None.
    Returns:
        ((1, L, H, D) in the query's dtype, None), as transformers' sdpa_attention_forward.
    Raises:
        ValueError: a batch of more than one row, attention dropout, or attention features the layout
            does not express (a sliding window, logit softcapping, attention sinks).
    """
    if attention_layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    unsupported = [name for name in ("sliding_window", "softcap", "s_aux") if kwargs.get(name) is not None]
    if query.shape[0] != 1 or dropout > 0 or unsupported:
        raise ValueError(f"grouped attention takes one packed row of plain softmax attention without dropout; got batch "
                         f"{query.shape[0]}, dropout {dropout}, {unsupported or 'no other features'}.")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    with torch.autocast(query.device.type, enabled=False):  # fp32 scores and softmax, whatever the region's autocast
        out = _GroupedAttention.apply(query[0], key[0], value[0], attention_layout, scale)
    return out[None], None


@contextmanager
def attention_implementation(model, name: str | None):
    """Run `model` (its config, as transformers' layers read it at each forward) with attention `name` for the block; None: unchanged."""
    if name is None:
        yield
        return
    config = getattr(model, "module", model).config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


AttentionInterface.register(IMPLEMENTATION, grouped_attention)
