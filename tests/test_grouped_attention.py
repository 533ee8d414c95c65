"""grouped_attention (update/grouped_attention.py): a shared-prompt packed row's attention without the dense mask.

The reference is torch's sdpa over the same row with packing.pack's dense (L, L) mask, in fp32.
"""

import pytest
import torch
import torch.nn.functional as F
from types import SimpleNamespace
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from fastgrpo.update import grouped_attention as ga
from fastgrpo.update.logprobs import LogProbs
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


def test_layout_worked_by_hand():
    mb = worked_example()
    row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=True)
    layout = row.layout
    assert row.attention_mask is None and row.input_ids.tolist() == [[7, 8, 1, 2, 3, 9, 4, 5]]
    # Prompt pieces: positions 0–1 and 5 (padded with 0); causal; the padded query of the 1-token prompt sees key 0 only.
    assert layout.prompts.query.tolist() == [[0, 1], [5, 0]]
    assert layout.prompts.mask.tolist() == [[[True, False], [True, True]], [[True, False], [True, False]]]
    # Completion pieces: queries 2–3, 4, 6–7; keys = their prompt's positions (padded to 2), then their own.
    assert layout.completions.query.tolist() == [[2, 3], [4, 0], [6, 7]]
    assert layout.completions.key.tolist() == [[0, 1, 2, 3], [0, 1, 4, 0], [5, 0, 6, 7]]
    assert layout.completions.mask.tolist() == [
        [[True, True, True, False], [True, True, True, True]],  # [1 2] sees 7 8, then itself causally
        [[True, True, True, False], [True, False, False, False]],  # [3]; its padded query sees key 0 only
        [[True, False, True, False], [True, False, True, True]],  # [4 5] sees 9 (not the padding), then itself
    ]
    # Output slots: prompts 2 × 2 (0–3), completions from 4 in rows of 2: positions 2 3 | 4 | 6 7 → slots 4 5 | 6 | 8 9.
    assert layout.order.tolist() == [0, 1, 4, 5, 6, 2, 8, 9]


def attention_inputs(L, heads=6, kv_heads=2, dim=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, n, L, dim, generator=g).to(dtype).requires_grad_() for n in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("seed", [0, 1])
def test_values_and_gradients_equal_sdpa_with_the_dense_mask(seed):
    mb = ragged(seed)
    dense = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True)
    grouped = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=True)
    L = dense.input_ids.shape[1]
    q, k, v = attention_inputs(L, seed=seed)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    out, weights = ga.grouped_attention(module, q, k, v, None, scaling=0.3, attention_layout=grouped.layout)
    rep = 3
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=dense.attention_mask, scale=0.3).transpose(1, 2)
    assert weights is None and out.shape == (1, L, 6, 8)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(9))
    for got, want in zip(torch.autograd.grad((out * grad).sum(), (q, k, v)), torch.autograd.grad((expected * grad).sum(), (q, k, v))):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)  # a prompt's keys: the sum over its completions' reads


def test_bf16_inputs_are_attended_in_fp32_and_rounded_once():
    mb = ragged()
    row = pack(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask, share_prompts=True, grouped=True)
    q, k, v = attention_inputs(row.input_ids.shape[1], dtype=torch.bfloat16)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast would make the products bf16: grouped_attention turns it off
        out, _ = ga.grouped_attention(module, q, k, v, None, attention_layout=row.layout)
    wide, _ = ga.grouped_attention(module, q.float(), k.float(), v.float(), None, attention_layout=row.layout)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, wide.to(torch.bfloat16))


def test_without_a_layout_it_is_sdpa():
    q, k, v = attention_inputs(5)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    assert torch.equal(ga.grouped_attention(module, q, k, v, mask)[0], sdpa_attention_forward(module, q, k, v, mask)[0])


def test_refusals():
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


def test_log_probs_run_it_for_sdpa_and_restore_the_models_attention(make_model, monkeypatch):
    calls = []
    real = ga._GroupedAttention.apply
    monkeypatch.setattr(ga._GroupedAttention, "apply", lambda *a: calls.append(1) or real(*a))
    mb = worked_example()
    model = make_model()
    LogProbs(1.0)(model, mb)
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
        with ga.attention_implementation(model, ga.IMPLEMENTATION):
            assert model.config._attn_implementation == ga.IMPLEMENTATION
            raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
