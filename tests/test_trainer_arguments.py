"""GRPOTrainer takes TRL 1.16's constructor arguments, in TRL's order, with their meanings: a TRL script's call
runs unchanged. `optimizers=(optimizer, lr_scheduler)` and `quantization_config` end to end on a tiny model."""

import inspect
import warnings

import pytest
import torch
from peft import LoraConfig
from transformers import BitsAndBytesConfig

from fastgrpo import GRPOConfig, GRPOTrainer


def reward_even(completion_ids, **kwargs):
    """Fraction of even token ids: varies across a group, so every step has a gradient."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=4,
                  max_prompt_length=32, max_completion_length=4, max_steps=2, learning_rate=1e-3, save_steps=1000, disable_tqdm=True, seed=0)
    values.update(overrides)
    return GRPOConfig(**values)


def test_the_constructors_take_trls_arguments_in_trls_order_with_trls_defaults():
    import trl
    from trl.experimental.async_grpo import AsyncGRPOTrainer as TRLAsync

    from fastgrpo.experimental.async_grpo import AsyncGRPOTrainer

    for ours, theirs in [(GRPOTrainer, trl.GRPOTrainer), (AsyncGRPOTrainer, TRLAsync)]:
        mine, trls = inspect.signature(ours.__init__).parameters, inspect.signature(theirs.__init__).parameters
        assert list(mine) == list(trls), ours.__name__
        assert {n: p.default for n, p in mine.items()} == {n: p.default for n, p in trls.items()}, ours.__name__


def test_a_given_optimizer_and_scheduler_are_the_ones_that_step(tmp_path, tokenizer, make_model, prompts):
    # A schedule of 0 keeps SGD's learning rate at 0 from the first step: the weights must not move.
    model = make_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.0)
    trainer = GRPOTrainer(model, reward_even, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer,
                          optimizers=(optimizer, scheduler))
    assert trainer.scheduler is scheduler
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_a_given_optimizer_without_scheduler_gets_the_configs_schedule(tmp_path, tokenizer, make_model, prompts):
    model = make_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    trainer = GRPOTrainer(model, reward_even, args=config(tmp_path, lr_scheduler_type="constant"), train_dataset=prompts,
                          processing_class=tokenizer, optimizers=(optimizer, None))
    assert trainer.scheduler.optimizer is optimizer
    trainer.train()
    assert optimizer.param_groups[0]["lr"] == 0.5  # SGD's own rate under a constant schedule, not args.learning_rate
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_optimizers_that_cannot_drive_the_model_are_refused_before_loading(tmp_path, tokenizer, make_model, prompts):
    from peft import LoraConfig

    model, other = make_model(), make_model(1)
    own = torch.optim.SGD(model.parameters(), lr=0.1)
    cases = [
        (dict(model=model, optimizers=own), TypeError, "optimizers has type SGD; give a pair"),
        (dict(model=model, optimizers=(own,)), TypeError, "of length 1"),
        (dict(model=model, optimizers=(own, torch.optim.lr_scheduler.ReduceLROnPlateau(own))), ValueError, "ReduceLROnPlateau"),
        (dict(model=model, optimizers=(None, torch.optim.lr_scheduler.LambdaLR(own, lambda s: 1.0))), ValueError, "pass that optimizer too"),
        (dict(model=model, optimizers=("sgd", None)), TypeError, "torch.optim.Optimizer"),
        (dict(model=model, optimizers=(own, "linear")), TypeError, "LRScheduler"),
        (dict(model=model, optimizers=(own, torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(other.parameters(), lr=0.1), lambda s: 1.0))), ValueError, "another optimizer"),
        (dict(model="no-such-model-name", optimizers=(own, None)), ValueError, "a name"),
        (dict(model=model, optimizers=(torch.optim.SGD(other.parameters(), lr=0.1), None)), ValueError, "not the model's"),
        (dict(model=model, optimizers=(own, None), peft_config=LoraConfig(r=4, target_modules=["q_proj"])), ValueError, "peft"),
    ]
    for kwargs, error, words in cases:
        with pytest.raises(error, match=words):
            GRPOTrainer(reward_funcs=reward_even, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer, **kwargs)


def test_quantization_config_reaches_from_pretrained_for_a_name_and_is_ignored_for_a_model(tmp_path, tokenizer, make_model, prompts):
    q = BitsAndBytesConfig(load_in_4bit=True)
    folder = str(tmp_path / "tiny")
    make_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(ValueError, match="both as a trainer argument and in args.model_init_kwargs"):
        GRPOTrainer(folder, reward_even, args=config(tmp_path, model_init_kwargs={"quantization_config": q}), train_dataset=prompts,
                    quantization_config=q)
    # This machine has no bitsandbytes: transformers refuses the 4-bit load, which shows the config reached it (one line
    # naming the option, not transformers' ImportError from inside the loader).
    with pytest.raises(ValueError, match="cannot load the model with quantization_config .* requires bitsandbytes"):
        GRPOTrainer(folder, reward_even, args=config(tmp_path), train_dataset=prompts, quantization_config=q, peft_config=LoraConfig(r=4))
    # Without adapters nothing could train: refused before the load (transformers' Trainer refuses it after), either place.
    for where in ({"quantization_config": q}, {"args": config(tmp_path, model_init_kwargs={"quantization_config": q.to_dict()})}):
        with pytest.raises(ValueError, match=f"quantization_config loads '{folder}' quantized by bitsandbytes, but no peft_config was given"):
            GRPOTrainer(folder, reward_even, train_dataset=prompts, **{"args": config(tmp_path), **where})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOTrainer(make_model(), reward_even, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer, quantization_config=q)
    assert any("quantization_config is ignored" in str(w.message) for w in caught)



@pytest.mark.parametrize("bits", ["load_in_4bit", "load_in_8bit"])
def test_load_in_bits_in_model_init_kwargs_names_quantization_config(tmp_path, tokenizer, make_model, prompts, bits):
    # QLoRA scripts from older transformers pass load_in_4bit to from_pretrained; transformers 5 hands it to the model's
    # __init__, which failed with a bare "LlamaForCausalLM.__init__() got an unexpected keyword argument 'load_in_4bit'".
    folder = str(tmp_path / "tiny")
    make_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(ValueError, match=rf"model_init_kwargs\['{bits}'\] is not a from_pretrained argument \(.*unexpected keyword argument '{bits}'\); "
                                         rf"transformers takes {bits} only inside quantization_config: pass quantization_config=BitsAndBytesConfig\({bits}=True\) "
                                         r"to the trainer \(with a peft_config: QLoRA\)."):
        GRPOTrainer(folder, reward_even, args=config(tmp_path, model_init_kwargs={bits: True}), train_dataset=prompts, peft_config=LoraConfig(r=4))


def test_resume_keeps_a_given_optimizers_own_learning_rates_and_any_scheduler(tmp_path, tokenizer, make_model, prompts):
    # Trainer restores a caller's optimizer and scheduler as saved; args.learning_rate (1e-3 here) applies only
    # to an optimizer fastgrpo built. Two groups: 0.05 and a frozen 0.0, halved every step by StepLR (no lr_lambdas).
    def build():
        model = make_model()
        first = [p for n, p in model.named_parameters() if "layers.0" in n]
        rest = [p for n, p in model.named_parameters() if "layers.0" not in n]
        optimizer = torch.optim.SGD([{"params": first, "lr": 0.05}, {"params": rest, "lr": 0.0}])
        return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    model, optimizer, scheduler = build()
    GRPOTrainer(model, reward_even, args=config(tmp_path, max_steps=2, save_steps=1), train_dataset=prompts, processing_class=tokenizer,
                optimizers=(optimizer, scheduler)).train()
    model, optimizer, scheduler = build()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "layers.0" not in n}
    trainer = GRPOTrainer(model, reward_even, args=config(tmp_path, max_steps=3, save_steps=1), train_dataset=prompts,
                          processing_class=tokenizer, optimizers=(optimizer, scheduler))
    trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))
    assert [g["lr"] for g in optimizer.param_groups] == [0.05 * 0.5 ** 3, 0.0]  # three steps of StepLR, from the saved state on
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)  # lr 0 stayed 0


def test_no_args_writes_where_trl_would_the_models_name_then_grpo(tmp_path, monkeypatch, tokenizer, make_model, prompts):
    # TRL: GRPOConfig(f"{model_name}-GRPO") when args is None (its quick start's "Qwen2-0.5B-Instruct-GRPO"); fastgrpo
    # used GRPOConfig()'s grpo-output. The async trainer's "-AsyncGRPO" took str(model): a model instance's whole repr.
    from fastgrpo.run.inputs import default_output_dir

    assert default_output_dir("Qwen/Qwen2-0.5B-Instruct", "GRPO") == "Qwen2-0.5B-Instruct-GRPO"
    assert default_output_dir("/models/tiny/", "AsyncGRPO") == "tiny-AsyncGRPO"
    monkeypatch.chdir(tmp_path)
    model = make_model()
    model.config._name_or_path = "org/tiny-chat"
    trainer = GRPOTrainer(model, reward_even, train_dataset=prompts, processing_class=tokenizer)
    assert trainer.args.output_dir == "tiny-chat-GRPO"
    assert default_output_dir(model, "AsyncGRPO") == "tiny-chat-AsyncGRPO"


def test_model_init_kwargs_dtype_under_either_of_transformers_names(tmp_path, tokenizer, make_model):
    # transformers' older name torch_dtype loaded float32: fastgrpo's float32 default went in as `dtype`, which
    # transformers prefers. Either name now loads bf16; `dtype` wins when both are given, as transformers has it.
    from fastgrpo.model.loading import load_model

    folder = str(tmp_path / "m")
    make_model().save_pretrained(folder)
    for kwargs, dtype in (({}, torch.float32), ({"torch_dtype": "bfloat16"}, torch.bfloat16), ({"dtype": torch.bfloat16}, torch.bfloat16),
                          ({"torch_dtype": torch.bfloat16, "dtype": "float32"}, torch.float32)):
        assert {p.dtype for p in load_model(folder, kwargs).parameters()} == {dtype}, kwargs
