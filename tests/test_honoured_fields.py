"""TRL fields fastgrpo honours beyond the core loop: optim, data_seed, chat_template_kwargs,
eval_on_start, scheduler kwargs, and readable saved files. Tiny model, 1–2 optimizer steps each."""

import json
import math
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


CUSTOM_CODE = {  # a model folder's own code (config auto_map), as hub models ship it: Llama under another model_type
    "configuration_tiny.py": "from transformers import LlamaConfig\n\n\nclass TinyConfig(LlamaConfig):\n    model_type = 'tiny_custom'\n",
    "modeling_tiny.py": (
        "import torch\nfrom transformers import LlamaForCausalLM, LlamaForSequenceClassification, LlamaModel, LlamaPreTrainedModel\n\n"
        "from .configuration_tiny import TinyConfig\n\n\n"
        "class TinyForCausalLM(LlamaForCausalLM):\n    config_class = TinyConfig\n\n\n"
        "class TinyForSequenceClassification(LlamaForSequenceClassification):\n    config_class = TinyConfig\n\n"
        "    def __init__(self, config):  # its body built directly (transformers' builds it with AutoModel, which knows no TinyConfig)\n"
        "        LlamaPreTrainedModel.__init__(self, config)\n        self.num_labels = config.num_labels\n"
        "        self.model = LlamaModel(config)\n        self.score = torch.nn.Linear(config.hidden_size, config.num_labels, bias=False)\n"
        "        self.post_init()\n"
    ),
}


def custom_code_folder(folder, model, tokenizer, head: str) -> str:
    """`model` saved with CUSTOM_CODE as its classes: loading it needs trust_remote_code."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for name, code in CUSTOM_CODE.items():
        (folder / name).write_text(code)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="tiny_custom", architectures=[f"Tiny{head}"],
                  auto_map={"AutoConfig": "configuration_tiny.TinyConfig", f"AutoModel{head}": f"modeling_tiny.Tiny{head}"})
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_trust_remote_code_loads_a_models_own_code_for_the_policy_and_a_reward_model(tmp_path, tokenizer, make_model, prompts):
    # TRL's GRPOTrainer passes args.trust_remote_code to the policy's, its tokenizer's and reward models' from_pretrained
    # (model_init_kwargs.setdefault); it was refused here ("pass model_init_kwargs={'trust_remote_code': True}").
    from transformers import LlamaForSequenceClassification

    policy = custom_code_folder(tmp_path / "policy", make_model(), tokenizer, "ForCausalLM")
    scorer = make_model().config
    scorer.num_labels, scorer.pad_token_id = 1, tokenizer.pad_token_id
    rm = custom_code_folder(tmp_path / "rm", LlamaForSequenceClassification(scorer), tokenizer, "ForSequenceClassification")
    with pytest.raises(ValueError, match="trust_remote_code=True"):  # transformers' refusal: without it the folder's code never runs
        GRPOTrainer(policy, reward_even_tokens, args=config(tmp_path), train_dataset=prompts)
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        GRPOTrainer(make_model(), rm, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    trainer = GRPOTrainer(policy, [reward_even_tokens, rm], args=config(tmp_path, trust_remote_code=True), train_dataset=prompts)
    assert type(trainer.accelerator.unwrap_model(trainer.model)).__name__ == "TinyForCausalLM"
    assert type(trainer.reward_funcs[1].model).__name__ == "TinyForSequenceClassification"
    trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(trainer.state.log_history[0]["loss"])
    explicit = config(tmp_path, trust_remote_code=True, model_init_kwargs={"trust_remote_code": False})  # model_init_kwargs wins, as TRL
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        GRPOTrainer(policy, reward_even_tokens, args=explicit, train_dataset=prompts, processing_class=tokenizer)


def test_full_determinism_turns_on_torchs_deterministic_algorithms_and_the_run_repeats(tmp_path, tokenizer, make_model, prompts):
    # Trainer calls enable_full_determinism(seed) for it; it was refused here. Every op of a run has a deterministic form.
    losses = []
    try:
        for run in ("a", "b"):
            trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, output_dir=str(tmp_path / run), full_determinism=True,
                                  save_strategy="no", max_steps=2), train_dataset=prompts, processing_class=tokenizer)
            assert torch.are_deterministic_algorithms_enabled()
            trainer.train()
            losses.append([r["loss"] for r in trainer.state.log_history if "loss" in r])
    finally:
        torch.use_deterministic_algorithms(False)  # a process-wide switch, as in transformers: off again for the other tests
    assert len(losses[0]) == 2 and losses[0] == losses[1]
