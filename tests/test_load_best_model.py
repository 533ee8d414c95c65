"""load_best_model_at_end as transformers' Trainer: TrainingArguments' checks, the best checkpoint's weights (or a LoRA
policy's adapters) back in the policy after train(), pruning that keeps the best, and the sampler's copy refreshed.

Each run is 3 optimizer steps of the tiny model from conftest.py, a checkpoint and an evaluation after every step.
"""

import os
import warnings

import pytest
import torch
from peft import get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import TrainerCallback, TrainingArguments

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.generation import build
from fastgrpo.generation.contract import SamplingSettings
from fastgrpo.generation.vllm.engines import Completion
from fastgrpo.model.loading import is_peft_model, lora_config
from fastgrpo.model.sharding import load_sharded, save_sharded


@pytest.mark.parametrize("given", [
    dict(eval_strategy="steps", eval_steps=5, save_steps=10),
    dict(eval_strategy="steps", logging_steps=5, save_steps=10),  # eval_steps from logging_steps, then checked
    dict(eval_strategy="epoch", save_strategy="epoch"),
    dict(eval_strategy="no", save_strategy="no"),  # nothing to load: accepted (fastgrpo warns that it does nothing)
    dict(eval_strategy="steps", eval_steps=0.2, save_steps=0.6),
    dict(eval_strategy="steps", eval_steps=0.5, save_steps=10),  # transformers' rule passes it: 10 % 0.5 == 0
    dict(eval_strategy="steps", eval_steps=5, save_steps=10, metric_for_best_model="eval_reward"),
    dict(eval_strategy="steps", eval_steps=5, save_steps=10, metric_for_best_model="reward", greater_is_better=False),
    dict(),  # eval_strategy "no", save_strategy "steps": refused
    dict(eval_strategy="steps", save_strategy="epoch"),
    dict(eval_strategy="steps", eval_steps=3, save_steps=10),
    dict(eval_strategy="steps", logging_steps=3, save_steps=10),
    dict(eval_strategy="steps", eval_steps=0.3, save_steps=2),  # a fraction and steps
    dict(eval_strategy="steps", eval_steps=0.3, save_steps=0.5),
    dict(eval_strategy="steps", eval_steps=3, save_strategy="best"),  # "best" saves the evaluated steps: no strategy or step rule
    dict(eval_strategy="epoch", save_strategy="best", metric_for_best_model="reward"),
])
def test_config_is_accepted_or_refused_as_transformers_training_arguments(tmp_path, given):
    try:
        theirs = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], load_best_model_at_end=True, **given)
    except ValueError:
        theirs = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if theirs is None:
            with pytest.raises(ValueError, match=r"load_best_model_at_end=True needs .*(eval_strategy=|save_steps=)"):
                GRPOConfig(load_best_model_at_end=True, **given)
            return
        ours = GRPOConfig(load_best_model_at_end=True, **given)
    assert (ours.metric_for_best_model, ours.greater_is_better) == (theirs.metric_for_best_model, theirs.greater_is_better)
    if "metric_for_best_model" not in given:
        assert (ours.metric_for_best_model, ours.greater_is_better) == ("loss", False)  # transformers' default: eval_loss, lower


def eval_reward_falls(prompts, completions, completion_ids, trainer_state, **kwargs):
    """10 − global_step, plus under 0.1 for even tokens (so the groups' rewards differ and the weights move): evaluations
    after steps 1, 2, 3 score 9.x, 8.x, 7.x."""
    return [10.0 - trainer_state.global_step + 0.1 * sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


class Saved(TrainerCallback):
    """The policy's trainable weights at each save, and the checkpoint folders at each step's start."""

    def __init__(self, policy):
        self.policy, self.weights, self.folders = policy, {}, {}

    def on_save(self, args, state, control, **kwargs):
        self.weights[state.global_step] = trainable(self.policy)

    def on_step_begin(self, args, state, control, **kwargs):
        self.folders[state.global_step] = folders(args.output_dir)


def trainable(model):
    return {k: v.detach().clone() for k, v in (get_peft_model_state_dict(model) if is_peft_model(model) else model.state_dict()).items()}


def folders(path):
    return sorted((n for n in os.listdir(path) if n.startswith("checkpoint-")), key=lambda n: int(n.split("-")[1]))


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def run(tmp_path, tokenizer, model, prompts, peft_config=None, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_prompt_length=32, max_completion_length=2,
        max_steps=3, learning_rate=1e-2, save_steps=1, eval_strategy="steps", eval_steps=1, save_total_limit=1, disable_tqdm=True,
        report_to="none", load_best_model_at_end=True, seed=0,
    )
    trainer = GRPOTrainer(model, eval_reward_falls, args=GRPOConfig(**{**values, **overrides}), train_dataset=prompts,
                          eval_dataset=prompts.select(range(1)), processing_class=tokenizer, peft_config=peft_config)
    saved = Saved(trainer.accelerator.unwrap_model(trainer.model))
    trainer.add_callback(saved)
    trainer.train()
    return trainer, saved


@pytest.mark.parametrize("metric, lora", [("eval_reward", False), (None, False), ("eval_reward", True)])
def test_the_best_checkpoints_weights_are_the_policys_after_training(tmp_path, tokenizer, make_model, prompts, metric, lora):
    trainer, saved = run(tmp_path, tokenizer, make_model(), prompts, lora_config(lora_r=4, lora_alpha=8) if lora else None,
                         metric_for_best_model=metric)
    evals = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert [r["step"] for r in evals] == [1, 2, 3]
    if metric == "eval_reward":  # rewards 9, 8, 7: step 1 is the best
        best = 1
    else:  # transformers' default: the lowest eval_loss
        best = min(evals, key=lambda r: r["eval_loss"])["step"]
        assert trainer.state.best_metric == min(r["eval_loss"] for r in evals)
    assert trainer.state.best_model_checkpoint == os.path.join(trainer.args.output_dir, f"checkpoint-{best}")
    if best == 1:  # save_total_limit=1: the best and the newest during training, the best alone after it (transformers' rotation)
        assert saved.folders[2] == ["checkpoint-1", "checkpoint-2"]
    assert folders(trainer.args.output_dir) == [f"checkpoint-{best}"]
    policy = trainer.accelerator.unwrap_model(trainer.model)
    now = trainable(policy)
    assert same(now, saved.weights[best])
    others = [s for s in saved.weights if s != best]
    assert others and not any(same(now, saved.weights[s]) for s in others)  # the last step's weights are not what is left
    on_disk = load_file(os.path.join(trainer.state.best_model_checkpoint, "adapter_model.safetensors" if lora else "model.safetensors"))
    assert all(torch.equal(now[k], on_disk[k]) for k in on_disk)


def test_only_the_scheduled_evaluations_are_candidates_as_in_trainer(tmp_path, tokenizer, make_model, prompts):
    # eval_on_start scores 10.x at step 0, above every training evaluation (9.x, 8.x, 7.x), and there is no checkpoint-0:
    # Trainer picks the best among the evaluations its schedule runs (_maybe_log_save_evaluate), so checkpoint-1 is loaded, as
    # TRL 1.16's GRPOTrainer does on this setup (it was step 0: no best checkpoint, the last step's weights kept).
    trainer, saved = run(tmp_path, tokenizer, make_model(), prompts, metric_for_best_model="eval_reward", eval_on_start=True)
    assert [r["step"] for r in trainer.state.log_history if "eval_reward" in r] == [0, 1, 2, 3]
    assert trainer.state.best_global_step == 1 and trainer.state.best_metric < 10
    assert trainer.state.best_model_checkpoint == os.path.join(trainer.args.output_dir, "checkpoint-1")
    assert same(trainable(trainer.accelerator.unwrap_model(trainer.model)), saved.weights[1])
    # evaluate() called by a script (a test split here) is no candidate either: it reports test_*, not eval_reward (a ValueError before)
    best = trainer.state.best_metric
    assert "test_reward" in trainer.evaluate(prompts.select(range(1)), metric_key_prefix="test") and trainer.state.best_metric == best


def test_save_strategy_best_saves_at_each_new_best_alone_as_trainer(tmp_path, tokenizer, make_model, prompts):
    # eval rewards 9.x, 8.x, 7.x after steps 1–3: only step 1's improves on the best, so checkpoint-1 alone is written (no save at
    # the last step), then loaded; TRL 1.16's GRPOTrainer writes the same checkpoints on this setup.
    trainer, saved = run(tmp_path, tokenizer, make_model(), prompts, save_strategy="best", metric_for_best_model="eval_reward", save_total_limit=None)
    assert sorted(saved.weights) == [1] and folders(trainer.args.output_dir) == ["checkpoint-1"]
    assert trainer.state.best_model_checkpoint == os.path.join(trainer.args.output_dir, "checkpoint-1")
    assert same(trainable(trainer.accelerator.unwrap_model(trainer.model)), saved.weights[1])


def test_save_strategy_best_needs_a_metric_and_an_evaluation():
    with pytest.raises(ValueError, match=r"save_strategy='best' .*metric_for_best_model, which is None; name it"):
        GRPOConfig(save_strategy="best", eval_strategy="steps")  # Trainer's rule, raised when the trainer is built there
    with pytest.warns(UserWarning, match=r"save_strategy='best' has no effect while eval_strategy='no'"):
        GRPOConfig(save_strategy="best", metric_for_best_model="reward")
    with pytest.raises(ValueError, match=r"save_strategy='bset': use one of no, steps, epoch, best"):
        GRPOConfig(save_strategy="bset")


def test_without_it_the_last_steps_weights_stay(tmp_path, tokenizer, make_model, prompts):
    trainer, saved = run(tmp_path, tokenizer, make_model(), prompts, load_best_model_at_end=False, metric_for_best_model="eval_reward")
    assert trainer.state.best_global_step == 1
    assert same(trainer.accelerator.unwrap_model(trainer.model).state_dict(), saved.weights[3])


def test_the_sampler_gets_the_best_weights_at_its_next_use(tmp_path, tokenizer, make_model, prompts):
    trainer, saved = run(tmp_path, tokenizer, make_model(), prompts, metric_for_best_model="eval_reward")
    pushed = []
    trainer.backend.update_weights = lambda policy: pushed.append(trainable(policy))
    trainer.evaluate()  # samples: its weight copy (the bf16 sampler's, vLLM's) is refreshed from the loaded weights first
    assert len(pushed) == 1 and same(pushed[0], saved.weights[1])


class FolderEngine:
    """A stand-in for the colocated vLLM engine (generation/vllm/engines.Engine): starts from the weights folder build_backend
    writes, as vLLM loads it, and takes pushes; samples one token per completion."""

    description, pushes_weights, max_model_len = "the stand-in engine", True, None

    def __init__(self, folder, **settings):
        self.weights, self.closed = load_file(os.path.join(folder.path, "model.safetensors")), False

    def generate(self, prompts, params):
        return [[Completion([5], [-1.0])] * params["n"] for _ in prompts]

    def push(self, weights):
        self.weights = {k: v.clone() for k, v in weights.items()}

    def close(self):
        self.closed = True


def test_a_colocated_vllm_engine_stopped_by_train_starts_again_with_the_policys_weights(tokenizer, make_model, monkeypatch):
    # train() stops the colocated engine at its end (its memory back); evaluate() after it, which load_best_model_at_end says
    # samples from the best weights, failed: "vLLM in this process stopped during the weight sync" (TRL's engine is never
    # stopped). Its next use now starts it again from the policy's weights as they are then.
    monkeypatch.setattr(build, "ColocateEngine", FolderEngine)
    policy = make_model()
    args = GRPOConfig(use_vllm=True, vllm_mode="colocate", max_completion_length=2)
    sampling = SamplingSettings(max_completion_length=2, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    backend = build.build_backend(args, policy, sampling, bf16=False, tokenizer=tokenizer)
    first = backend.engine
    backend.close()  # train()'s end
    with torch.no_grad():
        policy.model.norm.weight.add_(1.0)  # the best checkpoint's weights loaded, say
    backend.update_weights(policy)  # evaluate()'s sync
    assert first.closed and backend.engine is not first and torch.equal(backend.engine.weights["model.norm.weight"], policy.model.norm.weight)
    backend.close()
    out = backend.sample(torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.long), 2)  # a use without a sync starts it too
    assert out.completion_ids.tolist() == [[5], [5]] and not backend.engine.closed


def test_fsdp_shards_load_the_weights_alone(tmp_path):
    """`load_sharded` without an optimizer (an FSDP policy's best checkpoint): the weights, not the optimizer's state."""
    torch.manual_seed(0)
    saved = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(saved.parameters())
    saved(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.distributed.checkpoint on one process without a process group says so
        save_sharded(str(tmp_path), saved, optimizer)
        loaded = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        load_sharded(str(tmp_path), loaded, None)
    assert same(loaded.state_dict(), saved.state_dict())
