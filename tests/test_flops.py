"""The benchmarks' FLOP count (benchmarks/flops.py), on a tiny Llama whose sizes can be counted by hand.

Hidden 8, MLP 16, 2 layers, 2 heads of 4 with 1 KV head, vocabulary 32, tied head: per layer q 64 + k 32 + v 32 +
o 64 + gate, up, down 3 × 128 = 576 weights in products; the head V·H = 256.
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import flops  # noqa: E402


def tiny():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def test_sizes_are_the_products_weights():
    assert flops.model_sizes(tiny()) == {"body": 2 * 576, "head": 256, "layers": 2, "attn_width": 8}


def test_a_dense_row_counts_6NT_the_head_on_completions_and_its_recomputed_logits():
    # L = 10 tokens, n = 4 completion tokens, sdpa over the full 10 × 10 pairs
    count = flops.step_flops(tiny(), [(10, 4, 100, False, False)])
    assert count["body"] == 6 * 1152 * 10 == 69120
    assert count["head"] == 6 * 256 * 4 == 6144 and count["head_recompute"] == 2 * 256 * 4 == 2048
    assert count["attention"] == 12 * 100 * 8 * 2 == 19200
    assert count["total"] == 69120 + 6144 + 2048 + 19200
    assert count["model"] == 69120 + 6144 + 19200  # what the step computes twice is left out


def test_grouped_attention_recomputes_its_scores_and_model_flops_leave_that_out():
    count = flops.step_flops(tiny(), [(10, 4, 60, True, False), (10, 4, 100, False, False)])
    assert count["attention"] == 14 * 60 * 16 + 12 * 100 * 16
    assert count["model"] == 2 * (69120 + 6144) + 12 * 60 * 16 + 12 * 100 * 16
    assert count["total"] - count["model"] == 2 * 2048 + 2 * 60 * 16


def test_a_row_whose_softmax_the_head_keeps_recomputes_no_logits():
    # Two rows of 4 completion tokens; the second's softmax kept (chunked_head.keeps_softmax): only the first recomputes.
    count = flops.step_flops(tiny(), [(10, 4, 100, False, False), (10, 4, 100, False, True)])
    assert count["head_recompute"] == 2 * 256 * 4 == 2048
    assert count["total"] - count["model"] == 2048
