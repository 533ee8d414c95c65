"""FLOPs of an optimizer step, counted from what actually runs.

Update (one optimizer step, `step_flops`): every micro-batch is one packed row
of L tokens (packing.pack: pads removed, a group's prompt once) of which n are
completion tokens whose log-prob is taken.

- body: the decoder's linear layers, N_body weights (every parameter less the
  embedding, and less the head when it is untied): 2·N_body·L forward, 4·N_body·L
  backward (input and weight gradients), i.e. the usual 6·N·tokens;
- head: V·H weights on the n completion tokens only: 6·V·H·n, plus 2·V·H·n for
  the chunked head's recomputed logits in its backward (`head_recompute`);
- attention: QKᵀ and AV over the whole packed row, H_attn = heads × head_dim:
  4·L²·H_attn per layer forward, twice that backward (the kernel computes the
  full L × L with a custom mask).

Not here: measuring the peaks (bf16_peaks.py, worker.linear_peak).
"""

from __future__ import annotations

from fastgrpo.update.packing import pack, sharing_support
from fastgrpo.rollout.record import micro_batch_rows


def model_sizes(model) -> dict:
    """N_body, the head's V·H, layers and H_attn of a causal LM (tied head counted once, in the head)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    tied = head.data_ptr() == embedding.data_ptr()
    body = total - embedding.numel() - (0 if tied else head.numel())
    norms = sum(p.numel() for p in model.parameters() if p.dim() == 1)  # RMSNorm gains: no matmul
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"body": body - norms, "head": head.numel(), "layers": c.num_hidden_layers, "attn_width": c.num_attention_heads * head_dim}


def step_rows(trainer, rollout, step_in_pass: int = 0) -> list[tuple[int, int]]:
    """(L, n) of each packed micro-batch row of one optimizer step, as `LogProbs` packs them."""
    a = trainer.args
    GA = a.gradient_accumulation_steps
    model = trainer.accelerator.unwrap_model(trainer.model)
    share = trainer.log_probs.share_prompts and sharing_support(model) is None
    out = []
    for rows in micro_batch_rows(len(rollout), a.steps_per_generation)[step_in_pass * GA : (step_in_pass + 1) * GA]:
        mb = rollout.select(rows)
        row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share)
        out.append((row.input_ids.shape[1], len(row.labels)))
    return out


def step_flops(model, rows: list[tuple[int, int]]) -> dict:
    """FLOPs of one optimizer step over packed rows [(L, n), …] (module docstring); 'total' = body + head + attention + recompute."""
    s = model_sizes(model)
    tokens, head_tokens = sum(L for L, _ in rows), sum(n for _, n in rows)
    body = 6 * s["body"] * tokens
    head = 6 * s["head"] * head_tokens
    recompute = 2 * s["head"] * head_tokens
    attention = sum(12 * L * L * s["attn_width"] * s["layers"] for L, _ in rows)
    return {"tokens": tokens, "head_tokens": head_tokens, "body": body, "head": head, "head_recompute": recompute,
            "attention": attention, "model_6NT": 6 * (s["body"] + s["head"]) * tokens, "total": body + head + recompute + attention}
