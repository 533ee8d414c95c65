"""TRL AsyncGRPOTrainer's MFU inputs (model/flops.py): FLOPs per token counted by hand, TRL's own functions as the oracle.

The tiny Llama of tests/test_flops.py: hidden 8, MLP 16, 2 layers, 2 heads of 4 with 1 KV head, vocabulary 32.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, MixtralConfig, Qwen2Config, Qwen3MoeConfig

from fastgrpo.model.flops import flops_per_token, mfu, peak_flops, peak_flops_of


TINY = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)


def test_flops_per_token_of_the_tiny_llama_by_hand():
    # seq_len 10. Per layer: q, k, v 2·8·(2·4 + 2·1·4) = 256, o 2·2·4·8 = 128, scores 2·2·2·4·10 = 320, MLP 2·3·8·16 = 768:
    # 1472; two layers 2944, head 2·32·8 = 512: forward 3456, training 3 × 3456 = 10368.
    assert flops_per_token(TINY, 10) == 10368
    assert flops_per_token(TINY, 11) - flops_per_token(TINY, 10) == 3 * 2 * 32  # one more token: 2 layers × 32 score FLOPs, × 3


def test_flops_per_token_and_the_peaks_are_trls():
    utils = pytest.importorskip("trl.trainer.utils")
    qwen2 = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                        num_key_value_heads=2)  # Qwen2.5-0.5B's sizes; its config has no head_dim
    moe = Qwen3MoeConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=2)
    for config in (TINY, qwen2, moe):
        for seq_len in (1, 37, 4096):
            assert flops_per_token(config, seq_len) == utils.compute_flops_per_token(config, seq_len)
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA A10G",
                 "NVIDIA L4", "NVIDIA GeForce RTX 4090", "AMD Instinct MI300X"):
        for dtype in ("bfloat16", "float16", "float32"):
            assert peak_flops_of(name, dtype) == utils.get_peak_flops(name, dtype), (name, dtype)
    assert mfu(1000 * 2e9, 4.0, 1e12) == utils.compute_mfu(1000, 2e9 / 4.0, 1, 1e12) == 50.0  # 1000 FLOPs/token, 2e9 tokens in 4 s


def test_mixtral_whose_config_trl_cannot_read_counts_its_experts_at_intermediate_size():
    # TRL reads moe_intermediate_size and decoder_sparse_step, which Mixtral's config has not (AttributeError): every layer
    # is sparse, each expert of intermediate_size. Sizes as TINY, 4 experts, 2 per token: per layer attention 704 (seq 10),
    # experts 2 · 2·3·8·16 = 1536, router 2·8·4 = 64; 2 layers 4608, head 512: 3 × 5120 = 15360.
    config = MixtralConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2)
    assert flops_per_token(config, 10) == 15360


def test_no_peak_on_a_cpu_nor_in_float32():
    # TRL reads the peak from CUDA's device name; a CPU has none, and its table lists no float32 peak: no MFU is logged.
    assert peak_flops(torch.device("cpu"), "bfloat16") is None
    assert peak_flops_of("NVIDIA H100 80GB HBM3", "float32") is None and peak_flops_of("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
