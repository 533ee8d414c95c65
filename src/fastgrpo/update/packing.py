"""The packed row of a micro-batch: its layout (`pack`) and whether a model can share prompts in it.

`pack` lays B padded completions out as one row with no pad token in it, each
prompt once per run of identical prompts when the model's attention takes a 4D
mask (`sharing_support`); logprobs.py runs the model on it. Positions restart at
0 for every prompt, as `generate()` numbered them.

Not here: the forward, the LM head and the statistics (logprobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.checkpointing import attention_implementation
from ..model.experts import router_kwargs
from .grouped_attention import IMPLEMENTATION, AttentionLayout, build_layout, use_layout


@dataclass(frozen=True)
class PackedRow:
    """One micro-batch as a single row; n = real completion tokens, L = packed length."""

    input_ids: torch.Tensor  # (1, L)
    position_ids: torch.Tensor  # (1, L) restarting at 0 for every prompt
    attention_mask: torch.Tensor | None  # (1, 1, L, L) custom mask when prompts are shared without a layout, else None
    source: torch.Tensor  # (n,) row position whose hidden state predicts each completion token
    labels: torch.Tensor  # (n,) the completion tokens
    rows: torch.Tensor  # (n,) sequence index b of each completion token in (B, T)
    cols: torch.Tensor  # (n,) token index t of each completion token in (B, T)
    padded_tokens: int
    real_tokens: int
    layout: AttentionLayout | None = None  # shared prompts with `grouped`: the pieces grouped_attention runs, instead of the mask


def pack(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
    share_prompts: bool, mask_dtype: torch.dtype | None = None, grouped: bool = False,
) -> PackedRow:
    """Lay a padded micro-batch out as one packed row.

    Args:
        prompt_ids, prompt_mask: (B, P), prompts left-padded (mask 1 on real tokens).
        completion_ids, completion_mask: (B, T), 1 up to and including the first EOS.
        share_prompts: compute a prompt once for consecutive rows whose real prompt
            tokens are identical (exact: equal tokens give equal activations), with a
            (1, 1, L, L) mask; else every completion gets its own copy and no mask
            (transformers derives the block-diagonal mask from the position ids).
        mask_dtype: None for a boolean mask (True = attend, what sdpa takes), or a
            float dtype for an additive 0 / −inf-like mask (what eager attention adds).
        grouped: with share_prompts, an `AttentionLayout` of the row's pieces for
            grouped_attention instead of the dense mask (which is then None), where
            `use_layout` finds it cheaper; else the dense mask as without it.
    Returns:
        `PackedRow`. Token t of completion b is predicted by the hidden state at
        `source`: the last prompt token for t = 0, completion token t − 1 after it.
    Raises:
        ValueError: shapes that do not match.
    """
    if prompt_ids.shape != prompt_mask.shape or completion_ids.shape != completion_mask.shape or len(prompt_ids) != len(completion_ids):
        raise ValueError(
            f"pack() needs prompt_ids/prompt_mask (B, P) and completion_ids/completion_mask (B, T) with one B; got "
            f"{tuple(prompt_ids.shape)}, {tuple(prompt_mask.shape)}, {tuple(completion_ids.shape)}, {tuple(completion_mask.shape)}."
        )
    B, T = completion_ids.shape
    device = completion_ids.device
    ids, positions, block, segment = [], [], [], []  # per piece; block = prompt copy, segment = completion (−1: prompt)
    source, rows, cols = [], [], []
    prompt_pieces, completion_pieces = [], []  # (start, length) / (start, length, prompt piece) for the layout
    length, last_prompt, last_prompt_end = 0, None, 0
    for b in range(B):
        prompt = prompt_ids[b][prompt_mask[b].bool()]
        completion = completion_ids[b][completion_mask[b].bool()]
        if not (share_prompts and last_prompt is not None and torch.equal(prompt, last_prompt)):
            ids.append(prompt)
            positions.append(torch.arange(len(prompt), device=device))
            block.append(torch.full((len(prompt),), b, device=device))
            segment.append(torch.full((len(prompt),), -1, device=device))
            prompt_pieces.append((length, len(prompt)))
            length += len(prompt)
            last_prompt, last_prompt_end, block_id = prompt, length, b
        n = len(completion)
        if n:
            completion_pieces.append((length, n, len(prompt_pieces) - 1))
        ids.append(completion)
        positions.append(torch.arange(len(prompt), len(prompt) + n, device=device))
        block.append(torch.full((n,), block_id, device=device))
        segment.append(torch.full((n,), b, device=device))
        # Logit t predicts token t + 1: the prompt's last token predicts the first completion token.
        source.append(torch.cat([torch.tensor([last_prompt_end - 1], device=device), torch.arange(length, length + max(n - 1, 0), device=device)])[:n])
        rows.append(torch.full((n,), b, device=device))
        cols.append(completion_mask[b].nonzero().flatten())
        length += n
    block_ids, segment_ids = torch.cat(block), torch.cat(segment)
    mask = layout = None
    if share_prompts and grouped:
        layout = build_layout(prompt_pieces, completion_pieces, length, device)
        if not use_layout(layout, length):  # short rows, uneven or long pieces: the dense mask costs less
            layout = None
    if share_prompts and layout is None:
        q, k = torch.arange(length, device=device).unsqueeze(1), torch.arange(length, device=device).unsqueeze(0)
        same_block = block_ids.unsqueeze(1) == block_ids.unsqueeze(0)
        visible = (segment_ids.unsqueeze(0) == -1) | (segment_ids.unsqueeze(1) == segment_ids.unsqueeze(0))  # prompt or own
        allowed = (k <= q) & same_block & visible  # (L, L)
        if mask_dtype is None:
            mask = allowed[None, None]
        else:
            mask = torch.zeros(length, length, dtype=mask_dtype, device=device).masked_fill(~allowed, torch.finfo(mask_dtype).min)[None, None]
    return PackedRow(
        input_ids=torch.cat(ids).unsqueeze(0), position_ids=torch.cat(positions).unsqueeze(0), attention_mask=mask,
        source=torch.cat(source).long(), labels=completion_ids[completion_mask.bool()],
        rows=torch.cat(rows).long(), cols=torch.cat(cols).long(),
        padded_tokens=B * (prompt_ids.shape[1] + T), real_tokens=int(prompt_mask.sum() + completion_mask.sum()), layout=layout,
    )


def sharing_support(model) -> str | None:
    """Why `model` cannot take a shared-prompt 4D mask, or None when it can.

    It can when its attention is "sdpa" or "eager" (both use a 4D mask as given,
    transformers 5.24 `masking_utils`) and every layer is full attention: a custom
    mask would drop a sliding window, and flash/flex kernels take no dense mask.
    """
    config = getattr(model, "module", model).config
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager"):
        return f"attn_implementation={implementation!r} takes no custom 4D mask"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return f"{config.model_type} has sliding-window attention (sliding_window={config.sliding_window})"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return f"{config.model_type} mixes attention types ({sorted(set(config.layer_types))})"
    return None


def pad(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> PackedRow:
    """The micro-batch as TRL runs it: B padded rows (B, P + T) with a 2-D mask, for models that cannot take a packed row.

    Positions count the real tokens from 0 in each row (as `generate()` numbered them), so the
    log-probs equal the packed row's. `source` indexes the flattened (B·(P + T)) hidden states.
    Returns a `PackedRow` whose `attention_mask` is the (B, P + T) 0/1 mask.
    """
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    B, P = prompt_ids.shape
    rows, cols = completion_mask.nonzero(as_tuple=True)
    return PackedRow(
        input_ids=ids, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), attention_mask=mask,
        source=rows * ids.shape[1] + P - 1 + cols,  # logit at column P − 1 + t predicts completion token t
        labels=completion_ids[rows, cols], rows=rows, cols=cols,
        padded_tokens=ids.numel(), real_tokens=int(mask.sum()),
    )


def packing_support(model) -> str | None:
    """Why `model` cannot run a packed row without a mask, or None when it can.

    A packed row relies on transformers deriving the block-diagonal mask from the
    position ids (masking_utils' packed-sequence detection); a model whose mask
    builder is not given the position ids (GPT-OSS, transformers 5.19) lets each
    sequence attend to the ones before it. Measured, not assumed: two copies of a
    3-token sequence, packed, must give the second copy the first one's logits.
    Run once per model class by `LogProbs` (eval mode, no gradient).
    """
    inner = getattr(model, "module", model)
    ids = torch.arange(1, 4, device=inner.device).repeat(2)[None]  # (1, 6): [1 2 3 1 2 3]
    positions = torch.arange(3, device=inner.device).repeat(2)[None]
    was_training = inner.training
    inner.eval()
    try:  # in the weights' own dtype, without autocast: equal rows are equal to rounding
        with torch.no_grad(), torch.autocast(ids.device.type, enabled=False):
            logits = inner(input_ids=ids, position_ids=positions, use_cache=False).logits[0].float()
    finally:
        inner.train(was_training)
    tol = 1e-4 if next(inner.parameters()).dtype == torch.float32 else 3e-2  # bf16 rounding; a leak moves logits by far more
    if torch.allclose(logits[:3], logits[3:], atol=tol, rtol=tol):
        return None
    return f"{inner.config.model_type} does not separate packed sequences by their position ids"


def grouped_support(model) -> str | None:
    """Why `model` cannot run grouped_attention (update/grouped_attention.py), or None when it can.

    It can when its layers hand the `attention_layout` keyword on to transformers' attention function
    and read no attention name of their own (Falcon tests for "sdpa"; StableLM's and Nemotron's decoder
    layers drop the keywords, transformers 5.19). Measured, not assumed: a prompt shared by two
    completions, packed, must give the dense mask's logits. Run once per model class by `LogProbs`
    (eval mode, no gradient), after `sharing_support` found the model can share prompts.
    """
    inner = getattr(model, "module", model)
    device = inner.device
    prompt_ids = torch.tensor([[1, 2, 3], [1, 2, 3]], device=device)  # row: 1 2 3 | 4 5 | 6
    completion_ids, completion_mask = torch.tensor([[4, 5], [6, 0]], device=device), torch.tensor([[1, 1], [1, 0]], device=device)
    dense = pack(prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask, share_prompts=True)
    layout = build_layout([(0, 3)], [(3, 2, 0), (5, 1, 0)], 6, device)
    inputs = dict(input_ids=dense.input_ids, position_ids=dense.position_ids, use_cache=False, **router_kwargs(inner.config, False))
    was_training = inner.training
    inner.eval()
    try:  # in the weights' own dtype, without autocast
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            expected = inner(**inputs, attention_mask=dense.attention_mask).logits[0].float()
            try:
                with attention_implementation(inner, IMPLEMENTATION):
                    got = inner(**inputs, attention_mask=None, attention_layout=layout).logits[0].float()
            except Exception as error:  # noqa: BLE001 — any failure means: keep the dense mask
                return f"{inner.config.model_type} does not run grouped attention ({type(error).__name__}: {error})"
    finally:
        inner.train(was_training)
    # Relative to the largest logit (fp32 summation order moves SmolLM2's ≈ 30-sized logits by ≈ 2e-4); a leak moves them by O(1).
    tol = (1e-4 if next(inner.parameters()).dtype == torch.float32 else 3e-2) * float(expected.abs().max())
    if torch.allclose(got, expected, atol=tol, rtol=0):
        return None
    return f"{inner.config.model_type}'s grouped attention differs from its dense mask"
