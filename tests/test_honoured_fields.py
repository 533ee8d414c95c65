"""TRL fields fastgrpo honours beyond the core loop: optim, data_seed, chat_template_kwargs,
eval_on_start, scheduler kwargs, and readable saved files. Tiny model, 1–2 optimizer steps each."""

import os
import stat

import pytest
import torch

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.rollout.prompts import PromptEncoder


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_prompt_length=32,
        max_completion_length=4, max_steps=1, learning_rate=1e-3, logging_steps=1, save_steps=1, disable_tqdm=True, seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


@pytest.mark.parametrize("optim,cls", [("sgd", torch.optim.SGD), ("adamw_torch_fused", torch.optim.AdamW), ("adafactor", None)])
def test_optim_builds_transformers_optimizer(tmp_path, tokenizer, make_model, prompts, optim, cls):
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, optim=optim), train_dataset=prompts, processing_class=tokenizer)
    inner = trainer.optimizer.optimizer  # accelerate's wrapper holds the real one
    if cls is not None:
        assert type(inner) is cls
    else:
        assert type(inner).__name__ == "Adafactor"
    assert inner.param_groups[0]["lr"] == pytest.approx(1e-3)  # learning_rate reaches every optimizer


def test_unknown_optim_is_refused_before_the_model_loads(tmp_path, prompts):
    with pytest.raises(ValueError, match="optim='adam_wrong' is not a transformers optimizer name"):
        GRPOTrainer("/no/such/model", reward_even_tokens, args=config(tmp_path, optim="adam_wrong"), train_dataset=prompts)


def test_data_seed_sets_the_prompt_order_apart_from_seed(tmp_path, tokenizer, make_model, prompts):
    def first_prompts(**kw):
        t = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, **kw), train_dataset=prompts, processing_class=tokenizer)
        return t.order.take(8)

    assert first_prompts(seed=0, data_seed=5) == first_prompts(seed=1, data_seed=5)  # data_seed alone decides the order
    assert first_prompts(seed=0) != first_prompts(seed=0, data_seed=5)


def test_chat_template_kwargs_reach_the_template(tokenizer):
    # SmolLM2's template ignores unknown variables, so give one that changes the text: a template reading `greeting`.
    tok = tokenizer
    saved = tok.chat_template
    try:
        tok.chat_template = "{{ greeting | default('none') }}:{% for m in messages %}{{ m['content'] }}{% endfor %}"
        messages = [{"role": "user", "content": "hi"}]
        assert PromptEncoder(tok, None).render(messages) == "none:hi"
        assert PromptEncoder(tok, None, {"greeting": "hello"}).render(messages) == "hello:hi"
    finally:
        tok.chat_template = saved


def test_eval_on_start_and_readable_saved_files(tmp_path, tokenizer, make_model, prompts):
    args = config(tmp_path, eval_on_start=True, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": 1e-4})
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(2)), processing_class=tokenizer)
    trainer.train()
    assert trainer.state.log_history[0]["step"] == 0 and "eval_reward" in trainer.state.log_history[0]
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-4)  # one step of one: cosine down to min_lr
    trainer.save_model(str(tmp_path / "final"))
    for folder in (tmp_path / "final", tmp_path / "out" / "checkpoint-1"):
        mode = stat.S_IMODE(os.stat(folder / "model.safetensors").st_mode)
        assert mode & stat.S_IROTH, oct(mode)  # readable by others, as config.json is


def test_use_cpu_trains_on_the_cpu(tmp_path, tokenizer, make_model, prompts):
    # TRL 1.16 on a machine without GPUs builds no GRPOConfig without use_cpu=True, so TRL's CPU scripts all set it.
    args = config(tmp_path, use_cpu=True)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert trainer.accelerator.device.type == "cpu" and args.device.type == "cpu"
    assert trainer.train().global_step == 1 and next(trainer.model.parameters()).device.type == "cpu"
