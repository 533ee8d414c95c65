"""bf16 products (precision.py, logprobs.py, generation/weight_copy.py): the default's detection, exactness where weights agree,
the sampler's bf16 copy, and the distance to fp32.

The suite pins the hardware to "no bf16 units" (conftest.py), so `bf16=None` is fp32
here on every machine; these tests ask for bf16 explicitly or mock the hardware.
On a CPU without bf16 units the bf16 products are emulated (slow): the models are tiny.
"""

import json
import os
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from conftest import tiny_model
from test_trainer import config, reward_even_tokens

import fastgrpo.update.step as step_module
from fastgrpo.update import packing
from fastgrpo import GRPOTrainer
from fastgrpo.update.logprobs import LogProbs
from fastgrpo.model.adapters import merged_copy
from fastgrpo.model.loading import lora_config
from fastgrpo.model.precision import resolve_bf16
from fastgrpo.rollout.record import completion_mask
from fastgrpo.generation.weight_copy import MergedCopy
from fastgrpo.model.working_copy import WorkingCopy
from fastgrpo.model.checkpointing import enable_gradient_checkpointing

AMX_CPU = {"cpu_name": "Intel Xeon", "amx_bf16": True, "amx_tile": True, "avx512_bf16": True, "avx2": True}
AVX2_CPU = {"cpu_name": "AMD EPYC", "avx2": True, "amx_bf16": False, "avx512_bf16": False}


def test_default_follows_the_hardware():
    on = resolve_bf16(None, use_cuda=False, cpu_capabilities=AMX_CPU)
    assert on.bf16 and on.notice.startswith("bf16 on: Intel Xeon multiplies bf16 in hardware (amx_bf16, avx512_bf16)")
    assert resolve_bf16(None, use_cuda=False, cpu_capabilities={"avx512_bf16": True}).bf16  # AVX512-BF16 alone suffices
    off = resolve_bf16(None, use_cuda=False, cpu_capabilities=AVX2_CPU)
    assert not off.bf16 and off.notice.startswith("bf16 off: AMD EPYC has neither AMX-BF16 nor AVX512-BF16")
    assert resolve_bf16(None, use_cuda=True, cuda_bf16=True).bf16 and not resolve_bf16(None, use_cuda=True, cuda_bf16=False).bf16
    assert resolve_bf16(True, use_cuda=False, cpu_capabilities=AVX2_CPU) == (True, None)  # the user's choice, no notice
    assert resolve_bf16(False, use_cuda=False, cpu_capabilities=AMX_CPU) == (False, None)


@pytest.mark.parametrize("cpu,bf16", [(AVX2_CPU, False), (AMX_CPU, True)])
def test_trainer_says_which_and_why_once(tmp_path, monkeypatch, capsys, tokenizer, make_model, prompts, cpu, bf16):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: cpu)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    out = capsys.readouterr().out
    assert out.count("fastgrpo: bf16 ") == 1 and f"bf16 {'on' if bf16 else 'off'}: {cpu['cpu_name']}" in out
    assert (trainer.backend.weight_copy is not None) == bf16  # bf16: the sampler has its own copy, and says its size
    assert ("copy of the weights (6 MiB)" in out) == bf16  # tiny model: 3.2 M parameters × 2 bytes


def test_bf16_false_is_the_fp32_path(tmp_path, monkeypatch, capsys, tokenizer, make_model, prompts):
    # No autocast in any forward, the sampler samples from the policy itself (no copy, no sampler log-probs, no
    # correction), and the run equals bf16=None on a CPU without bf16 units step for step.
    autocast_seen = []
    runs, weights = {}, {}
    for bf16 in (False, None):
        model = make_model()
        model.register_forward_hook(lambda *_: autocast_seen.append(torch.is_autocast_enabled("cpu")))
        args = config(tmp_path / str(bf16), bf16=bf16, max_steps=2)
        trainer = GRPOTrainer(model, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
        trainer.train()
        assert trainer.backend.weight_copy is None
        with open(os.path.join(args.output_dir, "metrics.jsonl")) as f:
            runs[bf16] = [{k: v for k, v in json.loads(line).items() if not k.startswith(("seconds", "generation_tokens", "train_tokens", "step_time"))} for line in f]
        weights[bf16] = model.state_dict()
    assert autocast_seen and not any(autocast_seen)
    assert runs[False] == runs[None] and all(torch.equal(weights[False][k], weights[None][k]) for k in weights[False])
    assert not any(key.startswith("sampling/") for key in runs[False][0])
    assert "fastgrpo: bf16 off" in capsys.readouterr().out  # bf16=None says so; bf16=False does not (checked above: once per run)


def test_trainers_with_other_bf16_settings_train_one_after_another_in_one_process(tmp_path, tokenizer, make_model, prompts):
    # A notebook's second trainer: accelerate's AcceleratorState is process-wide, so the precision must not be its setting.
    for i, bf16 in enumerate((True, False, True)):
        trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path / str(i), bf16=bf16, max_steps=1),
                              train_dataset=prompts, processing_class=tokenizer)
        assert trainer.train().global_step == 1
        assert (trainer.backend.weight_copy is not None) == bf16


def left_padded(tokenizer, texts):
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    return batch["input_ids"], batch["attention_mask"]


def test_bf16_logprobs_entropy_kl_are_near_fp32_and_exact_against_themselves(tokenizer, make_model):
    model, ref = make_model(0).eval(), make_model(1).eval()
    ids, mask = left_padded(tokenizer, ["Count to 3.", "Name a colour, any colour you like."])
    completion_ids = torch.randint(0, len(tokenizer), (8, 6), generator=torch.Generator().manual_seed(0))
    completion_ids[1, 3] = completion_ids[6, 1] = tokenizer.eos_token_id  # two shorter completions
    batch = SimpleNamespace(  # G = 4 completions per prompt: the packed pass shares each prompt
        prompt_ids=ids.repeat_interleave(4, 0), prompt_mask=mask.repeat_interleave(4, 0),
        completion_ids=completion_ids, completion_mask=completion_mask(completion_ids, [tokenizer.eos_token_id]),
    )
    bf16 = LogProbs(0.9, chunk=5, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))  # several head chunks
    with torch.no_grad():
        fp32_stats = LogProbs(0.9, chunk=5)(model, batch, lambda: nullcontext(ref))
        bf16_stats = bf16(model, batch, lambda: nullcontext(ref))
        again = bf16(model, batch, lambda: nullcontext(ref))
        self_kl = bf16(model, batch, lambda: nullcontext(make_model(0).eval())).kl  # π_ref = an equal copy
    used = batch.completion_mask.bool()
    # Tolerance: bf16 keeps 8 significant bits (relative rounding 2^-9 ≈ 0.002 of each product input).
    # The tiny model's logits are |z| < 1, so through its two layers and the head each logit moves by
    # ≲ 0.005, and log p = z_y − logsumexp(z), H and KL (fp32 sums of fp32 softmaxes) each by at most twice
    # that: 0.01. 0.02 leaves a 2× margin; a wrong token, position or temperature moves them by 0.1–10.
    for name in ("logps", "entropy", "kl"):
        ours, exact = getattr(bf16_stats, name)[used], getattr(fp32_stats, name)[used]
        assert ours.dtype == torch.float32  # the softmax side is fp32
        torch.testing.assert_close(ours, exact, rtol=0, atol=0.02, msg=name)
        assert not torch.equal(ours, exact)  # the products did run in bf16
        assert torch.equal(ours, getattr(again, name)[used])  # and deterministically
    assert torch.equal(self_kl, torch.zeros_like(self_kl))  # equal weights in the same precision: KL exactly 0


def losses_spy(monkeypatch):
    calls = []
    real = step_module.grpo_loss

    def spy(logps, old_logps, *args, **kwargs):
        calls.append((logps.detach().clone(), old_logps.detach().clone()))
        return real(logps, old_logps, *args, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    return calls


@pytest.mark.parametrize("budget,passes,checkpointing", [(None, 4, False), (0, 8, False), (None, 4, True)])  # None merges a step's 2 micro-batches
@pytest.mark.parametrize("kl_estimator", ["k3", "full"])
def test_bf16_ratio_one_and_kl_zero_where_weights_agree(tmp_path, monkeypatch, tokenizer, make_model, prompts, kl_estimator, budget, passes,
                                                        checkpointing):
    # A constant reward: Â = 0, and at π_θ = π_ref the KL's gradient is 0 too, so every gradient is exactly 0 and
    # the weights never move: π_θ = π_old = π_ref throughout. μ = 2 over 4 micro-batches, GA = 2: micro-batches
    # 3–4 get π_old from its own no-grad pass, the others for free; π_ref is a frozen copy (beta > 0). In bf16
    # every one of them must equal the update's log-probs bit for bit, and KL(π_θ‖π_ref) be exactly 0, whether a
    # step's micro-batches run as one pass or apart, and under gradient checkpointing with every shared row in
    # grouped attention (π_ref's copy must attend as the policy does).
    calls = losses_spy(monkeypatch)
    if checkpointing:
        monkeypatch.setattr(packing, "use_layout", lambda layout, length: True)
    args = config(tmp_path, bf16=True, beta=0.04, kl_estimator=kl_estimator, num_iterations=2, steps_per_generation=4, max_steps=4,
                  update_token_budget=budget, gradient_checkpointing=checkpointing)
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    GRPOTrainer(model, lambda completions, **kw: [1.0] * len(completions), args=args, train_dataset=prompts, processing_class=tokenizer).train()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(calls) == passes and all(torch.equal(logps, old) for logps, old in calls)
    with open(os.path.join(args.output_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert len(records) == 4 and all(r["kl"] == 0.0 and r["kl_old"] == 0.0 and r["clip_ratio/region_mean"] == 0.0 for r in records)
    assert all(0 < r["sampling/sampling_logp_difference/mean"] < 0.05 for r in records)  # the sampler's copy differs a little


@pytest.mark.parametrize("adapters", [False, True])
def test_sampler_copy_is_the_policy_in_bf16_after_every_step(tmp_path, monkeypatch, tokenizer, make_model, prompts, adapters):
    # μ = 1, one optimizer step per rollout: the copy is refreshed before each rollout's sampling, and must then equal
    # the policy's weights (adapters merged) rounded to bf16, bit for bit; the weights move between refreshes.
    seen = []
    real = MergedCopy.update

    def checked(self, policy):
        real(self, policy)
        policy = merged_copy(policy) if adapters else policy
        expected = {name: p.detach().to(torch.bfloat16) for name, p in policy.named_parameters()}
        copy = dict(self.module.named_parameters())
        assert copy.keys() == expected.keys() and all(torch.equal(copy[n], expected[n]) for n in copy)
        seen.append(copy["model.layers.0.self_attn.q_proj.weight"].clone())

    monkeypatch.setattr(MergedCopy, "update", checked)
    args = config(tmp_path, bf16=True, max_steps=3, learning_rate=1e-2)
    peft_config = lora_config(lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"]) if adapters else None
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer,
                          peft_config=peft_config)
    trainer.train()
    assert len(seen) == 1 + 2  # made once, then updated before each later rollout (each after an optimizer step)
    assert not torch.equal(seen[0], seen[2])  # the optimizer steps (the adapters' too) reached the copy
    assert not any(p.requires_grad for p in trainer.backend.weight_copy.module.parameters())


def untied_model(tokenizer, seed=0):
    """conftest's tiny Llama with its own (untied) LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    ))


PEFT_CONSTRUCTS = {  # every peft construct a LoRA run can hold; the untied head unless "tied"
    "modules_to_save lm_head": dict(target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]),
    "trainable tokens": dict(target_modules=["q_proj"], trainable_token_indices=[1, 5, 7]),
    "trainable tokens, tied head": dict(target_modules=["q_proj"], trainable_token_indices=[1, 5, 7], tied=True),
    "LoRA on embeddings and head": dict(target_modules=["q_proj", "embed_tokens", "lm_head"]),
    "modules_to_save embeddings + LoRA on head": dict(target_modules=["lm_head", "v_proj"], modules_to_save=["embed_tokens"]),
}


@pytest.mark.parametrize("construct", list(PEFT_CONSTRUCTS))
def test_full_weights_is_merge_and_unload_for_every_peft_construct(tokenizer, make_model, construct):
    """The sampler's copy (full_weights) is peft's own merge_and_unload(), bit for bit in fp32, with the plain model's names;
    every trainable tensor is moved first (LoRA's B starts at 0), so each construct's trained part shows; disabled: the base."""
    from peft import LoraConfig, get_peft_model

    from fastgrpo.generation.weight_copy import full_weights

    kw = dict(PEFT_CONSTRUCTS[construct])
    tied = kw.pop("tied", False)
    model = get_peft_model(make_model() if tied else untied_model(tokenizer), LoraConfig(r=4, lora_alpha=8, **kw))
    base = {n: p.detach().clone() for n, p in merged_copy(model).named_parameters()}  # adapters still at their identity init
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    expected = dict(merged_copy(model).named_parameters())
    ours = full_weights(model)
    assert ours.keys() == expected.keys()
    assert all(torch.equal(ours[n], expected[n]) for n in ours), [n for n in ours if not torch.equal(ours[n], expected[n])]
    changed = [n for n in ours if not torch.equal(ours[n], base[n])]
    trained = {"lm_head.weight"} if not tied and "lm_head" in str(kw) else {"model.embed_tokens.weight"}
    assert trained <= set(changed)
    with model.disable_adapter():
        plain = full_weights(model)
    assert all(torch.equal(plain[n], base[n]) for n in plain)


def test_bf16_lora_with_a_trained_untied_head_samples_from_the_trained_head(tmp_path, tokenizer, prompts):
    """The instance of issue 30: bf16 + LoRA r 4 on q/v + modules_to_save=["lm_head"] on an untied head built its copy with
    KeyError 'lm_head.weight'; now it trains, and after each step the copy holds the trained head (merge_and_unload's, in bf16)."""
    args = config(tmp_path, bf16=True, max_steps=2, learning_rate=1e-2)
    peft_config = lora_config(lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"])
    peft_config.modules_to_save = ["lm_head"]
    trainer = GRPOTrainer(untied_model(tokenizer), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer,
                          peft_config=peft_config)
    sync = trainer.backend.weight_copy
    head0 = sync.module.lm_head.weight.clone()
    trainer.train()
    sync.update(trainer.accelerator.unwrap_model(trainer.model))
    expected = merged_copy(trainer.accelerator.unwrap_model(trainer.model)).lm_head.weight.to(torch.bfloat16)
    assert torch.equal(sync.module.lm_head.weight, expected) and not torch.equal(head0, expected)


def test_vespo_trains_with_the_bf16_samplers_correction(tmp_path, tokenizer, make_model, prompts):
    """loss_type="vespo" with bf16's sampler copy and the correction on in a token mode (TRL's requirement): trains, the ratio folded into φ(w)."""
    args = config(tmp_path, bf16=True, max_steps=1, loss_type="vespo", vllm_importance_sampling_mode="token_truncate")
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert trainer.correction.into_vespo
    trainer.train()
    record = trainer.state.log_history[0]
    assert "sampling/importance_sampling_ratio/mean" in record and 0 < record["vespo/phi_seq_mean"] <= 1.0 + 1e-6


def groups_of_four(tokenizer, ids, mask):
    """Each of the (B, P) prompts four times with random (seeded) 6-token completions: a micro-batch of shared prompts."""
    completion_ids = torch.randint(0, len(tokenizer), (4 * len(ids), 6), generator=torch.Generator().manual_seed(0))
    return SimpleNamespace(
        prompt_ids=ids.repeat_interleave(4, 0), prompt_mask=mask.repeat_interleave(4, 0),
        completion_ids=completion_ids, completion_mask=completion_mask(completion_ids, [tokenizer.eos_token_id]),
    )


def bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("tied", [True, False])
def test_working_copy_gives_autocasts_values_and_gradients_and_follows_the_weights(tokenizer, make_model, tied):
    # The update's one bf16 copy (model/working_copy.py) stands in for autocast's per-call casts: the same rounding
    # of the same weights, so log-probs and KL are autocast's bit for bit and the fp32 parameters get autocast's
    # gradients (added into .grad by the copy's own backward, the embedding's only at the rows read, tied to the
    # head or not; the pad token's row gets none); an in-place step moves a weight's version counter and only then
    # is it recast.
    ids, mask = left_padded(tokenizer, ["Count to 3.", "Name a colour, any colour you like."])
    ids[:, -1] = tokenizer.pad_token_id  # a real prompt token (mask 1) with the embedding's padding_idx: its row takes no gradient
    batch, autocast = groups_of_four(tokenizer, ids, mask), bf16_autocast
    runs = []
    for working in (False, True):
        model, ref = tiny_model(tokenizer, 0, tied=tied), tiny_model(tokenizer, 1, tied=tied).eval()
        assert model.get_input_embeddings().padding_idx == tokenizer.pad_token_id
        copy = WorkingCopy(model) if working else None
        stats = LogProbs(0.9, chunk=5, autocast=autocast, weights=copy)(model, batch, lambda: nullcontext(ref))
        ((stats.logps + 0.1 * stats.kl) * batch.completion_mask).sum().backward()
        runs.append((stats, {n: p.grad for n, p in model.named_parameters()}, model, copy))
    (stats, grads, _, _), (stats_w, grads_w, model, copy) = runs
    assert torch.equal(stats.logps, stats_w.logps) and torch.equal(stats.kl, stats_w.kl)
    assert grads.keys() == grads_w.keys() and len(grads) == len(list(model.parameters()))
    for name in grads:
        assert grads_w[name].dtype == torch.float32 and torch.equal(grads_w[name], grads[name]), name
    q = model.model.layers[0].self_attn.q_proj.weight
    before = copy.cast(q)
    assert copy.cast(q) is before and torch.equal(before, q.detach().to(torch.bfloat16))  # unchanged: not recast
    torch.optim.SGD(model.parameters(), lr=1.0).step()  # in place: the version counter moves
    assert copy.cast(q) is before and torch.equal(before, q.detach().to(torch.bfloat16))  # recast into the same tensor
    assert copy.holds(model) and not copy.holds(make_model(1))  # a separate π_ref runs through autocast


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_a_released_copy_goes_back_in_backward_and_is_recast_at_its_next_read(tokenizer, tied, checkpointing):
    # WorkingCopy(release=True), with the head's blocks made per pass (the trainer's choice under gradient
    # checkpointing on a CPU): the same log-probs and gradients as the kept copy and blocks, bit for bit; once
    # backward has run, every linear weight's copy (the head's too) has given its pages back, which then read zeros;
    # the first recast after that calls `before_recast` once (the trainer's malloc_trim); the next `cast` recasts
    # into the same tensor, and the sampler's MergedCopy, sharing those tensors, reads the recast weights, never zeros.
    batch, autocast = groups_of_four(tokenizer, *left_padded(tokenizer, ["Count to 3.", "Name a colour, any colour you like."])), bf16_autocast
    runs = []
    for release in (False, True):
        model = tiny_model(tokenizer, 0, tied=tied).train()
        if checkpointing:
            enable_gradient_checkpointing(model)
        trims = []
        copy = WorkingCopy(model, release=release, before_recast=lambda: trims.append(1))
        log_probs = LogProbs(0.9, chunk=5, autocast=autocast, weights=copy)
        assert (log_probs.scratch is None) == release  # the head's blocks live for one pass where the copy goes back
        stats = log_probs(model, batch)
        (stats.logps * batch.completion_mask).sum().backward()
        runs.append((stats, {n: p.grad for n, p in model.named_parameters()}, model, copy))
    (stats, grads, _, _), (stats_r, grads_r, model, copy) = runs
    assert torch.equal(stats.logps, stats_r.logps) and torch.equal(stats.entropy, stats_r.entropy)
    assert all(torch.equal(grads_r[name], grads[name]) for name in grads)
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(copy._copies[id(w)][1].count_nonzero() == 0 for w in linears)  # handed back
    assert not trims
    sampler = MergedCopy(model, torch.bfloat16, copy)
    assert len(trims) == 1  # once, before the first recast: the sampler's copy recast them all
    for w in linears:
        copy.hand_back(w)
    sampled = dict(sampler.module.named_parameters())  # read: recast first
    assert all(torch.equal(sampled[name], p.detach().to(torch.bfloat16)) for name, p in model.named_parameters())
    q = model.model.layers[0].self_attn.q_proj.weight
    before = copy.cast(q)
    copy.hand_back(q)
    assert copy.cast(q) is before and torch.equal(before, q.detach().to(torch.bfloat16))


def test_a_copy_read_by_two_products_goes_back_after_the_last_one():
    # One weight in two products of one graph (two modules sharing a parameter): the copy may go back only once both
    # backward products have read it. The outer product's backward runs first; handed back then, the inner one's
    # input gradient would multiply zeros.
    shared = torch.nn.Linear(16, 16, bias=False)
    x = torch.randn(4, 16, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    grads = []
    for release in (False, True):
        copy, inp = WorkingCopy(shared, release=release), x.clone().requires_grad_(True)
        y = torch.nn.functional.linear(torch.nn.functional.linear(inp, copy.weight(shared.weight)), copy.weight(shared.weight))
        y.float().square().sum().backward()
        grads.append(inp.grad)
        released = copy._copies[id(shared.weight)][1].count_nonzero() == 0
        assert released == release
    assert torch.equal(grads[0], grads[1]) and grads[0].count_nonzero() > 0


class ParameterCasts(TorchDispatchMode):
    """Counts the dtype casts (aten._to_copy) whose input is one of `params`: what autocast does at every product."""

    def __init__(self, params):
        super().__init__()
        self.pointers, self.count = {p.data_ptr() for p in params}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in self.pointers:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("checkpointing,optim", [(False, "adamw_torch_fused"), (False, "adamw_torch"), (True, "adamw_torch_fused")])
def test_trainer_holds_the_weights_in_bf16_once_for_the_update_and_the_sampler(tmp_path, capsys, tokenizer, make_model, prompts, checkpointing, optim):
    # bf16 on one process without adapters: the sampler's MergedCopy parameters are the working copy's tensors
    # (no second bf16 copy) and the update casts no weight (every product multiplies the copies), and after
    # training both equal the trained fp32 weights rounded to bf16. With gradient checkpointing the copy is the same
    # one; only the layers' recomputation in backward, outside functional_call, casts through autocast.
    # AdamW's fused kernel (TRL's default optimizer) moves no version counter: the copy must follow it all the same.
    args = config(tmp_path, bf16=True, max_steps=2, learning_rate=1e-2, gradient_checkpointing=checkpointing, optim=optim)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    out = capsys.readouterr().out
    policy, working = trainer.accelerator.unwrap_model(trainer.model), trainer.log_probs.weights
    sampled = dict(trainer.backend.weight_copy.module.named_parameters())
    assert working is not None and "share one bfloat16 copy of the weights (6 MiB)" in out
    assert working.release == checkpointing and (trainer.log_probs.scratch is None) == checkpointing  # memory first
    with ParameterCasts(policy.parameters()) as casts:
        trainer.train()
    assert (casts.count > 0) == checkpointing
    trainer.backend.update_weights(policy)  # what the next rollout's sampling would start with
    for name, param in policy.named_parameters():
        assert torch.equal(sampled[name], param.detach().to(torch.bfloat16)), name  # updated after the last step
        assert sampled[name].data_ptr() == working.cast(param).data_ptr(), name
