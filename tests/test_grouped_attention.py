"""grouped_attention (update/grouped_attention.py): a shared-prompt packed row's attention without the dense mask.

The reference is torch's sdpa over the same row with packing.pack's dense (L, L) mask, in fp32.
"""

import pytest
import torch
import torch.nn.functional as F
from types import SimpleNamespace

from fastgrpo.model.checkpointing import attention_implementation
from fastgrpo.update import grouped_attention as ga
from fastgrpo.update import packing
from fastgrpo.model.experts import RouterAuxLoss
from fastgrpo.update.logprobs import LogProbs
from test_architectures import FAMILIES, family_model, padded_forward
from test_architectures import micro_batch as arch_micro_batch
from fastgrpo.update.packing import pack


def worked_example():
    # Prompts [7 8] (twice) and [9]; completions [1 2], [3], [4 5]: the row 7 8 1 2 3 9 4 5 (test_logprobs' example).
    return SimpleNamespace(
        prompt_ids=torch.tensor([[7, 8], [7, 8], [0, 9]]), prompt_mask=torch.tensor([[1, 1], [1, 1], [0, 1]]),
        completion_ids=torch.tensor([[1, 2], [3, 0], [4, 5]]), completion_mask=torch.tensor([[1, 1], [1, 0], [1, 1]]),
    )


def ragged(seed=0, groups=3, G=3, P=6, T=7):
    """`groups` prompts of unequal lengths, G completions each of unequal lengths (one of a single token)."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(1, 500, (groups, P), generator=g).repeat_interleave(G, 0)
    prompt_mask = (torch.arange(P)[None] >= torch.tensor([0, 2, 5])[:groups, None]).long().repeat_interleave(G, 0)  # 6, 4, 1 tokens
    lengths = torch.randint(1, T + 1, (groups * G,), generator=g)
    lengths[1] = 1
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return SimpleNamespace(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                           completion_ids=torch.randint(1, 500, (groups * G, T), generator=g), completion_mask=completion_mask)


@pytest.fixture
def always_grouped(monkeypatch):
    """pack(grouped=True) gives the layout whatever its cost (the rule, use_layout, is tested on its own)."""
    monkeypatch.setattr(packing, "use_layout", lambda layout, length: True)


def test_layout_worked_by_hand(always_grouped):
    mb = worked_example()
    row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=True)
    assert row.attention_mask is None and row.input_ids.tolist() == [[7, 8, 1, 2, 3, 9, 4, 5]]
    # Pieces: prompts [7 8] at 0 and [9] at 5; completions [1 2] at 2 and [3] at 4 (prompt [7 8]), [4 5] at 6 (prompt [9]).
    # Own pairs (queries × keys): [1 2] 2 × 4, [4 5] 2 × 3, [3] 1 × 3, [7 8] 2 × 2, [9] 1 × 1. Sorted by keys, then
    # queries, and batched while no piece is padded to more than twice its pairs: {[1 2], [4 5]} padded to 2 × (2 + 2);
    # [3] would be padded from 3 to 8 pairs, so each of the rest is a batch of its own.
    batches = row.layout.batches
    assert [b.query.tolist() for b in batches] == [[[2, 3], [6, 7]], [[4]], [[0, 1]], [[5]]]
    assert [b.key.tolist() for b in batches] == [[[0, 1, 2, 3], [5, 0, 6, 7]], [[0, 1, 4]], [[0, 1]], [[5]]]
    assert batches[0].mask.tolist() == [
        [[True, True, True, False], [True, True, True, True]],  # [1 2] sees 7 8, then itself causally
        [[True, False, True, False], [True, False, True, True]],  # [4 5] sees 9 (not the padding), then itself
    ]
    assert [b.mask.tolist() for b in batches[1:]] == [[[[True, True, True]]], [[[True, False], [True, True]]], [[[True]]]]
    # Output slots in batch order: positions 2 3 6 7 | 4 | 0 1 | 5 → slots 0 1 2 3 | 4 | 5 6 | 7.
    assert row.layout.order.tolist() == [5, 6, 0, 1, 4, 7, 2, 3]
    assert row.layout.pairs == 2 * 2 * 4 + 3 + 4 + 1  # 24
    assert not ga.use_layout(row.layout, 8)  # over a quarter of the dense mask's 64: pack keeps the mask for so short a row


def test_uneven_pieces_are_batched_by_length_and_a_skewed_row_keeps_the_dense_mask():
    # 8 completions of 3 tokens and one of 40 after one 4-token prompt: padding the short ones to 40 would cost
    # 9 × 40 × 44 pairs; batched by length, the long one is alone and the rest (prompt included) pad to 4 × (4 + 4).
    completions = [(4, 40, 0)] + [(44 + 3 * i, 3, 0) for i in range(8)]
    layout = ga.build_layout([(0, 4)], completions, 68, "cpu")
    assert [tuple(b.mask.shape) for b in layout.batches] == [(1, 40, 44), (9, 4, 8)]
    assert layout.pairs == 40 * 44 + 9 * 32 and not ga.use_layout(layout, 68)  # 2048 > 68² / 4
    # Eight 40-token completions of one prompt: 8 × 40 × 44 + 4 × 4 = 14 096 pairs ≤ 324² / 4.
    assert ga.use_layout(ga.build_layout([(0, 4)], [(4 + 40 * i, 40, 0) for i in range(8)], 324, "cpu"), 324)
    # One completion much longer than the rest of its row: its own pairs exceed half of L², so pack keeps the dense mask.
    mb = SimpleNamespace(prompt_ids=torch.tensor([[7, 8], [7, 8]]), prompt_mask=torch.ones(2, 2, dtype=torch.long),
                         completion_ids=torch.arange(1, 25).view(2, 12), completion_mask=torch.tensor([[1] * 12, [1] + [0] * 11]))
    row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=True)
    assert row.layout is None and row.attention_mask is not None  # 12 × 14 + 1 × 3 + 2 × 2 = 175 pairs > 15² / 4
    # A batch is capped in pairs: 8 equal completions at a cap of 2 pieces' pairs make batches of 2.
    capped = ga.build_layout([(0, 4)], [(4 + 5 * i, 5, 0) for i in range(8)], 44, "cpu", batch_pairs=2 * 5 * 9)
    assert [b.query.shape[0] for b in capped.batches] == [2, 2, 2, 2, 1]


def attention_inputs(L, heads=6, kv_heads=2, dim=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, n, L, dim, generator=g).to(dtype).requires_grad_() for n in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("seed,batch_pairs,value_dim", [(0, ga.BATCH_PAIRS, 8), (1, ga.BATCH_PAIRS, 8), (2, 30, 8), (3, ga.BATCH_PAIRS, 5)])
def test_values_and_gradients_equal_sdpa_with_the_dense_mask(seed, batch_pairs, value_dim, always_grouped, monkeypatch):
    # batch_pairs 30: one piece per batch; value_dim 5: MLA's value heads narrower than its query/key heads (DeepSeek-V3).
    monkeypatch.setattr(ga, "BATCH_PAIRS", batch_pairs)
    mb = ragged(seed)
    dense = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True)
    grouped = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=True)
    assert all(b.mask.numel() <= batch_pairs for b in grouped.layout.batches if len(b.query) > 1)
    L = dense.input_ids.shape[1]
    q, k, v = attention_inputs(L, seed=seed)
    v = v[..., :value_dim].detach().requires_grad_()
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    out, weights = ga.grouped_attention(module, q, k, v, None, scaling=0.3, attention_layout=grouped.layout)
    rep = 3
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=dense.attention_mask, scale=0.3).transpose(1, 2)
    assert weights is None and out.shape == (1, L, 6, value_dim)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(9))
    for got, want in zip(torch.autograd.grad((out * grad).sum(), (q, k, v)), torch.autograd.grad((expected * grad).sum(), (q, k, v))):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)  # a prompt's keys: the sum over its completions' reads


def test_bf16_inputs_are_attended_in_fp32_and_rounded_once(always_grouped):
    mb = ragged()
    row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=True)
    q, k, v = attention_inputs(row.input_ids.shape[1], dtype=torch.bfloat16)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast would make the products bf16: grouped_attention turns it off
        out, _ = ga.grouped_attention(module, q, k, v, None, attention_layout=row.layout)
    wide, _ = ga.grouped_attention(module, q.float(), k.float(), v.float(), None, attention_layout=row.layout)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, wide.to(torch.bfloat16))


def test_without_a_layout_it_refuses_to_attend_over_the_whole_row():
    # A layer that drops keywords (or another thread's forward while a pass has switched the model) would otherwise
    # attend causally across every completion and group of the packed row: an error, not wrong log-probs.
    q, k, v = attention_inputs(5)
    with pytest.raises(RuntimeError, match="without the packed row's layout"):
        ga.grouped_attention(SimpleNamespace(num_key_value_groups=3), q, k, v, None)


def test_refusals(always_grouped):
    mb = worked_example()
    row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=True)
    q, k, v = attention_inputs(8)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    with pytest.raises(ValueError, match="dropout 0.1"):
        ga.grouped_attention(module, q, k, v, None, dropout=0.1, attention_layout=row.layout)
    with pytest.raises(ValueError, match="sliding_window"):
        ga.grouped_attention(module, q, k, v, None, sliding_window=4, attention_layout=row.layout)
    with pytest.raises(ValueError, match="cover 3 positions, not each of the row's 4 once"):
        ga.build_layout([(0, 2)], [(3, 1, 0)], 4, "cpu")  # position 2 in no piece


def test_log_probs_run_it_for_sdpa_and_restore_the_models_attention(make_model, monkeypatch, always_grouped):
    calls = []
    real = ga._GroupedAttention.apply
    monkeypatch.setattr(ga._GroupedAttention, "apply", lambda *a: calls.append(1) or real(*a))
    mb = worked_example()
    model = make_model()
    log_probs = LogProbs(1.0)
    log_probs(model, mb)  # the first pass of a model class also measures grouped_support
    calls.clear()
    log_probs(model, mb)
    assert len(calls) == model.config.num_hidden_layers and model.config._attn_implementation == "sdpa"
    calls.clear()
    LogProbs(1.0, share_prompts=False)(model, mb)  # unshared rows: transformers' own sdpa over the packed row
    LogProbs(1.0, grouped_attention=False)(model, mb)  # switched off: sdpa over the dense mask
    assert not calls
    model.gradient_checkpointing_enable()  # its recomputed forward runs after the pass: the dense mask then
    model.train()
    LogProbs(1.0)(model, mb)
    assert not calls and model.config._attn_implementation == "sdpa"


def test_a_failed_forward_leaves_the_models_attention_as_it_was(make_model):
    model = make_model()
    with pytest.raises(RuntimeError, match="boom"):
        with attention_implementation(model, ga.IMPLEMENTATION):
            assert model.config._attn_implementation == ga.IMPLEMENTATION
            raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"


def padded_logps(model, mb):
    ids, mask = torch.cat([mb.prompt_ids, mb.completion_ids], 1), torch.cat([mb.prompt_mask, mb.completion_mask], 1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    T = mb.completion_ids.shape[1]
    return torch.log_softmax(logits[:, -T - 1 : -1].float(), -1).gather(-1, mb.completion_ids[..., None])[..., 0] * mb.completion_mask


@pytest.mark.parametrize("config_class", ["StableLmConfig", "NemotronConfig", "FalconConfig"])
def test_a_model_whose_layers_do_not_pass_the_layout_on_keeps_the_dense_mask(tokenizer, config_class, always_grouped):
    # StableLM's and Nemotron's decoder layers drop attention keywords; Falcon tests for "sdpa" by name (transformers
    # 5.19). grouped_support measures it once per class, and LogProbs keeps the dense mask: the padded forward's values.
    import transformers

    own = {"NemotronConfig": {"head_dim": 16}, "FalconConfig": {"new_decoder_architecture": True, "num_kv_heads": 2}}.get(config_class, {})
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, intermediate_size=128, **own)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    assert packing.grouped_support(model) is not None and model.config._attn_implementation == "sdpa"
    mb = ragged()
    with torch.no_grad():
        torch.testing.assert_close(LogProbs(1.0)(model, mb).logps, padded_logps(model, mb), atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", ["attention_dropout", "attn_pdrop"])
def test_attention_dropout_in_training_keeps_the_dense_mask(make_model, monkeypatch, name, always_grouped):
    calls = []
    real = ga._GroupedAttention.apply
    monkeypatch.setattr(ga._GroupedAttention, "apply", lambda *a: calls.append(1) or real(*a))
    model = make_model()
    setattr(model.config, name, 0.1)
    model.train()
    LogProbs(1.0)(model, worked_example())
    assert not calls
    model.eval()
    LogProbs(1.0)(model, worked_example())
    assert calls


def test_a_row_without_completion_tokens_packs():
    mb = worked_example()
    mb.completion_mask = torch.tensor([[1, 1], [0, 0], [1, 1]])
    for grouped in (False, True):
        row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=grouped)
        assert row.input_ids.tolist() == [[7, 8, 1, 2, 9, 4, 5]] and row.rows.tolist() == [0, 0, 2, 2]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_that_shares_prompts_gives_the_padded_forwards_log_probs_and_the_dense_masks_gradients(tokenizer, name, always_grouped):
    model = family_model(name, tokenizer)
    mb = arch_micro_batch(tokenizer)
    aux = RouterAuxLoss.from_config(None, model.config).enabled
    with torch.no_grad():
        expected = padded_forward(model.eval(), mb)[0]
    model.train()
    weights = torch.randn(mb.completion_ids.shape, generator=torch.Generator().manual_seed(0))
    grads = []
    for grouped in (True, False):
        model.zero_grad()
        stats = LogProbs(1.0, router_aux_loss=aux, grouped_attention=grouped)(model, mb)
        if grouped:
            torch.testing.assert_close(stats.logps, expected, atol=2e-5, rtol=0)
        (stats.logps * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for n, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][n], atol=1e-5, rtol=1e-4)


def test_the_built_in_model_runs_grouped_attention():
    # Measured on the real SmolLM2 (30 layers, logits ≈ 30): fp32 summation order alone moves its logits by ≈ 2e-4,
    # which a fixed absolute tolerance once mistook for a leak and kept the dense mask.
    from transformers import AutoModelForCausalLM

    from fastgrpo.model.loading import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("smollm2-135m-instruct"), attn_implementation="sdpa")
    assert packing.grouped_support(model) is None
