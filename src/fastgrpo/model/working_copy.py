"""One bf16 working copy of a plain policy's weights, recast once per optimizer step, read by the update and the sampler.

Under bf16 autocast every linear layer casts its fp32 weight to bf16 at every
forward (each micro-batch of π_θ, each π_old pass: autocast caches within one
forward only), the chunked head casts its weight in its forward and again in
its backward, and the sampler holds a bf16 copy of its own
(generation/weight_copy.MergedCopy).
`WorkingCopy` casts each floating-point parameter once and recasts it, in
place into the same tensor, only when the parameter changed: after each step of
the optimizer (`watch`: the fused AdamW kernel moves no version counter), or
when its version counter moved (`copy_`, `load_state_dict`). The
update's products multiply these copies (update/logprobs.py, through
`torch.func.functional_call`; update/chunked_head.py for the LM head), and
`MergedCopy` takes its parameters from the same tensors: the weights are
held in bf16 once.

Values: `Tensor.to`'s rounding is autocast's, so the products, log-probs and
gradients are autocast's bit for bit (tests/test_bf16.py); the gradient reaches
the fp32 master through `_CastOnce`, widened as autocast's cast's backward widens it.

The (V, H) gradients: the input embedding's lookup (`input_embeddings`) adds its gradient
into the rows it read, where autograd would zero-fill a dense (V, H) fp32 gradient (113 MB
for SmolLM2, freshly mapped and page-faulted at every micro-batch) and add it whole; the
chunked head adds its weight gradient into `.grad` itself (update/chunked_head.py). Both
bypass autograd's gradient accumulation, so they are only used where no gradient hook
runs: the working copy's own rule below (one process, no DDP or FSDP).

Handed back in backward (`release`, under gradient checkpointing on a CPU): a checkpointed layer
recomputes through autocast's casts of the fp32 weights, not through the copy, so past the
forward the copy is read only by the products' backward. Each copy then lives in its own pages
of one anonymous mapping, and once every product that read it in the graph has run its backward
(`reader`: `_CastOnce`'s backward, which runs after the products that read its output, and the
chunked head's), its pages go back to the kernel (`madvise(MADV_DONTNEED)`), whatever malloc keeps:
the fp32 gradients grow into the memory the copy gave back, and the step's peak holds 0.25 GiB less
for SmolLM2. The next read recasts it (the optimizer step changed it anyway), after `before_recast` (the
trainer's: the heap's free memory back to the kernel, so the recast pages do not stack on the gradients
`zero_grad` freed); the sampler's copy recasts at its next read too (generation/weight_copy.MergedCopy.module).

`working_copy` decides where it applies: bf16 on, a plain model (no peft
adapters: the sampler's copy merges them and the base is frozen), one process
without FSDP (a sharded or DDP-wrapped forward keeps autocast). Gradient
checkpointing keeps it: a checkpointed layer recomputes outside
`functional_call`, under the forward's autocast, whose cast of each fp32 weight
is the copy bit for bit, and backward runs the forward's graph, through the copy
(model/checkpointing.py).

Not here: the autocast itself (precision.py), the sampler's copy (generation/weight_copy.py).
"""

from __future__ import annotations

import math
import mmap
import sys
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from .loading import is_peft_model


class WorkingCopy:
    """One `dtype` copy of a model's floating-point parameters, recast when (and only when) a parameter changed.

    Args:
        model: the policy (a plain causal LM); its parameters stay the fp32 masters
            that gradients and AdamW update.
        dtype: the products' dtype (torch.bfloat16).
        release: hand each copy's memory back once the backward of a pass is done with it (module
            docstring; CPU only: the copies then live in one anonymous mapping, not in malloc's heap).
        before_recast: called once before the first recast after memory was handed back (the trainer's
            `malloc_trim`: the gradients `zero_grad` freed go back before the copy's pages return beside them).
    `cast(param)` returns the copy of one parameter: a tensor allocated once and
    rewritten in place when the parameter's version counter moved (or its memory was
    handed back). Within an optimizer step every micro-batch and π_old pass, and the
    sampler, read the same tensors.
    Attributes:
        nbytes: bytes the copies hold.
    Raises:
        ValueError: `release` with a parameter that is not on the CPU.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16, release: bool = False,
                 before_recast: Callable[[], object] | None = None):
        self.dtype, self.release, self.before_recast, self._handed_back = dtype, release, before_recast, False
        self._copies: dict[int, tuple[int | None, torch.Tensor]] = {}  # id(param) → (version cast, copy)
        self._params = [p for p in model.parameters() if p.is_floating_point()]
        self._pages = _Pages(self._params, dtype) if release else None
        self._readers: dict[int, int] = {}  # id(param) → products of recorded graphs still to run backward on its copy
        for p in self._params:
            self.cast(p)
        self.nbytes = sum(c.numel() * c.element_size() for _, c in self._copies.values())

    @torch.no_grad()
    def cast(self, param: torch.Tensor) -> torch.Tensor:
        """`param` (one of the model's) in `dtype`, recast in place if it changed since the last call; no gradient."""
        version, copy = self._copies.get(id(param), (None, None))
        if copy is None:
            copy = self._pages.tensor(param) if self._pages is not None else torch.empty_like(param, dtype=self.dtype)
        elif version == param._version:
            return copy
        if self._handed_back:
            self._handed_back = False
            if self.before_recast is not None:
                self.before_recast()
        copy.copy_(param.detach())
        self._copies[id(param)] = (param._version, copy)
        return copy

    def reader(self, param: torch.Tensor) -> Callable[[], None] | None:
        """Count one product that reads `param`'s copy in a graph being recorded; → what its backward calls once done
        with the copy, which goes back when the last such product is done (`hand_back`). None without `release` or
        outside grad mode (no backward will run)."""
        if self._pages is None or not torch.is_grad_enabled():
            return None
        self._readers[id(param)] = self._readers.get(id(param), 0) + 1
        return partial(self._read, param)

    def _read(self, param: torch.Tensor) -> None:
        self._readers[id(param)] -= 1
        if self._readers[id(param)] == 0:
            self.hand_back(param)

    def hand_back(self, param: torch.Tensor) -> None:
        """Give `param`'s copy's memory back to the kernel now (with `release`; else nothing); the next `cast` recasts it."""
        if self._pages is not None and id(param) in self._copies:
            self._pages.hand_back(param)
            self._copies[id(param)] = (None, self._copies[id(param)][1])
            self._handed_back = True

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Recast `optimizer`'s parameters after each of its steps, whether or not their version counters moved.

        AdamW's fused kernel (`adamw_torch_fused`, TRL's default optimizer) writes the parameters without moving
        their version counters, so the counters alone would keep a stale copy: the update and the sampler would
        multiply the weights of before the step, silently (tests/test_bf16.py, both optimizers).
        """
        def stale(opt, args, kwargs) -> None:
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) in self._copies:
                        self._copies[id(p)] = (None, self._copies[id(p)][1])  # recast at the next `cast`

        optimizer.register_step_post_hook(stale)

    def refresh(self) -> None:
        """Recast every parameter that changed (before the sampler reads the copies directly)."""
        for p in self._params:
            self.cast(p)

    def holds(self, model: nn.Module) -> bool:
        """Whether `model`'s parameters are the ones this copies (the policy, not a separate π_ref)."""
        first = next(model.parameters(), None)
        return first is not None and id(first) in self._copies

    def weight(self, param: torch.Tensor) -> torch.Tensor:
        """`param`'s copy for a product: through `_CastOnce` when it trains (the gradient reaches `param`), else the copy itself."""
        return _CastOnce.apply(param, self.cast(param), self.reader(param)) if param.requires_grad else self.cast(param)

    def linear_weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """{name: weight in `dtype`} for every `nn.Linear` weight of `model`, for `torch.func.functional_call(..., tie_weights=False)`.

        Every weight but the LM head's comes through `weight` (the gradient reaches
        the fp32 parameter). The head's is the copy itself, detached: the model's
        own head runs on zero positions (update/logprobs.py's `_last_hidden`; the
        chunked head takes the copy itself and gives the gradient), where autocast
        would still cast the whole (V, H) weight. With untied names (`tie_weights=False`)
        a tied input embedding keeps its fp32 weight.
        """
        head = model.get_output_embeddings()
        return {f"{name}.weight": self.cast(module.weight) if module is head else self.weight(module.weight)
                for name, module in model.named_modules() if isinstance(module, nn.Linear)}

    @staticmethod
    def input_embeddings(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor | None:
        """(B, L) token ids → (B, L, H) `model`'s input embedding rows (its fp32 weight, as the model looks them up), or None.

        The rows' gradient is added into the weight's `.grad` at the rows read (`_EmbeddingRows`), to
        the same values as autograd's dense gradient. None when the embedding is not a plain
        `nn.Embedding` (a subclass that scales, like Gemma's, or max_norm / scale_grad_by_freq / sparse):
        the model then looks its ids up itself.
        """
        embedding = model.get_input_embeddings()
        if type(embedding) is not nn.Embedding or embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
            return None
        return _EmbeddingRows.apply(input_ids, embedding.weight, embedding.padding_idx)


class _CastOnce(torch.autograd.Function):
    """forward(weight (fp32), copy (bf16), done or None) → copy; backward: the gradient widened to weight's dtype
    (autocast's ToCopyBackward), then `done()` (`WorkingCopy.reader`): it runs after every product that read this
    node's output, so the products of this graph are done with the copy."""

    @staticmethod
    def forward(ctx, weight, copy, done):
        ctx.dtype, ctx.done = weight.dtype, done
        return copy.detach()

    @staticmethod
    def backward(ctx, grad):
        if ctx.done is not None:
            ctx.done()
        return grad.to(ctx.dtype), None, None


class _Pages:
    """The copies' memory when they are handed back: one anonymous mapping, each parameter's copy in pages of its own.

    `madvise(MADV_DONTNEED)` on a copy's pages frees them at once, wherever malloc would have kept a freed block;
    the mapping stays, and the next write faults fresh pages in (read before that, they are zeros: `cast` recasts first).
    """

    def __init__(self, params: list[torch.Tensor], dtype: torch.dtype):
        if any(p.device.type != "cpu" for p in params):
            raise ValueError("WorkingCopy(release=True) hands CPU pages back; the parameters are on "
                             f"{sorted({str(p.device) for p in params})}: use release=False there.")
        size, offset = torch.finfo(dtype).bits // 8, 0
        self.spans: dict[int, tuple[int, int]] = {}  # id(param) → (offset, bytes), both whole pages
        for p in params:
            length = math.ceil(p.numel() * size / mmap.PAGESIZE) * mmap.PAGESIZE
            self.spans[id(p)] = (offset, length)
            offset += length
        self.map = mmap.mmap(-1, max(offset, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: its pages can go back
        self.dtype = dtype

    def tensor(self, param: torch.Tensor) -> torch.Tensor:
        """`param`'s copy: a (param.shape) `dtype` view of its pages."""
        if param.numel() == 0:
            return torch.empty(param.shape, dtype=self.dtype)
        offset, _ = self.spans[id(param)]
        return torch.frombuffer(self.map, dtype=self.dtype, count=param.numel(), offset=offset).view(param.shape)

    def hand_back(self, param: torch.Tensor) -> None:
        offset, length = self.spans[id(param)]
        if length:
            self.map.madvise(mmap.MADV_DONTNEED, offset, length)


class _EmbeddingRows(torch.autograd.Function):
    """forward(ids (B, L) int64, weight (V, H), padding_idx or None) → weight[ids] (B, L, H); backward: into weight.grad's rows.

    Backward sums each distinct id's token gradients in token order (as `F.embedding`'s dense
    backward does; the padding_idx row gets none, as there) and adds those sums into `.grad`'s rows:
    the values of autograd's dense gradient added to `.grad`, touching only the rows used.
    """

    @staticmethod
    def forward(ctx, ids, weight, padding_idx):
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx = weight, padding_idx
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        weight, ids, grad = ctx.weight, ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if ctx.padding_idx is not None:
            keep = ids != ctx.padding_idx
            ids, grad = ids[keep], grad[keep]
        used, inverse = torch.unique(ids, return_inverse=True)
        rows = torch.zeros(used.numel(), grad.shape[1], dtype=weight.dtype, device=grad.device).index_add_(0, inverse, grad)
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, used, rows)
        return None, None, None


def working_copy(policy: nn.Module, optimizer: torch.optim.Optimizer, *, bf16: bool, processes: int, release: bool = False,
                 before_recast: Callable[[], object] | None = None) -> WorkingCopy | None:
    """The policy's bf16 `WorkingCopy` where it applies (module docstring), else None (autocast casts at each product).

    Args:
        policy: the unwrapped policy; a peft model gets none.
        optimizer: the torch optimizer that updates `policy` (the copy recasts what it stepped: `WorkingCopy.watch`).
        bf16: the run's products in bf16 (precision.py).
        processes: the world size (more than one: none).
        release: hand the copies back in backward (`WorkingCopy`'s `release`) where the kernel frees pages on
            `madvise` (Linux); run/setup.bf16_working_copy asks for it under gradient checkpointing on a CPU with
            no rollout made beside the update (max_staleness None).
        before_recast: `WorkingCopy`'s.
    """
    if not bf16 or is_peft_model(policy) or processes > 1:
        return None
    working = WorkingCopy(policy, torch.bfloat16, release=release and sys.platform.startswith("linux"), before_recast=before_recast)
    working.watch(optimizer)
    return working
