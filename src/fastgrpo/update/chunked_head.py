"""The LM head in chunks of tokens: log-prob, entropy and exact KL from last hidden states, no (n, V) logits kept.

`ChunkedHead` is a custom autograd function: each chunk's logits are made,
reduced and freed; backward recomputes them, or, within a memory budget
(`keep_bytes`), reads the softmax forward kept. The head's peak is a few
(chunk, V) buffers, allocated once per call and overwritten in place, plus
the kept (n, V) softmax when it fits the budget.

Maths, as in `algo/losses.py` (which keeps the unchunked reference functions):
logits z = (h Wᵀ + b) / τ, log π(y) = z_y − logsumexp(z), H = −Σ p log p,
KL = Σ p (log p − log q).

Not here: packing the rows and running the decoder (logprobs.py), the loss (algo/losses.py).
"""

from __future__ import annotations

import threading
import weakref

import torch


class ChunkedHead(torch.autograd.Function):
    """Log-prob, entropy and exact KL of tokens from last hidden states, one chunk of logits at a time.

    forward(hidden (n, H), weight (V, H), bias (V,) or None, labels (n,), temperature,
            ref_hidden (n, H) or None, ref_weight (V, H) or None, ref_bias or None, chunk, entropy_grad,
            weight_copy (V, H) in the product dtype or None, scratch (a `Scratch`) or None,
            hand_back: called once backward is done with `weight_copy`, or None, keep_bytes: int)
      → logps (n,), entropy (n,), kl (n,) (zeros without π_ref), fp32 (fp64 for fp64 inputs).

    Each chunk's logits z = (h Wᵀ + b) / τ are a product in the autocast dtype
    when autocast is on (as the model's own head would be), else in the weight's
    dtype, then widened to fp32; reduced and freed; backward recomputes them.
    With g_ℓ, g_KL, g_H the incoming gradients, ∂/∂z = g_ℓ (onehot(y) − p)
    + g_KL p (log p − log q − KL) − g_H p (log p + H), then ∂h = (∂z / τ) W and
    ∂W = (∂z / τ)ᵀ h. Entropy has a gradient only with `entropy_grad` (the
    entropy bonus); else it is a metric. π_ref's tensors take no gradient. A tied
    head (embedding = head) receives its gradient through `weight` like any
    other use of the parameter. Row sums (Σ_v) are `Tensor.sum` over the
    vocabulary, as `algo/losses.py` takes them, so a whole-vocabulary head
    (the model's own, under FSDP) gives the same values to fp32 rounding.

    Speed (docs/benchmarks.md, "The bf16 update"): the weight is cast to the
    product dtype once per call (not per chunk), or not at all when `weight_copy`
    (the policy's bf16 working copy, model/working_copy.py) is given, and every (chunk, V) block lives
    in buffers overwritten in place: a fresh (256, 49 152) fp32 block per op (tens of MB,
    served by the kernel's page faults) made the head's elementwise work several times slower
    than its arithmetic. With `scratch` the blocks are kept across calls (allocated once per
    run, not once per call). With `weight_copy` (one process, no gradient hooks: the working
    copy's rule) each chunk's (V, H) weight gradient is made and added into `weight.grad` a slice
    of rows at a time in one kept bf16 block (`add_weight_grad`) and none is returned: a returned one would
    be a fresh (V, H) block, widened into another, summed with a tied embedding's dense
    gradient into a third and then accumulated, every micro-batch.

    Kept softmax (`keep_bytes`): where backward needs p alone (no π_ref, entropy without gradient: β = 0, GRPO's and
    TRL's default) and the call's (n, V) fp32 softmax fits in `keep_bytes`, forward writes p into one kept block and
    backward reads it instead of recomputing the logits, their log-softmax and exp (the head's forward again: 6 % of
    the seed step's FLOPs), and writes ∂/∂z straight in the product dtype. The values are the recomputing path's bit
    for bit (the same products, the same fp32 operations, one rounding; tests/test_logprobs.py). The block is lent
    by `scratch` to one graph at a time (`Scratch.lend`); a second graph recorded before the first one's backward
    recomputes. Memory: the block stays in `scratch` between passes, as the (chunk, V) ones do (92 MB for a 469-token
    pass of SmolLM2). 0 (the trainer's choice under gradient checkpointing, the memory-first setting): always recompute.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, ref_hidden, ref_weight, ref_bias, chunk, entropy_grad=False, weight_copy=None,
                scratch=None, hand_back=None, keep_bytes=0):
        dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) else weight.dtype
        ctx.save_for_backward(hidden, weight, bias, labels, ref_hidden, ref_weight, ref_bias, weight_copy)
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.entropy_grad, ctx.scratch = temperature, chunk, dtype, entropy_grad, scratch or Scratch()
        ctx.hand_back = hand_back
        n, V = hidden.shape[0], weight.shape[0]
        keeps = any(ctx.needs_input_grad[:3]) and keeps_softmax(n, V, keep_bytes, ref_hidden is not None, entropy_grad, _wide(dtype).itemsize)
        ctx.kept = ctx.scratch.lend("kept.p", (n, V), _wide(dtype), hidden.device, ctx) if keeps else None
        logps, entropy, kl = (torch.zeros(n, dtype=_wide(dtype), device=hidden.device) for _ in range(3))
        with torch.autocast(hidden.device.type, enabled=False):
            head = _Head(weight if weight_copy is None else weight_copy, bias, temperature, dtype, min(chunk, n), ctx.scratch, "policy")
            ref = _Head(ref_weight, ref_bias, temperature, dtype, min(chunk, n), ctx.scratch, "ref") if ref_hidden is not None else None
            for start in range(0, n, chunk):
                part = slice(start, start + chunk)
                logp, p = head(hidden[part], None if ctx.kept is None else ctx.kept[part])  # (c, V) each
                logps[part] = logp.gather(-1, labels[part, None]).squeeze(-1)
                entropy[part] = -head.rowsum(logp, p, keep=ref is not None)  # log p is read again for the KL only
                if ref is not None:
                    kl[part] = head.rowsum(p, _log_ratio(logp, ref(ref_hidden[part])[0]))
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logps, entropy, kl

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy, grad_kl):
        hidden, weight, bias, labels, ref_hidden, ref_weight, ref_bias, weight_copy = ctx.saved_tensors
        tau, dtype, n = ctx.temperature, ctx.dtype, hidden.shape[0]
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]  # a frozen head (LoRA) skips its (V, H) products
        into_grad = weight_copy is not None  # the working copy's rule: added into weight.grad, none returned
        if tau != 1:  # ∂/∂z carries 1/τ: folded into the (n,) incoming gradients, not a pass over each (c, V) block
            grad_logps, grad_entropy, grad_kl = grad_logps / tau, grad_entropy / tau, grad_kl / tau
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = grad_bias = None
        with torch.autocast(hidden.device.type, enabled=False):
            head = _Head(weight if weight_copy is None else weight_copy, bias, tau, dtype, min(ctx.chunk, n), ctx.scratch, "policy")
            ref = _Head(ref_weight, ref_bias, tau, dtype, min(ctx.chunk, n), ctx.scratch, "ref") if ref_hidden is not None else None
            for start in range(0, n, ctx.chunk):
                part = slice(start, start + ctx.chunk)
                g_l = grad_logps[part, None]
                if ctx.kept is not None:  # g_ℓ (onehot − p) from the kept p, written in the product dtype (one rounding)
                    p = ctx.kept[part]
                    at_label = p.gather(-1, labels[part, None]).mul_(-g_l).add_(g_l)  # −g_ℓ p_y + g_ℓ, in fp32 as below
                    grad_z = torch.mul(p, -g_l, out=p if dtype == p.dtype else head.product[: p.shape[0]])
                    grad_z.scatter_(-1, labels[part, None], at_label.to(grad_z.dtype))
                else:
                    logp, p = head(hidden[part])  # recomputed, (c, V)
                    reads_p = ctx.entropy_grad or ref is not None  # else ∂/∂z is written over p itself
                    grad_z = torch.mul(p, -g_l, out=head.scratch(p) if reads_p else p)  # g_ℓ (onehot − p), the onehot added next
                    grad_z.scatter_add_(-1, labels[part, None], g_l)
                if ctx.entropy_grad:  # ∂H/∂z = −p (log p + H)
                    plogp = p * logp
                    grad_z -= grad_entropy[part, None] * (plogp - p * plogp.sum(-1, keepdim=True))
                if ref is not None:  # + g_KL p (log p − log q − KL), log p's buffer reused (not needed again)
                    diff = _log_ratio(logp, ref(ref_hidden[part])[0])
                    kl = torch.mul(p, diff, out=logp).sum(-1, keepdim=True)
                    grad_z += torch.mul(p, grad_kl[part, None], out=logp).mul_(diff.sub_(kl))
                grad_z = head.narrow(grad_z)  # ∂/∂(h Wᵀ + b), in the product dtype
                if need_hidden:
                    grad_hidden[part] = (grad_z @ head.weight).to(hidden.dtype)
                if need_weight and into_grad:
                    add_weight_grad(weight, grad_z, hidden[part].to(dtype), ctx.scratch)
                elif need_weight:
                    part_grad = grad_z.T @ hidden[part].to(dtype)
                    grad_weight = part_grad.to(_wide(dtype)) if grad_weight is None else grad_weight.add_(part_grad)
                if need_bias:
                    part_grad = grad_z.sum(0)
                    grad_bias = part_grad.to(_wide(dtype)) if grad_bias is None else grad_bias.add_(part_grad)
        grad_weight = grad_weight.to(weight.dtype) if need_weight and not into_grad else None
        grad_bias = grad_bias.to(bias.dtype) if need_bias else None
        if ctx.hand_back is not None:  # done with the weight copy (model/working_copy.WorkingCopy.reader)
            ctx.hand_back()
        ctx.scratch = ctx.kept = None  # a call's own blocks go now, not with the graph after the whole backward; the kept one is free again
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None, None, None, None, None, None


class Scratch:
    """`ChunkedHead`'s (chunk, V) and (rows, H) blocks, kept from call to call: one per name, shape and dtype, per thread.

    A fresh block of tens of MB is mapped anew by the allocator and zero-filled by the kernel page
    by page at first touch, which cost more than the head's own elementwise work (docs/benchmarks.md,
    "The bf16 update"). A block is reused while it is large enough and replaced when a call needs
    more rows. Each thread has its own (the async producer's π_behaviour pass runs beside the update).
    Memory: the blocks stay resident between calls, about what one call allocated anyway.
    """

    def __init__(self):
        self._local = threading.local()

    def lend(self, name: str, shape: tuple[int, int], dtype: torch.dtype, device: torch.device, borrower) -> torch.Tensor | None:
        """`block(name, ...)` for `borrower` (an autograd node's ctx) to hold until it sets `borrower.kept` to None or is
        freed (its graph dropped); None while another living borrower still holds it. Held by weak reference, per thread."""
        lent = self._local.__dict__.setdefault("lent", {})
        holder = lent.get(name)
        holder = None if holder is None else holder()
        if holder is not None and holder.kept is not None:
            return None
        lent[name] = weakref.ref(borrower)
        return self.block(name, shape, dtype, device)

    def block(self, name: str, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A (rows, cols) tensor of `dtype`, contents undefined: the first `rows` rows of the kept block."""
        blocks = self._local.__dict__.setdefault("blocks", {})
        kept = blocks.get((name, dtype, device))
        if kept is None or kept.shape[0] < shape[0] or kept.shape[1] != shape[1]:
            kept = blocks[(name, dtype, device)] = torch.empty(shape, dtype=dtype, device=device)
        return kept[: shape[0]]


def keeps_softmax(tokens: int, vocab: int, keep_bytes: int, reference: bool, entropy_grad: bool, itemsize: int = 4) -> bool:
    """Whether `ChunkedHead`'s forward keeps its (tokens, vocab) softmax for backward (its docstring, "Kept softmax").

    Args:
        tokens, vocab: n and V of the call; itemsize: bytes per softmax element (4: fp32, 8: fp64).
        keep_bytes: the budget (`LogProbs.head_keep_bytes`); reference: π_ref's KL is taken (β ≠ 0);
        entropy_grad: the entropy has a gradient (the entropy bonus). Either of those needs log p in backward too.
    """
    return not reference and not entropy_grad and tokens * vocab * itemsize <= keep_bytes


def add_weight_grad(weight: torch.Tensor, grad_z: torch.Tensor, hidden: torch.Tensor, scratch: Scratch, rows: int = 4096) -> None:
    """`weight.grad += (grad_zᵀ hidden)` widened to fp32, made and added `rows` vocabulary rows at a time; AccumulateGrad's values.

    Args:
        weight: the head's trained (V, H) fp32 parameter.
        grad_z: (c, V) ∂/∂(h Wᵀ + b) of one chunk, in the product dtype.
        hidden: (c, H) the chunk's hidden states, in the product dtype.
        scratch: the kept blocks: one (rows, H) block in the product dtype holds each slice's product.
    A slice's product is its rows of the whole (V, H) product (each row reduces over the chunk's tokens alone), and
    `.grad` is the first chunk's product widened, then + each next one's, elementwise in fp32: autograd's accumulation
    (tests/test_logprobs.py). A (V, H) block would be 57 MB kept for SmolLM2, and adding a whole bf16 (V, H) block
    widens it into a freshly mapped (V, H) temporary (page faults: 3× the add's own time measured for 49 152 × 576);
    a slice's temporary (9 MB) comes from the allocator's reused heap.
    """
    V, H = weight.shape
    first = weight.grad is None  # the slices are then copied (widened) into a new .grad: 0 + x without the zero-fill
    if first:
        weight.grad = torch.empty_like(weight)
    for start in range(0, V, rows):
        block = scratch.block("weight_grad", (min(rows, V - start), H), grad_z.dtype, grad_z.device)
        product = torch.mm(grad_z[:, start : start + rows].T, hidden, out=block)
        if first:
            weight.grad[start : start + rows].copy_(product)
        else:
            weight.grad[start : start + rows].add_(product)


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The softmax precision: fp32, or the matmul's dtype when wider (fp64 in gradient checks)."""
    return torch.promote_types(dtype, torch.float32)


def _log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log p − log q, written over `ref_logp` (a `_Head` buffer)."""
    return torch.sub(logp, ref_logp, out=ref_logp)


class _Head:
    """(c, H) hidden states → (c, V) log-softmax and softmax of (h Wᵀ + b) / τ, in buffers reused across chunks.

    The weight (and bias) are cast to `dtype` once; the product runs in `dtype`
    into a (chunk, V) buffer of that dtype (the log-softmax's own buffer when
    `dtype` is already fp32), the softmax in at least fp32 into (chunk, V)
    buffers for log p and p. The views returned are overwritten by the next call.
    """

    def __init__(self, weight, bias, temperature, dtype, chunk, scratch: Scratch, key: str):
        self.weight = weight.detach().to(dtype)
        self.bias = None if bias is None else bias.detach().to(dtype)
        self.temperature, self.dtype, wide = temperature, dtype, _wide(dtype)
        V, device = weight.shape[0], weight.device
        self.logp = scratch.block(f"{key}.logp", (chunk, V), wide, device)
        self.product = self.logp if dtype == wide else scratch.block(f"{key}.product", (chunk, V), dtype, device)
        self.p = scratch.block(f"{key}.p", (chunk, V), wide, device)
        self.blocks, self.key = scratch, key  # a third (chunk, V) block comes from them when backward needs one (`scratch`)

    def __call__(self, hidden, p_out=None):
        """(c, H) → log p, p (c, V): views of the head's buffers (p of `p_out` when given), overwritten by the next call."""
        c = hidden.shape[0]
        z = torch.mm(hidden.to(self.dtype), self.weight.T, out=self.product[:c])
        if self.bias is not None:
            z.add_(self.bias)
        logp, p = self.logp[:c], self.p[:c] if p_out is None else p_out
        if logp.data_ptr() != z.data_ptr():
            logp.copy_(z)
        if self.temperature != 1:  # z / 1 is z: the pass is skipped, not the value changed
            logp.div_(self.temperature)
        torch.log_softmax(logp, -1, out=logp)  # in place: one fused kernel, where max, Σ exp and the shift took six passes
        return logp, torch.exp(logp, out=p)

    def rowsum(self, a: torch.Tensor, b: torch.Tensor, keep: bool = True) -> torch.Tensor:
        """(c, V), (c, V) → (c,) Σ_v a·b per row: the product in the scratch block (over `a` itself unless `keep`), then
        `Tensor.sum` (as algo/losses.py)."""
        return torch.mul(a, b, out=self.scratch(a) if keep else a).sum(-1)

    def scratch(self, like: torch.Tensor) -> torch.Tensor:
        """A (c, V) block of `like`'s shape and dtype, the same one at every call."""
        return self.blocks.block(f"{self.key}.spare", tuple(self.logp.shape), like.dtype, like.device)[: like.shape[0]]

    def narrow(self, grad_z):
        """(c, V) fp32 → the product dtype, into the product buffer (no new block)."""
        if grad_z.dtype == self.dtype:
            return grad_z
        return self.product[: grad_z.shape[0]].copy_(grad_z)
