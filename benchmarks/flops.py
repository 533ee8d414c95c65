"""FLOPs of an optimizer step, counted from what actually runs.

Update (one optimizer step, `step_flops`): every pass (a micro-batch, or several
merged under `update_token_budget`) is one packed row of L tokens (packing.pack:
pads removed, a group's prompt once) of which n are completion tokens whose
log-prob is taken.

- body: the decoder's linear layers, N_body weights (every parameter less the
  embedding, and less the head when it is untied): 2·N_body·L forward, 4·N_body·L
  backward (input and weight gradients), i.e. the usual 6·N·tokens;
- head: V·H weights on the n completion tokens only: 6·V·H·n, plus 2·V·H·n for
  the chunked head's recomputed logits in its backward (`head_recompute`) on the
  rows whose softmax it does not keep (`chunked_head.keeps_softmax`);
- attention: QKᵀ and AV over the query–key pairs the kernel computes, H_attn =
  heads × head_dim: 4·pairs·H_attn per layer forward, twice that backward. sdpa
  with a mask computes pairs = L² (the full L × L); grouped_attention (shared
  prompts) computes its padded pieces, pairs = Σ N·Lq·Lk, and recomputes QKᵀ in
  backward (2·pairs·H_attn more).

Not here: measuring the peaks (bf16_peaks.py, worker.linear_peak).
"""

from __future__ import annotations

from fastgrpo.model.checkpointing import recomputes_as_forward
from fastgrpo.update.chunked_head import keeps_softmax
from fastgrpo.update.packing import pack, sharing_support


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


def step_rows(trainer, rollout, step_in_pass: int = 0) -> list[tuple[int, int, int, bool, bool]]:
    """(L, n, attention pairs, grouped, head softmax kept) of each packed row of one optimizer step's passes, as `LogProbs`
    packs them and its chunked head keeps them (`keeps_softmax`: no logits recomputed in backward)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    share = trainer.log_probs.share_prompts and sharing_support(model) is None
    grouped = (share and trainer.log_probs.grouped_attention and getattr(model.config, "_attn_implementation", None) == "sdpa"
               and recomputes_as_forward(model))  # LogProbs' rule (logprobs._grouped_attention; SmolLM2 passes grouped_support)
    out = []
    for span, _ in trainer.update.passes(rollout, step_in_pass):
        mb = rollout.select(span)
        row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share, grouped=grouped)
        L = row.input_ids.shape[1]
        pairs = L * L if row.layout is None else row.layout.pairs  # pack keeps the dense mask where it is cheaper
        kept = keeps_softmax(len(row.labels), model.get_output_embeddings().weight.shape[0], trainer.log_probs.head_keep_bytes,
                             trainer.args.beta != 0, trainer.log_probs.entropy_grad)
        out.append((L, len(row.labels), pairs, row.layout is not None, kept))
    return out


def step_flops(model, rows: list[tuple[int, int, int, bool, bool]]) -> dict:
    """FLOPs of one optimizer step over packed rows [(L, n, pairs, grouped, kept), …] (`step_rows`, module docstring).

    'total' = body + head + attention + recompute: what the step executes; 'model' leaves out what the step
    computes twice (the head's recomputed logits, grouped attention's recomputed QKᵀ), as a model-FLOPs share counts.
    """
    s = model_sizes(model)
    tokens, head_tokens = sum(r[0] for r in rows), sum(r[1] for r in rows)
    body = 6 * s["body"] * tokens
    head = 6 * s["head"] * head_tokens
    recompute = 2 * s["head"] * sum(r[1] for r in rows if not r[4])
    per_pair = s["attn_width"] * s["layers"]
    attention_model = 12 * per_pair * sum(pairs for _, _, pairs, _, _ in rows)
    attention = attention_model + 2 * per_pair * sum(pairs for _, _, pairs, grouped, _ in rows if grouped)  # grouped: QKᵀ again in backward
    return {"tokens": tokens, "head_tokens": head_tokens, "body": body, "head": head, "head_recompute": recompute,
            "attention": attention, "model_6NT": 6 * (s["body"] + s["head"]) * tokens, "total": body + head + recompute + attention,
            "model": body + head + attention_model}
