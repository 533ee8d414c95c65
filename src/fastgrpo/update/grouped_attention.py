"""Attention over a shared-prompt packed row without its dense (L, L) mask: each piece against only what it sees.

In a packed row with shared prompts (packing.py) a prompt attends causally to
itself and a completion to its own prompt and, causally, to itself: of the row's
L² query–key pairs a pass needs about Σ_pieces queries × keys, a small share
once a row holds several groups. sdpa with the dense mask computes all L², so
its cost grows with the square of the row (measured, SmolLM2's 9 heads, one
layer forward + backward, bf16: 36 → 22 ms at L = 790, 422 → 87 ms at L = 2875;
benchmarks/attention.py, docs/benchmarks.md "Grouped attention and merged passes").

`AttentionLayout` lists the pieces (each prompt; each completion with its
prompt's keys first, then its own) sorted by length and padded into batches
(`Pieces`, `build_layout`). `grouped_attention` gathers q, k, v into them and
runs softmax attention in fp32 (autocast off inside: scores and softmax in fp32,
as sdpa's CPU kernels accumulate), with the query heads that share a key head
stacked along the query length instead of repeating keys, and puts the output
back in row order. Like flash attention it keeps only q, k and v for backward
and recomputes the probabilities there. Values equal sdpa's with the dense mask
to float rounding (tests/test_grouped_attention.py).

It is registered with transformers' `AttentionInterface` as `IMPLEMENTATION`.
`LogProbs` switches a model to it for one forward (model/checkpointing.attention_implementation)
and passes the layout as the `attention_layout` keyword, which transformers
hands on to every layer's attention function; a model whose layers do not
(packing.grouped_support, measured once per model class) keeps the dense mask.
Rows whose pieces are uneven or long keep it too (`use_layout`).

Not here: the row's layout (packing.pack), which passes use it (logprobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface

IMPLEMENTATION = "fastgrpo_grouped_sdpa"


@dataclass(frozen=True)
class Pieces:
    """Pieces of a packed row padded into one batch: N pieces of up to Lq queries and Lk keys.

    Indices are positions in the packed row; padding repeats position 0 and is
    masked. A padded query sees key slot 0 alone: a finite softmax whose output is
    never read and whose gradient is 0 (an all-masked row would give NaN gradients).
    """

    query: torch.Tensor  # (N, Lq) long: row position of each piece's queries
    key: torch.Tensor  # (N, Lk) long: row position of each piece's keys
    mask: torch.Tensor  # (N, Lq, Lk) bool: query i of piece n sees key j


@dataclass(frozen=True)
class AttentionLayout:
    """Which keys each query of a packed row sees, as padded batches of pieces (module docstring)."""

    batches: tuple[Pieces, ...]  # pieces of similar lengths, each batch at most BATCH_PAIRS padded pairs per head
    order: torch.Tensor  # (L,) long: each row position's slot in the batches' flattened queries (N·Lq each, in order)
    pairs: int  # query–key pairs per head the batches compute, padding included (sdpa's dense mask: L²)


# Padded query–key pairs per head in one batch of pieces: its fp32 scores are BATCH_PAIRS × heads × 4 bytes
# (36 MB for SmolLM2's 9 heads), so a long row is attended batch by batch, never as one block. A piece
# larger than PIECE_PAIRS alone (a long completion) would make one such block too large: its row keeps
# sdpa's dense mask, whose kernels tile (`use_layout`).
BATCH_PAIRS = 1 << 20
PIECE_PAIRS = 4 << 20


def use_layout(layout: AttentionLayout, length: int) -> bool:
    """Whether a row of `length` tokens should run grouped attention with `layout` rather than sdpa with the dense mask.

    Yes when the batches compute at most a quarter of the dense mask's L² pairs and no single piece
    exceeds PIECE_PAIRS. A quarter: a pair costs grouped attention (fp32) ≈ 4.5× what it costs sdpa's
    kernel on bf16 inputs (measured on an Intel Xeon with AMX, benchmarks/attention.py and
    docs/benchmarks.md), so below it grouped attention is the faster; fp32 runs gain less often than they could.
    """
    largest = max(b.mask[0].numel() for b in layout.batches)  # every piece of a batch is padded to the batch's size
    return 4 * layout.pairs <= length * length and largest <= PIECE_PAIRS


def build_layout(prompts: list[tuple[int, int]], completions: list[tuple[int, int, int]], length: int, device,
                 batch_pairs: int | None = None) -> AttentionLayout:
    """The layout of a packed row from its pieces.

    Pieces are sorted by length and batched so that each batch is padded only to its own longest
    piece, no piece to more than twice its own pairs, and a batch computes at most `batch_pairs`
    padded pairs per head (one piece alone may exceed it): uneven completions cost little padding,
    and no batch's scores grow with the whole row.

    Args:
        prompts: (start, length) of each prompt in the row; a prompt sees itself, causally.
        completions: (start, length, index into `prompts` of the prompt it continues) of each
            completion; it sees its prompt, then itself causally.
        length: L, the row's length; every position must be in exactly one piece.
        batch_pairs: the cap on a batch's padded pairs per head (None: BATCH_PAIRS).
    Returns:
        `AttentionLayout`.
    Raises:
        ValueError: no prompt, an empty piece, or pieces that do not cover the row once.
    """
    if not prompts or any(n < 1 for _, n in prompts) or any(n < 1 for _, n, _ in completions):
        raise ValueError(f"build_layout() needs at least one prompt and no empty piece; got prompts {prompts}, completions {completions}.")
    # (query start, query length, prefix start, prefix length): a completion's prefix is its prompt.
    pieces = [(start, n, 0, 0) for start, n in prompts] + [(start, n, *prompts[j]) for start, n, j in completions]
    pieces.sort(key=lambda p: (p[1] + p[3], p[1]), reverse=True)  # longest first: each batch's first piece sets its padding
    batch_pairs = BATCH_PAIRS if batch_pairs is None else batch_pairs
    own = [n * (n + p_len) for _, n, _, p_len in pieces]  # each piece's pairs, unpadded
    batches, flat, slots, offset, i = [], [], [], 0, 0
    while i < len(pieces):
        Lq, Lp, smallest, j = pieces[i][1], pieces[i][3], own[i], i + 1
        while j < len(pieces):
            wider_q, wider_p = max(Lq, pieces[j][1]), max(Lp, pieces[j][3])
            padded = wider_q * (wider_p + wider_q)  # each piece's padded pairs in the batch
            if (j + 1 - i) * padded > batch_pairs or 2 * min(smallest, own[j]) < padded:
                break  # the batch is full, or a piece in it would be padded to more than twice its pairs
            Lq, Lp, smallest, j = wider_q, wider_p, min(smallest, own[j]), j + 1
        batch, real = _batch(pieces[i:j], Lq, Lp, device)
        flat.append(batch.query[real])
        slots.append(offset + torch.arange(real.numel(), device=device)[real.flatten()])
        batches.append(batch)
        offset, i = offset + real.numel(), j
    flat, slots = torch.cat(flat), torch.cat(slots)
    if len(flat) != length or not torch.equal(torch.sort(flat).values, torch.arange(length, device=device)):
        raise ValueError(f"build_layout(): the pieces cover {len(flat)} positions, not each of the row's {length} once.")
    order = torch.empty(length, dtype=torch.long, device=device)
    order[flat] = slots  # the output slot of each row position
    return AttentionLayout(tuple(batches), order, sum(b.mask.numel() for b in batches))


def _batch(pieces: list[tuple[int, int, int, int]], Lq: int, Lp: int, device) -> tuple[Pieces, torch.Tensor]:
    """Pieces (query start, query length, prefix start, prefix length) padded to Lq queries and Lp + Lq keys, and their (N, Lq) real queries."""
    start, n, p_start, p_len = (torch.tensor(v, dtype=torch.long, device=device)[:, None] for v in zip(*pieces))
    iq, ip = torch.arange(Lq, device=device), torch.arange(Lp, device=device)
    real, prefix = iq < n, ip < p_len  # (N, Lq), (N, Lp)
    query = torch.where(real, start + iq, 0)
    key = torch.cat([torch.where(prefix, p_start + ip, 0), query], 1)  # (N, Lp + Lq)
    return Pieces(query, key, _padded_causal(real, prefix)), real


def _padded_causal(real: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """(N, Lq, P + Lq) mask: every real key of `prefix` (N, P) bool, then causal over the piece's own real tokens.

    `real` (N, Lq) marks the piece's real tokens; a padded query row sees key slot 0 only.
    """
    N, Lq = real.shape
    i = torch.arange(Lq, device=real.device)
    own = (i[None, None, :] <= i[None, :, None]) & real[:, None, :]  # (N, Lq, Lq)
    mask = torch.cat([prefix[:, None, :].expand(N, Lq, -1), own], 2)
    first_only = torch.zeros_like(mask)
    first_only[..., 0] = True
    return torch.where(real[:, :, None], mask, first_only)


def _gathered(q: torch.Tensor, k: torch.Tensor, pieces: Pieces, scale: float):
    """q (H, L, D), k (KV, L, D) fp32 → the pieces' queries (N, KV, rep·Lq, D), keys (N, KV, Lk, D) and masked scores.

    Query heads that share a key head are stacked along the query length (grouped-query attention
    without repeating keys); scores are (N, KV, rep·Lq, Lk), −inf where masked.
    """
    KV, rep = k.shape[0], q.shape[0] // k.shape[0]
    (N, Lq), Lk = pieces.query.shape, pieces.key.shape[1]
    queries = q[:, pieces.query].transpose(0, 1).unflatten(1, (KV, rep)).flatten(2, 3)
    keys = k[:, pieces.key].transpose(0, 1)
    scores = torch.matmul(queries, keys.transpose(-1, -2)).mul_(scale)
    scores.view(N, KV, rep, Lq, Lk).masked_fill_(~pieces.mask[:, None, None], float("-inf"))  # one mask for every head
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
        for pieces in layout.batches:
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
        padded = sum(p.query.numel() for p in layout.batches)
        slots = grad_out.new_zeros(padded, heads, grad_out.shape[-1], dtype=torch.float32)  # the value's head size (MLA: not the query's)
        slots[layout.order] = grad_out.float()  # padded slots keep a zero gradient
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        start = 0
        for pieces in layout.batches:
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


def grouped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      attention_layout: AttentionLayout | None = None, **kwargs):
    """transformers' attention-function signature over a packed row's `attention_layout`.

    Args:
        query: (1, H, L, D); key, value: (1, KV, L, D) (after rotary embeddings), a packed row.
        attention_mask: ignored (the layout is the mask).
        dropout: must be 0 with a layout (`LogProbs` runs the dense mask when attention dropout is on).
        scaling: the softmax scale (default D^-0.5).
        attention_layout: the row's `AttentionLayout`.
    Returns:
        ((1, L, H, D) in the query's dtype, None), as transformers' sdpa_attention_forward.
    Raises:
        RuntimeError: no layout (a layer that does not pass keywords on, or a concurrent forward).
        ValueError: a batch of more than one row, attention dropout, or attention features the layout
            does not express (a sliding window, logit softcapping, attention sinks).
    """
    if attention_layout is None:  # only a layer that drops keywords, or another thread's forward, lands here
        raise RuntimeError(
            f"{type(module).__name__} ran with attention {IMPLEMENTATION!r} but without the packed row's layout: its "
            "decoder layer does not pass attention keywords on (packing.grouped_support refuses such models), or another "
            "thread ran the model while a log-prob pass had switched it. Run forwards of one model from one thread."
        )
    unsupported = [name for name in ("sliding_window", "softcap", "s_aux") if kwargs.get(name) is not None]
    if query.shape[0] != 1 or dropout > 0 or unsupported:
        raise ValueError(f"grouped attention takes one packed row of plain softmax attention without dropout; got batch "
                         f"{query.shape[0]}, dropout {dropout}, {unsupported or 'no other features'}.")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    with torch.autocast(query.device.type, enabled=False):  # fp32 scores and softmax, whatever the region's autocast
        out = _GroupedAttention.apply(query[0], key[0], value[0], attention_layout, scale)
    return out[None], None


AttentionInterface.register(IMPLEMENTATION, grouped_attention)
