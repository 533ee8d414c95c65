"""Packed, prompt-shared, chunked log-prob passes (logprobs.py) against the padded computation they replace.

The reference is the padded forward the trainer used before: left-padded prompts,
right-padded completions, a 2D attention mask, position ids from its cumsum, full
(B, T, V) logits / τ, and losses.py's unchunked helpers. Every comparison is fp32
on the tiny random Llama (tied embeddings, so the head's gradient lands on the
embedding too).
"""

from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastgrpo.update.chunked_head import ChunkedHead, Scratch, add_weight_grad
from fastgrpo.update.logprobs import LogProbs, chunkable_head, fallback_notices
from fastgrpo.update.packing import pack, sharing_support
from fastgrpo.algo.losses import LOSS_TYPES, StepCounts, entropy_from_logits, grpo_loss, high_entropy_mask, kl_full, selective_log_softmax

TAU = 0.7


def micro_batch(seed=1, B=4, P=5, T=6):
    """Two groups of two completions (rows 0–1 and 2–3 share a prompt), ragged prompts and completions."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, 1000, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[2:, :2] = 0  # the second prompt is 3 tokens, left-padded
    prompt_ids[1], prompt_ids[3] = prompt_ids[0], prompt_ids[2]
    completion_ids = torch.randint(0, 1000, (B, T), generator=g)
    completion_mask = torch.ones(B, T, dtype=torch.long)
    completion_mask[1, 3:] = 0
    completion_mask[3, 1:] = 0  # a one-token completion
    return SimpleNamespace(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, completion_mask=completion_mask)


def padded(model, mb):
    """(logps, entropy, logits) from the padded batch, as trainer._logps computed them before packing."""
    ids = torch.cat([mb.prompt_ids, mb.completion_ids], 1)
    attention = torch.cat([mb.prompt_mask, mb.completion_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    T = mb.completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=T + 1).logits[:, :-1] / TAU
    return selective_log_softmax(logits, mb.completion_ids), entropy_from_logits(logits), logits


def test_pack_layout_worked_by_hand():
    # Prompts [7 8] (twice) and [9]; completions [1 2], [3], [4 5]. Shared layout:
    #   ids       7 8 1 2 3 9 4 5
    #   positions 0 1 2 3 2 0 1 2
    # Token 0 of a completion is predicted by its prompt's last token (index 1 or 5),
    # later tokens by the token before them: sources [1 2 | 1 | 5 6].
    mb = SimpleNamespace(
        prompt_ids=torch.tensor([[7, 8], [7, 8], [0, 9]]), prompt_mask=torch.tensor([[1, 1], [1, 1], [0, 1]]),
        completion_ids=torch.tensor([[1, 2], [3, 0], [4, 5]]), completion_mask=torch.tensor([[1, 1], [1, 0], [1, 1]]),
    )
    row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True)
    assert row.input_ids.tolist() == [[7, 8, 1, 2, 3, 9, 4, 5]]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 2, 0, 1, 2]]
    assert row.source.tolist() == [1, 2, 1, 5, 6]
    assert row.labels.tolist() == [1, 2, 3, 4, 5]
    assert (row.rows.tolist(), row.cols.tolist()) == ([0, 0, 1, 2, 2], [0, 1, 0, 0, 1])
    mask = row.attention_mask[0, 0]
    assert mask[4].tolist() == [True, True, False, False, True, False, False, False]  # completion 2 sees its prompt, not completion 1
    assert mask[7].tolist() == [False] * 5 + [True] * 3  # nothing of the first group
    assert (row.padded_tokens, row.real_tokens) == (3 * 4, 10)  # real: prompts 2 + 2 + 1, completions 2 + 1 + 2
    # Unshared: every completion has its own prompt copy; transformers' mask comes from the positions.
    plain = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=False)
    assert plain.input_ids.tolist() == [[7, 8, 1, 2, 7, 8, 3, 9, 4, 5]] and plain.attention_mask is None
    assert plain.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("share", [False, True])
def test_logps_and_entropy_equal_the_padded_pass(make_model, attention, share):
    model = make_model()
    model.config._attn_implementation = attention
    mb = micro_batch()
    logps, entropy, _ = padded(model, mb)
    stats = LogProbs(TAU, share_prompts=share, chunk=3)(model, mb)
    mask = mb.completion_mask.bool()
    torch.testing.assert_close(stats.logps[mask], logps[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(stats.entropy[mask], entropy[mask], atol=1e-4, rtol=1e-6)  # H ≈ ln 49 152 ≈ 10.8 nats
    assert (stats.logps[~mask] == 0).all() and (stats.entropy[~mask] == 0).all()
    # 4 × (5 + 6) = 44 padded; real: prompts 5+5+3+3 and completions 6+3+6+1 = 32; shared: two prompts fewer (5 + 3).
    assert (stats.padded_tokens, stats.real_tokens, stats.packed_tokens) == (44, 32, 24 if share else 32)


OPTIONS = [(loss_type, {}) for loss_type in LOSS_TYPES] + [
    ("dapo", {"beta": 0.1, "kl_estimator": "full"}),
    ("grpo", {"beta": 0.1, "kl_estimator": "k3"}),
    ("dapo", {"importance_sampling_level": "sequence"}),
    ("bnpo", {"top_entropy_quantile": 0.5}),
    ("grpo", {"entropy_coef": 0.1, "top_entropy_quantile": 0.5}),  # the entropy bonus: H's gradient through the chunked head
]


@pytest.mark.parametrize("loss_type,options", OPTIONS, ids=[f"{t}-{'-'.join(map(str, o.values()))}" for t, o in OPTIONS])
def test_loss_and_gradients_equal_padded_packed_and_shared(make_model, loss_type, options):
    beta, estimator = options.get("beta", 0.0), options.get("kl_estimator")
    ref_model = make_model(seed=1) if beta > 0 else None
    if ref_model is not None:
        with torch.no_grad():
            ref_model.lm_head.weight.mul_(10)  # as peaky as the policy below
    mb = micro_batch()
    mask = mb.completion_mask.float()
    counts = StepCounts(float(mask.sum()), 4, 1, 6)
    advantages = torch.tensor([1.0, -0.5, 0.8, -1.2])

    def run(logps, entropy, kl, ref_logps, old):
        per_token_kl = None
        if beta > 0:
            per_token_kl = kl if estimator == "full" else torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        policy_mask = high_entropy_mask(entropy.detach(), mask, options.get("top_entropy_quantile", 1.0))
        coef = options.get("entropy_coef", 0.0)
        return grpo_loss(
            logps, old, advantages, mask, counts, loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=beta,
            importance_sampling_level=options.get("importance_sampling_level", "token"), per_token_kl=per_token_kl, policy_mask=policy_mask,
            entropy=entropy if coef else None, entropy_coef=coef,
        ).loss

    results = []
    for mode in ("padded", "packed", "shared"):
        model = make_model()
        with torch.no_grad():  # a peakier head: entropies spread over nats, so the top-entropy ranks are not rounding ties
            model.lm_head.weight.mul_(10)
        if mode == "padded":
            logps, entropy, logits = padded(model, mb)
            kl = ref_logps = None
            if ref_model is not None:
                with torch.no_grad():
                    ref_logps, _, ref_logits = padded(ref_model, mb)
                kl = kl_full(logits, ref_logits)
        else:
            log_probs = LogProbs(TAU, share_prompts=mode == "shared", chunk=4, entropy_grad="entropy_coef" in options)
            stats = log_probs(model, mb, (lambda: nullcontext(ref_model)) if estimator == "full" else None)
            logps, entropy, kl = stats.logps, stats.entropy, stats.kl
            ref_logps = None if ref_model is None else LogProbs(TAU)(ref_model, mb).logps.detach()
        # π_old a little off π_θ so ratios leave the clip range both ways (deterministic perturbation).
        old = (logps.detach() + 0.3 * torch.sin(torch.arange(24.0)).view(4, 6)) * mask
        loss = run(logps, entropy, kl, ref_logps, old)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_pad, grads_pad) = results[0]
    for loss, grads in results[1:]:
        # rtol: k3's exp(log q − log p) turns the log-probs' fp32 rounding (≈ 1e-6 of peaky logits) into ≈ 3e-6 of a loss of 8
        torch.testing.assert_close(loss, loss_pad, atol=1e-5, rtol=1e-5)
        for name, grad in grads.items():
            # atol from the gradient's scale: fp32 sums' rounding grows with their terms. The tied embedding's gradient (max 2–3.3
            # in the peaky cases) differs by up to 1.2e-5 of its max with an AVX2-only CPU's kernels, over a fixed 1e-5 there.
            atol = max(1e-5, 2e-5 * float(grads_pad[name].abs().max()))
            torch.testing.assert_close(grad, grads_pad[name], atol=atol, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    assert grads_pad["model.embed_tokens.weight"].abs().sum() > 0  # tied head: its gradient is on the embedding


def test_kl_full_equals_unchunked_and_is_zero_against_itself(make_model):
    model, ref_model, mb = make_model(), make_model(seed=1), micro_batch()
    mask = mb.completion_mask.bool()
    _, _, logits = padded(model, mb)
    with torch.no_grad():
        _, _, ref_logits = padded(ref_model, mb)
    stats = LogProbs(TAU, chunk=5)(model, mb, lambda: nullcontext(ref_model))
    torch.testing.assert_close(stats.kl[mask], kl_full(logits, ref_logits)[mask], atol=1e-5, rtol=1e-5)
    same = LogProbs(TAU)(model, mb, lambda: nullcontext(make_model()))  # π_ref = π_θ (same seed): KL exactly 0 up to fp32 rounding
    assert same.kl.abs().max() < 1e-5


def test_no_saved_tensor_spans_the_vocabulary(make_model):
    # What autograd keeps for backward: nothing of shape (·, V) but the head weight itself, (V, H) or its transpose
    # (with head_keep_bytes=0, the memory-first setting; else the head keeps its own (n, V) softmax, tested below).
    model, mb = make_model(), micro_batch()
    V, H = model.config.vocab_size, model.config.hidden_size
    shapes = []

    def keep(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        LogProbs(TAU, chunk=4, head_keep_bytes=0)(model, mb).logps.sum().backward()
    assert (V, H) in shapes
    assert [s for s in shapes if V in s and s not in ((V, H), (H, V))] == []


def test_chunked_head_gradient_matches_autograd_in_float64():
    # Small vocabulary: dlogp/dz = onehot − p, the KL term's p (log p − log q − KL) and the
    # entropy's −p (log p + H), checked against autograd.
    torch.manual_seed(0)
    n, H, V = 7, 5, 11
    hidden, weight, bias = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in [(n, H), (V, H), (V,)])
    ref_hidden, ref_weight = torch.randn(n, H, dtype=torch.float64), torch.randn(V, H, dtype=torch.float64)
    labels = torch.randint(0, V, (n,))
    g1, g2, g3 = (torch.randn(n, dtype=torch.float64) for _ in range(3))
    logps, entropy, kl = ChunkedHead.apply(hidden, weight, bias, labels, 0.5, ref_hidden, ref_weight, None, 3, True)
    ((logps * g1).sum() + (kl * g2).sum() + (entropy * g3).sum()).backward()
    chunked = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    logp = torch.log_softmax((hidden @ weight.T + bias) / 0.5, -1)
    ref_logp = torch.log_softmax(ref_hidden @ ref_weight.T / 0.5, -1)
    kl_ref = (logp.exp() * (logp - ref_logp)).sum(-1)
    entropy_ref = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(entropy, entropy_ref.detach(), atol=1e-12, rtol=0)
    ((logp.gather(-1, labels[:, None]).squeeze(-1) * g1).sum() + (kl_ref * g2).sum() + (entropy_ref * g3).sum()).backward()
    for got, want in zip(chunked, (hidden.grad, weight.grad, bias.grad)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_the_head_adds_its_bf16_weight_gradient_into_grad_as_autograd_accumulates_it():
    # With a bf16 weight copy (the working copy's rule) the head's (V, H) gradient goes straight into weight.grad,
    # chunk by chunk, through blocks kept from call to call; autograd's path returns the chunks' fp32 sum. One
    # micro-batch: bit for bit (c1, then + c2, then + c3 either way); a second one to fp32 summation order.
    torch.manual_seed(0)
    n, H, V = 7, 5, 11
    weight = torch.randn(V, H, requires_grad=True)
    batches = [(torch.randn(n, H, requires_grad=True), torch.randint(0, V, (n,)), torch.randn(n)) for _ in range(2)]
    grads, scratch = [], Scratch()
    for into_grad in (False, True):
        weight.grad = None
        for number, (hidden, labels, g) in enumerate(batches):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                copy = weight.detach().to(torch.bfloat16) if into_grad else None
                logps, _, _ = ChunkedHead.apply(hidden, weight, None, labels, 0.7, None, None, None, 3, False, copy, scratch if into_grad else None)
            (logps * g).sum().backward()
            grads.append(weight.grad.clone())
    (one, two), (one_into, two_into) = grads[:2], grads[2:]
    assert torch.equal(one_into, one)
    torch.testing.assert_close(two_into, two, rtol=1e-6, atol=1e-7)
    assert not torch.equal(two, one)


def test_add_weight_grad_adds_the_whole_product_slice_by_slice():
    # V = 11 rows in slices of 4, 4, 3 through one kept block: the sum of the products grad_zᵀ h, added into .grad.
    # Small integers: every product and sum is exact, so any CPU's summation order gives these values.
    torch.manual_seed(0)
    weight, scratch = torch.zeros(11, 3, requires_grad=True), Scratch()
    grad_z, hidden = torch.randint(-4, 5, (5, 11)).float(), torch.randint(-4, 5, (5, 3)).float()
    add_weight_grad(weight, grad_z, hidden, scratch, rows=4)
    assert torch.equal(weight.grad, grad_z.T @ hidden) and weight.grad.abs().sum() > 0  # each slice: the whole product's rows
    add_weight_grad(weight, 2 * grad_z, hidden, scratch, rows=4)
    assert torch.equal(weight.grad, 3 * (grad_z.T @ hidden))


def test_frozen_head_gets_no_gradient_and_the_body_the_same_one(make_model):
    # LoRA-style: the tied embedding/head frozen. The body's gradients are unchanged; the head's is skipped (None).
    mb = micro_batch()
    grads = []
    for freeze in (False, True):
        model = make_model()
        model.lm_head.weight.requires_grad_(not freeze)
        (LogProbs(TAU, chunk=4)(model, mb).logps * mb.completion_mask).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[1]["model.embed_tokens.weight"] is None
    for name, grad in grads[1].items():
        if grad is not None:
            torch.testing.assert_close(grad, grads[0][name], atol=1e-6, rtol=1e-5)


def test_fallbacks_are_named_and_give_the_same_logps(make_model):
    model, mb = make_model(), micro_batch()
    assert sharing_support(model) is None and chunkable_head(model) is None and fallback_notices(model) == []
    model.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in sharing_support(model)
    model.config._attn_implementation = "sdpa"
    model.config.sliding_window = 16
    assert "sliding" in sharing_support(model)
    # Llama separates packed sequences by their position ids (packing_support runs it): packed rows, no shared prompt
    assert fallback_notices(model) == ["prompts are not shared between a group's completions (llama has sliding-window attention (sliding_window=16)); packing only."]
    model.config.sliding_window = None
    # A logit transform after the head: the model's own head runs (Llama ignores the field, so values must agree).
    model.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in chunkable_head(model)
    logps, _, _ = padded(model, mb)
    mask = mb.completion_mask.bool()
    torch.testing.assert_close(LogProbs(TAU)(model, mb).logps[mask], logps[mask], atol=1e-5, rtol=0)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="temperature=0"):
        LogProbs(0.0)
    with pytest.raises(ValueError, match="chunk=0"):
        LogProbs(1.0, chunk=0)
    with pytest.raises(ValueError, match="one B"):
        pack(torch.ones(2, 3), torch.ones(2, 3), torch.ones(3, 4), torch.ones(3, 4), share_prompts=True)


def test_trainer_logs_what_packing_removed(tmp_path, tokenizer, make_model, prompts):
    # per_device_train_batch_size 4 = G: each micro-batch is one group, so 3 of its 4 prompt copies are shared away.
    from fastgrpo import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=4,
        max_prompt_length=32, max_completion_length=8, max_steps=1, learning_rate=1e-3, logging_steps=1, disable_tqdm=True,
    )
    trainer = GRPOTrainer(make_model(), lambda completion_ids, **kw: [float(len(c)) for c in completion_ids], args=args,
                          train_dataset=prompts, processing_class=tokenizer)
    trainer.train()
    record = trainer.state.log_history[0]
    # Real tokens: 4 copies of one prompt of p tokens + completions c; packed: p + c. So 1 − packed/real = 3p / (4p + c) > 0.
    assert 0.0 <= record["pad_fraction"] < 1.0
    assert 0.0 < record["shared_prompt_fraction"] < 0.75


def test_gradient_checkpointing_gives_the_same_gradients(make_model):
    # The decoder hook that keeps the last hidden states fires once per forward, also when layers are recomputed.
    mb = micro_batch()
    grads = []
    for checkpointing in (False, True):
        model = make_model()
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        (LogProbs(TAU, chunk=4)(model, mb).logps * mb.completion_mask).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[1].items():
        torch.testing.assert_close(grad, grads[0][name], atol=1e-6, rtol=1e-5)


class _VocabularyProducts(TorchDispatchMode):
    """Counts the matrix products whose output has `V` columns: the head's logits (c, V)."""

    def __init__(self, V):
        super().__init__()
        self.V, self.count = V, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out, torch.ops.aten.addmm.default) and out.shape[-1] == self.V:
            self.count += 1
        return out


@pytest.mark.parametrize("bf16", [False, True])
def test_kept_softmax_gives_the_recomputing_heads_values_bit_for_bit(bf16):
    # The kept p path writes ∂/∂z = g (onehot − p) straight in the product dtype; the recomputing path makes it in
    # fp32 and narrows it: the same fp32 operations and one rounding, so every output and gradient is equal, and
    # backward runs no (c, V) product (the logits are not made again). 7 tokens in chunks of 3: 3 head products
    # in forward either way, 3 more in backward only when recomputing.
    torch.manual_seed(0)
    n, H, V = 7, 5, 11
    weight, labels, g = torch.randn(V, H), torch.randint(0, V, (n,)), torch.randn(n)
    hidden = torch.randn(n, H)
    results = []
    for keep_bytes in (0, n * V * 4):
        w, h = weight.clone().requires_grad_(), hidden.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), _VocabularyProducts(V) as products:
            logps, entropy, _ = ChunkedHead.apply(h, w, None, labels, TAU, None, None, None, 3, False, None, Scratch(), None, keep_bytes)
            forward = products.count
            (logps * g).sum().backward()
        results.append((logps, entropy, h.grad, w.grad, forward, products.count - forward))
    (*recomputed, f0, b0), (*kept, f1, b1) = results
    for a, b in zip(recomputed, kept):
        assert torch.equal(a, b)
    assert (f0, b0, f1, b1) == (3, 3, 3, 0)
    assert recomputed[2].abs().sum() > 0 and recomputed[3].abs().sum() > 0


def test_kept_softmax_only_within_its_budget_and_only_where_backward_needs_p_alone():
    # One byte short of the (n, V) fp32 block, with π_ref (the KL reads log p too) or with the entropy's gradient
    # (the same): backward recomputes (3 more head products for 7 tokens in chunks of 3, 6 with π_ref's).
    torch.manual_seed(0)
    n, H, V = 7, 5, 11
    weight, labels, hidden, ref_hidden = torch.randn(V, H, requires_grad=True), torch.randint(0, V, (n,)), torch.randn(n, H), torch.randn(n, H)
    cases = {"short": (None, False, n * V * 4 - 1, 3), "reference": (ref_hidden, False, 2**30, 6), "entropy": (None, True, 2**30, 3)}
    for name, (ref, entropy_grad, keep_bytes, recomputed) in cases.items():
        with _VocabularyProducts(V) as products:
            logps, entropy, kl = ChunkedHead.apply(hidden, weight, None, labels, TAU, ref, None if ref is None else weight.detach(), None, 3,
                                                   entropy_grad, None, Scratch(), None, keep_bytes)
            forward = products.count
            (logps.sum() + kl.sum() + (entropy.sum() if entropy_grad else 0)).backward()
        assert products.count - forward == recomputed, name


def test_kept_softmax_is_lent_to_one_graph_at_a_time(make_model):
    # Two micro-batches' graphs recorded before either backward (one Scratch, as a LogProbs keeps): the second
    # recomputes rather than overwrite the first's kept p, so each gradient is its own graph's, as with nothing kept.
    model, mbs = make_model(), [micro_batch(seed) for seed in (1, 2)]
    grads = []
    for keep in (0, 2**30):
        log_probs = LogProbs(TAU, chunk=4, head_keep_bytes=keep)
        model.zero_grad(set_to_none=True)
        first, second = (log_probs(model, mb).logps for mb in mbs)
        (first * mbs[0].completion_mask).sum().backward()
        (3 * second * mbs[1].completion_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        third = log_probs(model, mbs[0]).logps  # after both backwards the block is free again: kept and right
        model.zero_grad(set_to_none=True)
        (third * mbs[0].completion_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[2][name], grads[0][name], atol=1e-6, rtol=1e-5)
        assert torch.equal(grads[3][name], grads[1][name])
