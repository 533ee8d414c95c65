"""Every decoder family TRL trains, trained here: dense and mixture-of-experts, tiny models built from configs.

Two checks per family. (1) The log-prob pass on packed rows — prompts shared where the model's
attention allows it, and each completion with its own prompt — gives the log-probs of the model's
own padded forward (TRL's layout: a 2-D mask, positions counted over the real tokens), and for a
mixture-of-experts model the load-balancing loss that forward returns (transformers'
`load_balancing_loss_func` over the padded router logits with the 2-D mask: the value TRL adds).
(2) Two optimizer steps train, packed and unpacked-prompt, and a mixture-of-experts run logs
`aux_loss` with the loss it was added to (TRL 1.16's `aux_loss_enabled`).
"""

import json
import os
from types import SimpleNamespace

import pytest
import torch
import transformers
from datasets import Dataset

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.model.experts import RouterAuxLoss
from fastgrpo.update.logprobs import LogProbs
from fastgrpo.update.packing import packing_support

_MOE = dict(num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.01)
# family → (config class, model class, the config's own fields; every model is 2 layers of width 64, 4 heads of 16)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=4)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=4)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(head_dim=16, num_experts=4, moe_intermediate_size=32, **_MOE)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, **_MOE)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, sliding_window=None, **_MOE)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=4, **_MOE)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(head_dim=16, num_local_experts=4, sliding_window=4, **_MOE)),
    # DeepSeek-V3-style routers balance with a bias, not a loss: no router_aux_loss_coef in their configs (TRL: off).
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", dict(head_dim=16, n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=0,
                                                            n_group=1, topk_group=1, num_experts_per_tok=2, output_router_logits=True)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=0, n_group=1,
                                                                    topk_group=1, num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=None,
                                                                    qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4,
                                                                    output_router_logits=True)),
}
# GPT-OSS builds its masks without the position ids, so a packed row's sequences would see each other: padded rows.
UNPACKABLE = {"gpt_oss"}
WITH_AUX = {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss"}


def family_model(name: str, tokenizer, seed: int = 0):
    config_class, model_class, own = FAMILIES[name]
    common = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = getattr(transformers, config_class)(**{**common, **own})
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(config)


def micro_batch(tokenizer):
    """2 prompts × 2 completions of unequal lengths: left-padded prompts, right-padded completions, a prompt repeated."""
    prompts = [tokenizer.encode("Count to three, slowly."), tokenizer.encode("Hi")]
    P = max(map(len, prompts))
    prompt_ids = torch.tensor([[tokenizer.pad_token_id] * (P - len(p)) + p for p in prompts for _ in range(2)])
    prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts for _ in range(2)])
    torch.manual_seed(1)
    completion_ids = torch.randint(5, 1000, (4, 6))
    completion_mask = torch.tensor([[1] * n + [0] * (6 - n) for n in (6, 3, 5, 1)])
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    return SimpleNamespace(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, completion_mask=completion_mask)


def padded_forward(model, mb):
    """TRL's forward: the padded (B, P + T) batch with its 2-D mask; positions over the real tokens (as generate() numbers them)."""
    ids = torch.cat([mb.prompt_ids, mb.completion_ids], 1)
    mask = torch.cat([mb.prompt_mask, mb.completion_mask], 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    kwargs = {"output_router_logits": True} if model.config.model_type in WITH_AUX else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, **kwargs)
    T = mb.completion_ids.shape[1]
    logits = out.logits[:, -T - 1 : -1].float()
    logps = torch.log_softmax(logits, -1).gather(-1, mb.completion_ids[..., None]).squeeze(-1) * mb.completion_mask
    return logps, getattr(out, "aux_loss", None), out.router_logits if kwargs else None


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_packed_pass_matches_the_padded_forward(tokenizer, name):
    model = family_model(name, tokenizer).eval()
    mb = micro_batch(tokenizer)
    aux_on = RouterAuxLoss.from_config(None, model.config).enabled
    assert aux_on == (name in WITH_AUX)  # TRL's rule: MoE with a coefficient in the config
    assert (packing_support(model) is None) == (name not in UNPACKABLE)
    with torch.no_grad():
        expected, expected_aux, router_logits = padded_forward(model, mb)
        for share in (True, False):
            stats = LogProbs(1.0, share_prompts=share, router_aux_loss=aux_on)(model, mb)
            torch.testing.assert_close(stats.logps, expected, atol=2e-5, rtol=0)
            if aux_on:
                # transformers' own function on the padded router logits and TRL's 2-D mask: the value TRL adds
                module = __import__(type(model).__module__, fromlist=["load_balancing_loss_func"])
                mask = torch.cat([mb.prompt_mask, mb.completion_mask], 1)
                by_hand = module.load_balancing_loss_func(router_logits, model.config.num_local_experts if hasattr(model.config, "num_local_experts")
                                                          else model.config.num_experts, 2, mask)
                torch.testing.assert_close(expected_aux, by_hand)
                torch.testing.assert_close(stats.aux_loss, expected_aux, atol=1e-5, rtol=0)
                # each completion has its own prompt while the aux loss is on (or TRL's padded rows)
                assert stats.packed_tokens == (stats.padded_tokens if name in UNPACKABLE else stats.real_tokens)
            else:
                assert stats.aux_loss is None


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_bf16_working_copy_gives_autocasts_log_probs_and_gradients(tokenizer, name):
    # model/working_copy.py under bf16 autocast: its linear copies, its own lookup of a plain nn.Embedding (Gemma 3's
    # scaled one stays the model's) and the head's gradient added into .grad give autocast's own pass: log-probs
    # bit for bit, gradients to fp32 summation order.
    from fastgrpo.model.working_copy import WorkingCopy

    mb, runs = micro_batch(tokenizer), []
    for working in (False, True):
        model = family_model(name, tokenizer)
        stats = LogProbs(1.0, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16), weights=WorkingCopy(model) if working else None)(model, mb)
        (stats.logps * mb.completion_mask).sum().backward()
        runs.append((stats.logps, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (logps, grads), (logps_w, grads_w) = runs
    assert torch.equal(logps, logps_w)
    assert grads.keys() == grads_w.keys()
    for key in grads:
        torch.testing.assert_close(grads_w[key], grads[key], rtol=1e-5, atol=1e-7, msg=key)


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_trains(tmp_path, tokenizer, name):
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(8)])
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
        max_prompt_length=32, max_completion_length=6, max_steps=2, learning_rate=1e-3, logging_steps=1, save_steps=1000,
        disable_tqdm=True, bf16=False, num_iterations=2,
    )
    model = family_model(name, tokenizer)
    before = {k: v.clone() for k, v in model.named_parameters()}
    trainer = GRPOTrainer(model, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert trainer.aux_loss_enabled == (name in WITH_AUX)
    assert trainer.router_aux_loss_coef == (0.01 if name in WITH_AUX else 0.0)
    trainer.train()
    with open(os.path.join(args.output_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert len(records) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    if name in WITH_AUX:
        # E · Σ f_e P_e ≥ top_k (Cauchy–Schwarz with Σ f = k, Σ P = 1 and balanced routing at the minimum), ≤ E · k
        assert all(2.0 - 1e-4 <= r["aux_loss"] <= 8.0 for r in records)
    else:
        assert all("aux_loss" not in r for r in records)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())


def test_router_aux_loss_coef_is_refused_for_a_dense_model_and_honoured_for_moe(tmp_path, tokenizer):
    dense = family_model("llama", tokenizer)
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.1 but llama is not a mixture-of-experts model"):
        RouterAuxLoss.from_config(0.1, dense.config)
    assert RouterAuxLoss.from_config(0.0, dense.config) == RouterAuxLoss(0.0, False)
    moe = family_model("qwen3_moe", tokenizer)
    assert RouterAuxLoss.from_config(None, moe.config) == RouterAuxLoss(0.01, True)  # the config's own coefficient
    assert RouterAuxLoss.from_config(0.5, moe.config) == RouterAuxLoss(0.5, True)
    assert RouterAuxLoss.from_config(0.0, moe.config) == RouterAuxLoss(0.0, False)
    glm = family_model("glm4_moe", tokenizer)
    assert RouterAuxLoss.from_config(None, glm.config) == RouterAuxLoss(0.0, False)  # declares no coefficient: off, as TRL
    mb = micro_batch(tokenizer)
    with pytest.raises(ValueError, match="glm4_moe returns no router load-balancing loss"):
        LogProbs(1.0, router_aux_loss=True)(glm, mb)
