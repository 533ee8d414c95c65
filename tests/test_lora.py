"""LoRA through peft on the tiny model: only adapters train, π_ref is the base model, resume and save are exact.

Every run is a few optimizer steps of a 3 M-parameter model on CPU, with
rank-8 adapters (TRL's α/r = 2) on every linear layer unless a test says otherwise.
"""

import os
import sys

import pytest
import torch
from peft import LoraConfig, PeftModel, PrefixTuningConfig, get_peft_model
from transformers import AutoModelForCausalLM

from fastgrpo import GRPOTrainer
from fastgrpo.model.adapters import as_reference
from fastgrpo.model.loading import lora_config
from fastgrpo.model.peft_checks import check_peft_inputs
from conftest import tiny_model
from test_trainer import config, read_metrics, record_losses, reward_even_tokens


def lora(**overrides):
    return lora_config(**{"lora_r": 8, "lora_alpha": 16, "lora_target_modules": "all-linear", **overrides})


def trainer_with_lora(tmp_path, make_model, tokenizer, prompts, peft_config=None, **overrides):
    peft_config = peft_config or lora()
    return GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, **overrides), train_dataset=prompts,
                       processing_class=tokenizer, peft_config=peft_config)


def weights(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}


def test_lora_config_has_trl_model_config_defaults():
    from trl import ModelConfig  # the oracle: TRL's own field names and defaults

    trl = ModelConfig()
    ours = lora_config()
    assert (ours.r, ours.lora_alpha, ours.lora_dropout) == (trl.lora_r, trl.lora_alpha, trl.lora_dropout) == (16, 32, 0.05)
    assert ours.target_modules == trl.lora_target_modules and ours.task_type == trl.lora_task_type == "CAUSAL_LM"
    assert set(lora_config(lora_target_modules=["q_proj", "v_proj"]).target_modules) == {"q_proj", "v_proj"}


@pytest.mark.parametrize("given", ["peft_config", "PeftModel"])
def test_only_adapters_change_and_base_weights_stay_bitwise(tmp_path, tokenizer, make_model, prompts, given):
    # μ = 2 over 2 steps per pass: 4 optimizer steps, π_old captured and reused.
    args = config(tmp_path, num_iterations=2, steps_per_generation=4, max_steps=4)
    if given == "peft_config":
        trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer, peft_config=lora())
    else:  # a PeftModel passed as `model` (was taken for a path string)
        trainer = GRPOTrainer(get_peft_model(make_model(), lora()), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert isinstance(policy, PeftModel) and trainer.backend.model is policy  # samples from the adapted weights
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    before = weights(trainer)
    trainer.train()
    after = weights(trainer)
    for name, value in before.items():
        if "lora_B" in name:  # B starts at 0 (BA = 0: the adapted model starts as the base); every B has moved
            assert not value.any() and after[name].any(), name
        elif "lora_" not in name:
            assert torch.equal(after[name], value), name  # frozen base: bit for bit


@pytest.mark.parametrize("kl_estimator", ["k3", "full"])
def test_reference_is_the_base_model_kl_zero_at_step_one_ratio_one_at_each_first_update(tmp_path, monkeypatch, tokenizer, make_model, prompts, kl_estimator):
    # μ = 2, 2 steps per pass: 4 steps per rollout, 2 rollouts. lora_dropout 0.05 is in the config and
    # switched off with every other dropout (disable_dropout=True).
    calls = record_losses(monkeypatch)
    trainer = trainer_with_lora(tmp_path, make_model, tokenizer, prompts, lora(lora_dropout=0.05), num_iterations=2,
                                steps_per_generation=4, max_steps=8, beta=0.04, kl_estimator=kl_estimator)
    assert trainer.ref_model is None  # no second copy: π_ref = the policy with its adapters disabled
    trainer.train()
    metrics = {r["step"]: r for r in read_metrics(trainer.args.output_dir)}
    # Step 1: B = 0, so the adapted policy computes the base model's logits bit for bit (x·W + 0): KL = 0 exactly.
    assert metrics[1]["kl"] == 0.0
    assert metrics[2]["kl"] > 0 and metrics[8]["kl"] > 0  # the adapters moved; π_ref did not
    per_rollout = trainer.args.steps_per_rollout
    for first in (1, 1 + per_rollout):  # each rollout's first step sees the policy that generated it
        assert metrics[first]["kl_old"] == 0.0
        assert calls[first - 1] and all(torch.equal(logps, old) for logps, old, _ in calls[first - 1])
    assert any(not torch.equal(lp, old) for step in calls[1:per_rollout] for lp, old, _ in step)  # reuse: ρ ≠ 1 later
    # While B = 0 the adapters' dropout cannot show; now B ≠ 0, two training-mode forwards agree only if it is off.
    policy, ids = trainer.accelerator.unwrap_model(trainer.model), torch.tensor([[1, 200, 300, 400, 500]])
    policy.train()
    with torch.no_grad():
        assert torch.equal(policy(input_ids=ids).logits, policy(input_ids=ids).logits)


@pytest.mark.parametrize("kl_estimator", ["k3", "full"])  # full: π_ref runs inside the update, between forward and backward
def test_trained_adapters_given_as_a_peft_model_are_their_own_reference(tmp_path, tokenizer, make_model, prompts, kl_estimator):
    # A PeftModel whose adapters are already trained (B ≠ 0, as after SFT): π_ref must be that initial policy, not
    # the base under it (TRL's "ref" adapter). KL is then exactly 0 at step 1 and the frozen copy never moves.
    model = get_peft_model(make_model(), lora())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if ".default." in n}
    trainer = GRPOTrainer(model, reward_even_tokens, args=config(tmp_path, max_steps=2, beta=0.04, kl_estimator=kl_estimator),
                          train_dataset=prompts, processing_class=tokenizer)
    trainer.train()
    metrics = {r["step"]: r for r in read_metrics(trainer.args.output_dir)}
    assert metrics[1]["kl"] == 0.0 and metrics[2]["kl"] > 0  # with adapters disabled, step 1's KL would be > 0
    params = dict(model.named_parameters())
    for name, value in initial.items():
        ref = name.replace(".default.", ".ref.")
        assert torch.equal(params[ref], value) and not params[ref].requires_grad  # the frozen copy
        assert params[name].requires_grad
    assert any(not torch.equal(params[n], v) for n, v in initial.items())  # the given adapters trained


def test_gradient_checkpointing_trains_the_adapters_as_without_it(tmp_path, tokenizer, make_model, prompts):
    # Checkpointing recomputes the same forward in the backward pass: the adapters must get the same
    # gradients (a frozen embedding must not cut the graph), so the weights agree to fp32 rounding.
    results = {}
    for checkpointing in (False, True):
        trainer = trainer_with_lora(tmp_path / str(checkpointing), make_model, tokenizer, prompts, max_steps=2,
                                    gradient_checkpointing=checkpointing)
        trainer.train()
        results[checkpointing] = {k: v for k, v in weights(trainer).items() if "lora_B" in k}
    assert all(v.abs().max() > 1e-4 for v in results[True].values())  # ≈ lr = 1e-3 per AdamW step
    for name, value in results[False].items():
        torch.testing.assert_close(results[True][name], value, rtol=0, atol=1e-6)


def test_tiny_model_with_lora_raises_a_learnable_reward(tmp_path, tokenizer, make_model, prompts):
    # As test_trainer's learnable-reward test, but only rank-8 adapters on every linear layer train (the tied
    # embedding/LM head is frozen). One record per rollout of 16 completions, so single records are noisy: the
    # first three and the last three are averaged. Measured with seeds 0-4 on an Intel Xeon (AMX) in fp32:
    # 0.55-0.61 → 0.76-1.00 (rises 0.21-0.40). At 1e-2 and 40 steps the run peaked mid-way and fell back on some
    # CPUs (seed 0 on the Xeon ended at 0.66), since every CPU's kernels round differently.
    args = dict(num_iterations=2, per_device_train_batch_size=8, gradient_accumulation_steps=1, num_generations=8,
                steps_per_generation=2, max_steps=80, learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=4, top_k=20)
    trainer = trainer_with_lora(tmp_path, make_model, tokenizer, prompts, **args)
    trainer.train()
    rewards = [r["reward"] for r in read_metrics(trainer.args.output_dir) if "reward" in r]  # one rollout per record
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert first < 0.65 and last > first + 0.15, rewards


def test_resume_with_lora_reproduces_the_uninterrupted_run(tmp_path, tokenizer, make_model, prompts):
    # As test_trainer's resume test: checkpoint-3 sits inside the first rollout's reuse window (μ = 2, 4 steps
    # per rollout). It holds the adapters and their AdamW moments; the base comes from the model as given.
    common = dict(num_iterations=2, steps_per_generation=4, max_steps=6, save_steps=3, beta=0.04)
    full = trainer_with_lora(tmp_path, make_model, tokenizer, prompts, **common)
    full.train()
    reference, final = {r["step"]: r for r in read_metrics(full.args.output_dir)}, weights(full)
    checkpoint = os.path.join(full.args.output_dir, "checkpoint-3")
    assert {"adapter_model.safetensors", "adapter_config.json", "trainer_state.pt"} <= set(os.listdir(checkpoint))
    assert not os.path.exists(os.path.join(checkpoint, "model.safetensors"))  # adapters only, not the base

    os.rename(os.path.join(full.args.output_dir, "metrics.jsonl"), os.path.join(full.args.output_dir, "metrics-full.jsonl"))
    resumed = trainer_with_lora(tmp_path, make_model, tokenizer, prompts, **common)
    assert resumed.train(resume_from_checkpoint=checkpoint).global_step == 6
    after = {r["step"]: r for r in read_metrics(resumed.args.output_dir)}
    assert sorted(after) == [4, 5, 6]
    for step in (4, 5, 6):
        for key in ("loss", "kl", "kl_old"):
            assert after[step][key] == pytest.approx(reference[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert after[5]["reward"] == pytest.approx(reference[5]["reward"])  # the same regenerated rollout
    for name, value in weights(resumed).items():
        torch.testing.assert_close(value, final[name], rtol=0, atol=1e-7)


def test_save_model_writes_the_adapter_or_merged_weights(tmp_path, tokenizer, make_model, prompts):
    trainer = trainer_with_lora(tmp_path, make_model, tokenizer, prompts, max_steps=2)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    trainer.save_model(str(tmp_path / "merged"), merge_adapters=True)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    ids = torch.tensor([[1, 200, 300, 400, 500]])
    with torch.no_grad():
        expected = policy(input_ids=ids).logits
        with policy.disable_adapter():
            base = policy(input_ids=ids).logits
        assert not torch.allclose(expected, base)  # the adapters changed the function
        loaded = PeftModel.from_pretrained(make_model(), str(tmp_path / "adapter"))  # the same random base (seed 0)
        assert torch.equal(loaded(input_ids=ids).logits, expected)
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))  # W + α/r·BA: the same up to rounding
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=1e-5)
    assert "lora_A" in str(list(policy.state_dict())[:50])  # merging worked on a copy: the policy keeps its adapters
    assert os.path.exists(tmp_path / "merged" / "tokenizer.json") and os.path.exists(tmp_path / "adapter" / "tokenizer.json")


def test_lora_on_a_tied_embedding_merges_without_moving_the_head(tmp_path, tokenizer, make_model, prompts):
    """peft's embedding LoRA adds ΔW to the lookup only; the tied head reads the base weight. Merging into the shared tensor
    moved the head too: save_model(merge_adapters=True) wrote a model whose logits differed from the policy's by ~150, the
    bf16 sampler's merged copy sampled from that other model, and the vLLM sync failed (StopIteration in with_head)."""
    from fastgrpo.generation.vllm.weights import tied_names, with_head
    from fastgrpo.generation.weight_copy import MergedCopy, full_weights
    from fastgrpo.model.loading import decoder_of

    adapters = LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"], task_type="CAUSAL_LM")
    trainer = trainer_with_lora(tmp_path, make_model, tokenizer, prompts, peft_config=adapters, max_steps=1)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:  # trained adapters (fresh ones are 0 on one side)
                p.normal_(std=0.5)
    trainer.save_model(str(tmp_path / "merged"), merge_adapters=True)
    ids = torch.tensor([[1, 200, 300, 400, 500]])
    with torch.no_grad():
        expected = policy(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=1e-4)
        copy = MergedCopy(policy, dtype=torch.float32)
        torch.testing.assert_close(copy.module(input_ids=ids).logits, expected, rtol=0, atol=1e-4)
    tied = tied_names(decoder_of(policy))
    assert tied == ("model.embed_tokens.weight", "lm_head.weight")
    sent = with_head(full_weights(policy), tied)
    assert torch.equal(sent["lm_head.weight"], decoder_of(policy).lm_head.weight)  # the base weight, unmerged
    assert not torch.equal(sent["model.embed_tokens.weight"], sent["lm_head.weight"])
    assert policy.get_base_model().config.tie_word_embeddings  # the policy itself is left as it was

def test_bad_peft_inputs_are_refused(tmp_path, tokenizer, make_model, prompts):
    with pytest.raises(TypeError, match="peft_config must be a peft.PeftConfig"):
        trainer_with_lora(tmp_path, make_model, tokenizer, prompts, peft_config={"r": 8})
    with pytest.raises(ValueError, match="already a PeftModel"):
        GRPOTrainer(get_peft_model(make_model(), lora()), reward_even_tokens, args=config(tmp_path), train_dataset=prompts,
                    processing_class=tokenizer, peft_config=lora())
    get_peft_model(make_model(), lora()).save_pretrained(str(tmp_path / "saved"))
    frozen = PeftModel.from_pretrained(make_model(), str(tmp_path / "saved"))  # inference mode: nothing trains
    with pytest.raises(ValueError, match="is_trainable=True"):
        GRPOTrainer(frozen, reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(ValueError, match="sync_ref_model=True with adapters"):
        trainer_with_lora(tmp_path, make_model, tokenizer, prompts, beta=0.04, sync_ref_model=True)
    with pytest.raises(ValueError, match="lora_r=0"):
        lora_config(lora_r=0)
    # each used to be accepted: α = 0 trained nothing (grad_norm 0), SEQ_CLS made the policy a classifier,
    # prefix tuning failed inside the trainer's set-up after the model loaded
    for bad, message in [(LoraConfig(r=4, lora_alpha=0, task_type="CAUSAL_LM"), r"LoraConfig\(r=4, lora_alpha=0, lora_dropout=0.0\): need r ≥ 1, α > 0"),
                         (LoraConfig(r=4, lora_alpha=8, task_type="SEQ_CLS"), "peft_config.task_type='SEQ_CLS': the policy is a causal LM"),
                         (PrefixTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM"), "peft_config is a PrefixTuningConfig \\(virtual tokens\\)")]:
        with pytest.raises(ValueError, match=message):
            GRPOTrainer("./this-model-must-not-be-loaded", reward_even_tokens, args=config(tmp_path), train_dataset=prompts, peft_config=bad)
    # target_modules that match nothing: found before any weight loads (a weightless copy of the model from its config,
    # a local folder's or a built model's), naming the model's layers; peft's own message failed after the load.
    make_model().save_pretrained(str(tmp_path / "folder"))
    tokenizer.save_pretrained(str(tmp_path / "folder"))
    typo = LoraConfig(r=4, lora_alpha=8, target_modules=["q_projj"], task_type="CAUSAL_LM")
    layers = r"Its layers: embed_tokens, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head; name some"
    for model in (str(tmp_path / "folder"), make_model()):
        with pytest.raises(ValueError, match=r"peft_config.target_modules=\{'q_projj'\} adapts nothing in this model \(Target modules \{'q_projj'\} not found.*" + layers):
            GRPOTrainer(model, reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer, peft_config=typo)
    assert typo.target_modules == {"q_projj"} and typo.base_model_name_or_path is None  # the caller's config untouched
    norm = LoraConfig(r=4, lora_alpha=8, target_modules=["input_layernorm"], task_type="CAUSAL_LM")  # matched, but no layer LoRA wraps
    with pytest.raises(ValueError, match=r"peft_config.target_modules=\{'input_layernorm'\} matches a module LoRA cannot wrap \(Target module "
                                         r"LlamaRMSNorm.*\). The layers it can wrap here: embed_tokens, q_proj"):
        GRPOTrainer(str(tmp_path / "folder"), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, peft_config=norm)
    with pytest.raises(ValueError, match="does not exist"):  # a config that matches passes the check, on to the load
        GRPOTrainer("./this-model-must-not-be-loaded", reward_even_tokens, args=config(tmp_path), train_dataset=prompts, peft_config=lora())
    # The check is peft's own injection: what it would accept passes (PiSSA initialises from weights the weightless copy
    # has none of; a module the user added to a built model is there), and an exclusion that leaves nothing is named.
    check_peft_inputs(str(tmp_path / "folder"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], init_lora_weights="pissa"), False)
    extended = make_model()
    extended.extra = torch.nn.Linear(64, 64)
    GRPOTrainer(extended, reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer,
                peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["extra"], task_type="CAUSAL_LM"))
    with pytest.raises(ValueError, match=r"target_modules='all-linear', exclude_modules='\.\*' adapts nothing in this model \(All modules were excluded"):
        check_peft_inputs(str(tmp_path / "folder"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", exclude_modules=".*"), False)
    (tmp_path / "folder" / "config.json").write_text("{not json")  # the folder's own error, as without adapters
    with pytest.raises(ValueError, match="config.json' is not valid JSON"):
        check_peft_inputs(str(tmp_path / "folder"), lora(), False)
    with pytest.raises(ValueError, match=r"no trainable parameters \(every requires_grad is False\); unfreeze what should train"):
        GRPOTrainer(make_model().requires_grad_(False), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    plain = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, max_steps=1), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(ValueError, match="no adapters"):
        plain.save_model(str(tmp_path / "x"), merge_adapters=True)
    (tmp_path / "a-file").write_text("kept")
    with pytest.raises(ValueError, match="output_dir '.*a-file' is a file; give a folder"):  # it failed in transformers' save, naming no fix
        plain.save_model(str(tmp_path / "a-file"))
    assert (tmp_path / "a-file").read_text() == "kept"
    plain.train()  # checkpoint-1 of a run without adapters
    with pytest.raises(ValueError, match="holds no adapters"):
        trainer_with_lora(tmp_path, make_model, tokenizer, prompts, max_steps=2).train(resume_from_checkpoint=True)


@pytest.mark.slow
def test_two_processes_train_adapters_as_one(tmp_path, lora_one_process):
    # tests/dist_script.py --lora: fixed completions, beta 0.04 (π_ref = adapters disabled inside DDP), gradient
    # checkpointing; 2 steps (μ = 2: step 2 reuses the rollout) on 1 process and on 2 (torchrun, gloo). As in
    # test_distributed.py, results agree to fp32 summation order, not bit for bit.
    from test_distributed import SCRIPT, free_port, run

    one, two = lora_one_process, str(tmp_path / "two")
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()), SCRIPT, two, "--max_steps", "2", "--lora"])
    expected, logged = ({r["step"]: r for r in read_metrics(d)} for d in (one, two))
    for step in (1, 2):
        for key in ("loss", "kl", "kl_old", "grad_norm"):
            assert logged[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert expected[1]["kl"] == 0.0 and expected[2]["kl"] > 0
    reference = torch.load(os.path.join(one, "record_0.pt"))["weights"]
    for rank in range(2):
        weights_by_step = torch.load(os.path.join(two, f"record_{rank}.pt"))["weights"]
        for step in (1, 2):
            for name, value in reference[step].items():
                torch.testing.assert_close(weights_by_step[step][name], value, rtol=0, atol=1e-6, msg=lambda m: f"{rank} {step} {name}: {m}")
    assert max(v.abs().max() for n, v in reference[2].items() if "lora_B" in n) > 1e-4  # the adapters moved
    assert os.path.exists(os.path.join(two, "adapter_model.safetensors"))  # save_model after train(): the adapter


@pytest.mark.parametrize("init, given", [(False, "peft_config"), ("pissa", "peft_config"), ("pissa", "PeftModel")])
def test_adapters_that_do_not_start_as_a_no_op_are_their_own_reference(tmp_path, tokenizer, make_model, prompts, init, given):
    """init_lora_weights=False starts B ≠ 0 and PiSSA moves the top singular directions of W into the adapters (the base
    keeps the residual): disabling the adapters was π_ref, so step 1's KL was against another model (PiSSA's residual:
    not a language model at all). π_ref is now a frozen copy of the initial adapters, as for a given PeftModel; adding
    that copy must not run PiSSA a second time on the residual (it changed the policy before its first step)."""
    adapters = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=init, task_type="CAUSAL_LM")
    ids = torch.tensor([[1, 200, 300, 400, 500]])
    model = make_model()
    with torch.no_grad():
        original = model(input_ids=ids).logits
    if given == "PeftModel":
        model = get_peft_model(model, adapters)
    with torch.no_grad():
        initial = model(input_ids=ids).logits  # the policy as given (PiSSA: W_res + BA = W up to rounding)
    args = config(tmp_path, max_steps=2, beta=0.04)
    trainer = GRPOTrainer(model, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer,
                          peft_config=adapters if given == "peft_config" else None)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        start = policy(input_ids=ids).logits
        with as_reference(policy):
            reference = policy(input_ids=ids).logits
    assert torch.equal(reference, start)  # π_ref = the policy as it starts, bit for bit
    if init == "pissa":
        torch.testing.assert_close(start, original, rtol=0, atol=1e-4)  # PiSSA's split keeps the model's function
    if given == "PeftModel":
        assert torch.equal(start, initial)  # the wrapping left the given policy as it was
    trainer.train()
    metrics = {r["step"]: r for r in read_metrics(trainer.args.output_dir)}
    assert metrics[1]["kl"] == 0.0 and metrics[2]["kl"] > 0


def test_a_folder_of_saved_adapters_as_model_is_refused_before_it_loads(tmp_path, tokenizer, make_model, prompts):
    """transformers loads an adapter folder onto its base with the adapters frozen: the run failed after the load with
    "no trainable parameters … unfreeze what should train" (TRL: "Unrecognized model … should have a model_type key")."""
    base, saved = str(tmp_path / "base"), str(tmp_path / "adapters")
    make_model().save_pretrained(base)
    tokenizer.save_pretrained(base)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora()).save_pretrained(saved)
    message = (rf"model '{saved}' is a folder of peft adapters \(adapter_config.json, base model '{base}'\), which would load frozen onto "
               rf"the base, training nothing. To train these adapters further pass model=PeftModel.from_pretrained\(AutoModelForCausalLM"
               rf".from_pretrained\('{base}'\), '{saved}', is_trainable=True\); to train new adapters pass model='{base}' with peft_config.")
    for peft_config in (None, lora()):
        with pytest.raises(ValueError, match=message):
            GRPOTrainer(saved, reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer, peft_config=peft_config)
    # The fix the message gives trains the saved adapters (and only them).
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), saved, is_trainable=True)
    trainer = GRPOTrainer(model, reward_even_tokens, args=config(tmp_path, max_steps=1), train_dataset=prompts, processing_class=tokenizer)
    assert {n for n, p in trainer.model.named_parameters() if p.requires_grad} == {n for n in dict(model.named_parameters()) if "lora_" in n}


@pytest.mark.parametrize("adapters", [["mine"], ["default", "mine"]])
def test_resume_restores_the_active_adapter_whatever_its_name(tmp_path, tokenizer, make_model, prompts, adapters):
    """peft saves the adapter named "default" at the folder's top and any other in a subfolder of its name. Resuming read the
    top file into "default" only: a lone adapter named "mine" was refused ("holds no adapters … saved by a run without
    peft_config"), and beside an untrained "default" the trained "mine" silently restarted from its initial weights."""
    def build():
        model = get_peft_model(make_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], task_type="CAUSAL_LM"),
                               adapter_name=adapters[0])
        if len(adapters) == 2:
            model.add_adapter("mine", LoraConfig(r=4, lora_alpha=8, target_modules=["v_proj"], task_type="CAUSAL_LM"))
            model.set_adapter("mine")  # the one that trains
        return model

    def trainer():
        return GRPOTrainer(build(), reward_even_tokens, args=config(tmp_path, max_steps=2, save_steps=1), train_dataset=prompts,
                           processing_class=tokenizer)

    full = trainer()
    full.train()
    final = {n: p.detach().clone() for n, p in full.model.named_parameters() if "lora_" in n}
    assert os.path.exists(os.path.join(full.args.output_dir, "checkpoint-1", "mine", "adapter_model.safetensors"))
    os.rename(os.path.join(full.args.output_dir, "metrics.jsonl"), os.path.join(full.args.output_dir, "metrics-full.jsonl"))
    resumed = trainer()
    resumed.train(resume_from_checkpoint=os.path.join(full.args.output_dir, "checkpoint-1"))
    params = dict(resumed.model.named_parameters())
    assert any(".mine." in n and "lora_B" in n and v.any() for n, v in final.items())  # "mine" trained
    for name, value in final.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-7, msg=name)


@pytest.mark.parametrize("bias", ["all", "lora_only"])
def test_trained_biases_outside_the_adapters_are_refused_with_a_reference(tmp_path, tokenizer, prompts, bias):
    """peft's bias="all" / "lora_only" trains the base model's biases, which disabling the adapters does not undo: π_ref
    moved with the policy (a Llama with attention biases, 2 steps at lr 1e-2: its logits moved by 0.54 / 0.0008)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def biased():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, attention_bias=True))

    adapters = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], bias=bias, task_type="CAUSAL_LM")
    first = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias"
    with pytest.raises(ValueError, match=rf"beta > 0 with (8|2) trained parameters outside the adapters \({first}, .*\): π_ref is the same model "
                                         rf"with its adapters disabled, so it would move with them; set bias='none' in the peft_config \(it is "
                                         rf"'{bias}': peft trains the base model's biases\), or set beta=0."):
        GRPOTrainer(biased(), reward_even_tokens, args=config(tmp_path, beta=0.04), train_dataset=prompts, processing_class=tokenizer, peft_config=adapters)
    given = get_peft_model(biased(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    given.get_base_model().model.norm.weight.requires_grad_(True)  # unfrozen by hand
    with pytest.raises(ValueError, match=r"beta > 0 with 1 trained parameters outside the adapters \(base_model.model.model.norm.weight\): .*; "
                                         r"freeze them \(requires_grad_\(False\)\) or name their modules in the peft_config's modules_to_save, or set beta=0."):
        GRPOTrainer(given, reward_even_tokens, args=config(tmp_path, beta=0.04), train_dataset=prompts, processing_class=tokenizer)
    # Without π_ref they train as asked, as under TRL; modules_to_save are the adapter's own (π_ref keeps their initial copy).
    trainer = GRPOTrainer(biased(), reward_even_tokens, args=config(tmp_path, max_steps=1), train_dataset=prompts, processing_class=tokenizer, peft_config=adapters)
    assert trainer.model.get_parameter(first).requires_grad
    GRPOTrainer(biased(), reward_even_tokens, args=config(tmp_path, beta=0.04), train_dataset=prompts, processing_class=tokenizer,
                peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head"], task_type="CAUSAL_LM"))


def test_adapters_on_a_head_tied_to_the_embedding_are_refused(tmp_path, tokenizer, make_model, prompts):
    """The tied head's ΔW merged into the shared tensor moved the embedding too: after trained adapters (std 0.5), the merged
    save's logits were off by ≈ 180 and the bf16 sampler's copy by ≈ 45 (TRL refuses adapters on lm_head, tied or not)."""
    adapters = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"], task_type="CAUSAL_LM")
    message = (r"peft_config.target_modules=\{'(q_proj', 'lm_head|lm_head', 'q_proj)'\} puts adapters on 'lm_head', whose weight is the input embedding's "
               r"\(tie_word_embeddings=True\): .* Drop 'lm_head' from target_modules \(TRL refuses adapters on it\), or train it in full "
               r"with modules_to_save=\['lm_head'\].")
    make_model().save_pretrained(str(tmp_path / "folder"))
    tokenizer.save_pretrained(str(tmp_path / "folder"))
    for model in (str(tmp_path / "folder"), make_model()):  # the folder: found on the weightless copy, before the load
        with pytest.raises(ValueError, match=message):
            GRPOTrainer(model, reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer, peft_config=adapters)
    # An untied head trains its adapters, and merges exactly.
    trainer = trainer_with_lora(tmp_path, lambda: tiny_model(tokenizer, tied=False), tokenizer, prompts, peft_config=adapters, max_steps=1)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.normal_(std=0.5)
        ids = torch.tensor([[1, 200, 300, 400, 500]])
        trainer.save_model(str(tmp_path / "merged"), merge_adapters=True)
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
        torch.testing.assert_close(merged(input_ids=ids).logits, policy(input_ids=ids).logits, rtol=0, atol=1e-4)
