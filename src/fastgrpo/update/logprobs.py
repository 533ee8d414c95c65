"""The log-prob passes for π_θ, π_old and π_ref: packed rows, each prompt once, a chunked LM head.

A micro-batch of B completions (left-padded prompts, right-padded completions)
becomes one packed row with no pad token in it:

    [prompt₁ | completion₁ | completion₂ | … | prompt₂ | completion₃ | …]

Position ids restart at 0 for each prompt and continue from the prompt's end
in each completion, exactly as `generate()` numbered them, so every real token
sees the same positions as in the padded batch. When consecutive rows share the
same prompt tokens (the G completions of a group are contiguous) the prompt is
computed once and each of its completions attends to it: completion tokens see
their prompt and earlier tokens of their own completion, nothing else. sdpa
models attend piece by piece where it pays (grouped_attention.py, no (L, L)
mask); other rows, eager attention, layers checkpointed so that they recompute
under the model's own attention (model/checkpointing.py) and attention dropout
take a 4D mask. The gradient through the shared prompt is the sum over
its completions, which is what G separate copies would give. A model that does not
separate packed sequences by their position ids (`packing.packing_support`,
measured once per model class) runs TRL's padded rows instead (`packing.pad`).

The last hidden states then go through the LM head in chunks of
`CHUNK_TOKENS` tokens (`ChunkedHead`, a custom autograd function): each chunk's
logits are made, reduced to log-prob, entropy and (optionally) the exact
KL(π_θ‖π_ref), and freed; backward recomputes them. No (B, T, V) tensor
exists; the head's peak is one (chunk, V) block.

Maths, as in `losses.py` (which keeps the unchunked reference functions):
logits z = h Wᵀ / τ (τ the sampling temperature, DESIGN "known pitfalls"),
log π(y) = z_y − logsumexp(z), H = −Σ p log p, KL = Σ p (log p − log q).

Not here: the loss (losses.py), which micro-batches run when (trainer.py).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch
from torch import nn

from ..algo.losses import entropy_from_logits, kl_full, selective_log_softmax
from ..model.checkpointing import attention_implementation, recomputes_as_forward
from ..model.experts import router_kwargs
from ..model.working_copy import WorkingCopy
from .chunked_head import ChunkedHead, Scratch
from .grouped_attention import IMPLEMENTATION
from .packing import PackedRow, grouped_support, pack, packing_support, pad, sharing_support

# Tokens per LM-head chunk: a (256, 49 152) fp32 block is 50 MB for SmolLM2, about
# the padded micro-batch's whole (4, 64, V) logits, while 256 rows keep the head
# matmul at full speed.
CHUNK_TOKENS = 256

# The most bytes of (n, V) fp32 softmax the chunked head keeps from a pass's forward for its backward instead of
# recomputing the logits (`ChunkedHead`'s `keep_bytes`): 1 365 tokens of SmolLM2's 49 152-token vocabulary, a
# 512-token pass (the default token budget at 64/64 tokens) is 96 MiB. docs/benchmarks.md, "The kept softmax".
HEAD_KEEP_BYTES = 256 * 2**20

# Config fields that hold an attention-probability dropout (Llama's, GPT-2's, BERT-style, and others').
_ATTENTION_DROPOUT = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob", "attn_dropout")

# Config fields that change logits after the linear head; such heads run unchunked
# through the model's own forward (`LogProbs` says so once).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class TokenStats(NamedTuple):
    """Per completion token of a micro-batch, 0 where `completion_mask` is 0."""

    logps: torch.Tensor  # (B, T) log π(y_t | prefix) at temperature τ; differentiable
    entropy: torch.Tensor  # (B, T) exact entropy over the vocabulary, nats; differentiable only with `entropy_grad`
    kl: torch.Tensor | None  # (B, T) exact KL(π_θ‖π_ref); differentiable w.r.t. π_θ; None without π_ref
    aux_loss: torch.Tensor | None  # 0-d the router's load-balancing loss (model/experts.py), differentiable; None unless `router_aux_loss`
    padded_tokens: int  # tokens of the padded layout B × (P + T)
    real_tokens: int  # non-pad tokens: prompts counted once per completion
    packed_tokens: int  # tokens actually computed (each shared prompt once)


def chunkable_head(model) -> str | None:
    """Why `model`'s LM head cannot be chunked here, or None.

    It cannot when the head is not an `nn.Linear` (e.g. a LoRA-adapted head), its
    weight is sharded, or the config transforms logits after it (softcapping,
    scaling). Then `LogProbs` calls the model's own head on the needed positions.
    """
    inner = getattr(model, "module", model)
    head = inner.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        return f"its output head has type {type(head).__name__}, not nn.Linear"
    if hasattr(head.weight, "ds_id") or type(head.weight).__name__ == "DTensor" or "FullyShardedDataParallel" in type(model).__name__:
        return "its head weight is sharded (FSDP / DeepSpeed ZeRO-3) and only gathered inside the model's forward"
    config = inner.config
    for name in _LOGIT_TRANSFORMS:
        if getattr(config, name, None) not in (None, 1, 1.0):
            return f"{config.model_type} transforms logits after the head ({name}={getattr(config, name)})"
    return None


def fallback_notices(model) -> list[str]:
    """One sentence per part of the fast path `model` cannot take (for the start-up console), else []."""
    notes = []
    if (reason := sharing_support(model)) is not None:
        if (unpackable := packing_support(model)) is not None:
            notes.append(f"the update runs padded rows, as TRL does ({reason}; {unpackable}).")
        else:
            notes.append(f"prompts are not shared between a group's completions ({reason}); packing only.")
    elif _attention(model) == "sdpa" and (ungrouped := grouped_support(model)) is not None:
        notes.append(f"shared prompts are attended through a dense (L, L) mask ({ungrouped}).")
    if (reason := chunkable_head(model)) is not None:
        notes.append(f"the LM head runs unchunked through the model's forward ({reason}).")
    return notes


class LogProbs:
    """The log-prob pass of one micro-batch through a policy (and, for the exact KL, π_ref).

    Args:
        temperature: τ, the sampling temperature (logits / τ, as sampled).
        share_prompts: compute each prompt once per run of identical prompts, where
            the model's attention can take the 4D mask (`sharing_support`).
        chunk: tokens per LM-head chunk.
        autocast: context factory around every pass, π_θ's, π_old's and π_ref's
            alike (the trainer passes `accelerator.autocast`): the same products
            in the same precision, so ρ = 1 and KL = 0 exactly where weights agree.
            Under bf16 autocast the LM head's products are bf16 too (measured: on
            SmolLM2 they add 0.008 to the body's 0.055 mean |Δ log p| against fp32,
            for a 4× faster head on AMX); its log-softmax, entropy and KL stay fp32.
        entropy_grad: entropies with gradient (the entropy bonus); else detached.
        weights: the policy's bf16 `WorkingCopy` (model/working_copy.py), or None. Given, the
            policy's linear layers and chunked head multiply its copies (cast once per
            optimizer step, not by autocast at every forward; gradients reach the fp32
            parameters, widened as autocast's cast would): the same products, so the
            same values. A model it does not hold (a separate π_ref) runs through autocast.
        router_aux_loss: a mixture-of-experts policy's load-balancing loss is returned
            (`TokenStats.aux_loss`, the model's own over the packed row); its prompts are
            then not shared (model/experts.py says why). Else router logits are never asked for.
        grouped_attention: shared-prompt rows of sdpa models attend piece by piece
            (update/grouped_attention.py) where `_grouped_attention` allows; False: sdpa
            over the dense (L, L) mask (the same values to float rounding; benchmarks' A/B).
        head_keep_bytes: the most bytes of a pass's (n, V) fp32 softmax the chunked head keeps
            from forward for backward (the same values, the head's forward not run twice;
            `ChunkedHead`); 0 recomputes it (the trainer's choice under gradient checkpointing).

    Call: `log_probs(model, mb, reference=None) → TokenStats`, where `mb` has
    `prompt_ids`, `prompt_mask`, `completion_ids`, `completion_mask` (a `Rollout`
    view). `reference` given — a zero-argument callable returning a context
    manager that yields π_ref, e.g. `lambda: nullcontext(ref_model)`, or one that
    disables a LoRA adapter for its duration — `kl` holds the exact KL(π_θ‖π_ref),
    π_ref run without gradient on the same packed row after the policy's forward.
    π_ref has the policy's architecture (a copy, or the policy without its
    adapter), so the policy decides packing and chunking for both.
    """

    def __init__(
        self, temperature: float, share_prompts: bool = True, chunk: int = CHUNK_TOKENS, autocast=nullcontext, entropy_grad: bool = False,
        weights: WorkingCopy | None = None, router_aux_loss: bool = False, grouped_attention: bool = True,
        head_keep_bytes: int = HEAD_KEEP_BYTES,
    ):
        if temperature <= 0:
            raise ValueError(f"temperature={temperature}: log-probs are taken at logits / temperature; use a value > 0.")
        if chunk < 1:
            raise ValueError(f"chunk={chunk}: the LM head needs at least 1 token per chunk.")
        self.temperature, self.share_prompts, self.chunk, self.autocast = temperature, share_prompts, chunk, autocast
        self.entropy_grad, self.weights, self.router_aux_loss = entropy_grad, weights, router_aux_loss
        self.grouped_attention, self.head_keep_bytes = grouped_attention, head_keep_bytes
        self.packs: dict[type, bool] = {}  # model class → runs a packed row without a mask (packing.packing_support)
        self.groups: dict[type, bool] = {}  # model class → runs grouped attention (packing.grouped_support)
        self.scratch = None if weights is not None and weights.release else Scratch()  # the chunked head's (chunk, V) blocks, kept from pass to pass

    def __call__(self, model, mb, reference=None) -> TokenStats:
        with self.autocast():
            return self._stats(model, mb, reference)

    def layout(self, model) -> str:
        """How a pass of `model` lays a micro-batch out: "shared" (one packed row, each run of identical prompts once),
        "packed" (one packed row, each completion's prompt) or "padded" (TRL's padded rows: the model would let packed
        sequences see each other; `packing.packing_support`, measured once per model class)."""
        if self.share_prompts and not self.router_aux_loss and sharing_support(model) is None:
            return "shared"
        kind = type(_inner(model))
        if kind not in self.packs:
            self.packs[kind] = packing_support(model) is None
        return "packed" if self.packs[kind] else "padded"

    def _stats(self, model, mb, reference) -> TokenStats:
        layout = self.layout(model)
        share = layout == "shared"
        mask_dtype = None if _attention(model) == "sdpa" else _dtype(model)
        kind = type(_inner(model))
        grouped = share and self.grouped_attention and _grouped_attention(model)
        if grouped and kind not in self.groups:  # measured once per model class
            self.groups[kind] = grouped_support(model) is None
        grouped = grouped and self.groups[kind]
        if layout != "padded":
            row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share, mask_dtype, grouped)
        else:  # TRL's padded rows: the model would let packed sequences see each other
            row = pad(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask)
        shape = mb.completion_ids.shape
        if chunkable_head(model) is None:
            working = self.weights if self.weights is not None and self.weights.holds(model) else None
            hidden, aux_loss = _last_hidden(model, row, self.router_aux_loss, working)  # (n, H)
            ref_hidden = ref_head = None
            if reference is not None:
                with torch.no_grad(), reference() as ref_model:
                    ref_hidden, ref_head = _last_hidden(ref_model, row, False)[0], _head(ref_model)
            head = _head(model)
            logps, entropy, kl = ChunkedHead.apply(
                hidden, head.weight, head.bias, row.labels, self.temperature, ref_hidden,
                None if ref_head is None else ref_head.weight.detach(),
                None if ref_head is None or ref_head.bias is None else ref_head.bias.detach(), self.chunk, self.entropy_grad,
                None if working is None else working.cast(head.weight), self.scratch,
                None if working is None else working.reader(head.weight), self.head_keep_bytes if torch.is_grad_enabled() else 0,
            )
        else:  # the model's own head on the needed positions only: (1, n, V) at most
            out = _forward(model, row, _keep(row), self.router_aux_loss)
            logits, aux_loss = _kept_logits(out, row) / self.temperature, _aux_loss(model, out, self.router_aux_loss)
            logps = selective_log_softmax(logits, row.labels[None])[0]
            with torch.set_grad_enabled(self.entropy_grad and torch.is_grad_enabled()):  # its graph is a second (n, V) block
                entropy = entropy_from_logits(logits)[0]
            kl = None
            if reference is not None:
                with torch.no_grad(), reference() as ref_model:
                    ref_logits = _kept_logits(_forward(ref_model, row, _keep(row), False), row) / self.temperature
                kl = kl_full(logits, ref_logits)[0]
        return TokenStats(
            logps=_scatter(logps, row, shape), entropy=_scatter(entropy if self.entropy_grad else entropy.detach(), row, shape),
            kl=_scatter(kl, row, shape) if reference is not None else None, aux_loss=aux_loss,
            padded_tokens=row.padded_tokens, real_tokens=row.real_tokens, packed_tokens=row.input_ids.numel(),
        )


def _grouped_attention(model) -> bool:
    """Whether shared-prompt rows run grouped_attention (its layout, no dense (L, L) mask) rather than sdpa with the mask.

    Yes for sdpa models, except under gradient checkpointing whose layers recompute under the model's own attention
    (in backward, after the pass has switched the model back to sdpa: model/checkpointing.recomputes_as_forward) and
    with attention dropout in training (grouped_attention has none).
    """
    inner = _inner(model)
    dropout = inner.training and any(float(getattr(inner.config, name, 0.0) or 0.0) > 0 for name in _ATTENTION_DROPOUT)
    return _attention(model) == "sdpa" and recomputes_as_forward(inner) and not dropout


def _scatter(values: torch.Tensor, row: PackedRow, shape) -> torch.Tensor:
    """(n,) per real completion token → (B, T), 0 elsewhere (differentiable)."""
    out = torch.zeros(shape, dtype=values.dtype, device=values.device)
    return out.index_put((row.rows, row.cols), values)


def _inner(model):
    return getattr(model, "module", model)  # DDP wraps the model; the call still goes through the wrapper


def _attention(model) -> str | None:
    return getattr(_inner(model).config, "_attn_implementation", None)


def _dtype(model) -> torch.dtype:
    return next(_inner(model).parameters()).dtype


def _head(model) -> nn.Linear:
    return _inner(model).get_output_embeddings()


def _forward(model, row: PackedRow, logits_to_keep: torch.Tensor, router_logits: bool, working: WorkingCopy | None = None):
    """The model's forward on the packed row; a mixture-of-experts model returns its load-balancing loss only when `router_logits`.

    `working` given, the policy's linear layers multiply its bf16 copies (`torch.func.functional_call`)
    and a plain input embedding is looked up outside the model (`WorkingCopy.input_embeddings`).
    A row with an attention layout runs with grouped_attention (its layout passed to every layer).
    """
    inputs = dict(input_ids=row.input_ids, position_ids=row.position_ids, attention_mask=row.attention_mask,
                  logits_to_keep=logits_to_keep, use_cache=False, **router_kwargs(_inner(model).config, router_logits))
    if row.layout is not None:
        inputs["attention_layout"] = row.layout
    with attention_implementation(model, IMPLEMENTATION if row.layout is not None else None):
        if working is None:
            return model(**inputs)
        embeds = working.input_embeddings(_inner(model), row.input_ids)
        if embeds is not None:
            inputs.update(input_ids=None, inputs_embeds=embeds)
        return torch.func.functional_call(model, working.linear_weights(model), kwargs=inputs, tie_weights=False)  # the copies as weights


def _keep(row: PackedRow):
    """logits_to_keep: the packed row's needed positions, or every position of padded rows (`packing.pad`)."""
    return row.source if row.input_ids.shape[0] == 1 else 0


def _kept_logits(out, row: PackedRow) -> torch.Tensor:
    """(1, n, V) fp32 logits at `row.source` from a forward run with `_keep(row)`."""
    logits = out.logits.float()
    return logits if row.input_ids.shape[0] == 1 else logits.flatten(0, 1)[row.source][None]


def _aux_loss(model, out, router_logits: bool) -> torch.Tensor | None:
    """The forward's 0-d `aux_loss` when asked for, else None.

    Raises:
        ValueError: the model declares router logits but returns no load-balancing loss (DeepSeek-V3-style
            routers balance with a bias instead, transformers 5.19).
    """
    if not router_logits:
        return None
    if getattr(out, "aux_loss", None) is None:
        config = _inner(model).config.get_text_config()
        raise ValueError(
            f"{config.model_type} returns no router load-balancing loss (its router balances without one), so "
            "router_aux_loss_coef has nothing to weight; set router_aux_loss_coef=0.0."
        )
    return out.aux_loss


def _last_hidden(model, row: PackedRow, router_logits: bool, working: WorkingCopy | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(n, H) final hidden states at `row.source`, and the forward's `aux_loss` (`_aux_loss`), through the model's (possibly DDP-wrapped) forward.

    The forward runs through the wrapper, so DDP's gradient synchronisation stays
    in place; its head runs on zero positions, and a hook on the decoder keeps the
    hidden states.
    """
    kept = []
    hook = _inner(model).get_decoder().register_forward_hook(lambda module, args, out: kept.append(out[0]))
    try:
        out = _forward(model, row, row.source[:0], router_logits, working)
    finally:
        hook.remove()
    return kept[0].flatten(0, 1)[row.source], _aux_loss(model, out, router_logits)
