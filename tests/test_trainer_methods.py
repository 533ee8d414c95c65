"""What scripts call on a TRL trainer after (or while) training: transformers.Trainer's helpers, TRL's attributes,
and the logged learning rate and token count as TRL 1.16 logs them.

A parity sweep ran the closing block of TRL's and open-r1's scripts (`trainer.log_metrics("train", metrics)`,
`save_metrics`, `save_state`, `trainer.end()`) and user code reading `trainer.processing_class` or
`trainer.num_generations`: every line failed with an AttributeError, and `trainer.log({...})` hit fastgrpo's
metrics file object.
"""

import json
import math
import os

import numpy as np
import pytest
import torch
import trl
from datasets import Dataset
from transformers import Trainer, TrainerCallback
from test_trainer import config, read_metrics, reward_even_tokens

from fastgrpo import GRPOTrainer
from fastgrpo.trl_methods import TRL_ARGS_ATTRIBUTES
from fastgrpo import trl_methods


def single_digit_prompts():
    """10 chat prompts of one token length each (SmolLM2's tokenizer has one token per digit)."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(10)])


def test_logged_learning_rate_is_the_one_each_step_used_and_num_tokens_counts_as_trl(tmp_path, tokenizer, make_model, capsys):
    """Linear schedule, 1 warm-up step of 3, lr 1e-3: the steps use 0, 1e-3 and 5e-4 (transformers reads the rate
    before the schedule moves on; TRL 1.16 logged [0.0, 1e-05, 5e-06] for lr 1e-5). fastgrpo logged the next step's
    rate (1e-3, 5e-4, 0). `num_tokens` is TRL's state.num_input_tokens_seen: every completion's prompt tokens
    (each of the G copies) plus its own tokens, cumulative; logged as a float, as TRL logs each metric's mean."""
    args = config(tmp_path, max_steps=3, gradient_accumulation_steps=1, warmup_steps=1, lr_scheduler_type="linear", max_prompt_length=64)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=single_digit_prompts(), processing_class=tokenizer)
    out = trainer.train()
    steps = [r for r in read_metrics(args.output_dir) if "learning_rate" in r]
    assert [r["learning_rate"] for r in steps] == [0.0, 1e-3, 5e-4]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Count to 3."}], add_generation_prompt=True, tokenize=False)
    prompt_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    N = args.per_device_train_batch_size  # completions per rollout: one rollout per optimizer step here
    added = [r["num_tokens"] - before for r, before in zip(steps, [0] + [r["num_tokens"] for r in steps])]
    assert added == [N * (prompt_tokens + r["completions/mean_length"]) for r in steps]
    assert trainer.state.num_input_tokens_seen == steps[-1]["num_tokens"]
    assert all(type(r["num_tokens"]) is float for r in steps) and type(trainer.state.num_input_tokens_seen) is int  # TRL's types

    # transformers' helpers, as Trainer binds them: the same functions, so the same files and table
    for name in ("log_metrics", "save_metrics", "save_state", "metrics_format", "get_learning_rates", "get_num_trainable_parameters"):
        assert getattr(GRPOTrainer, name) is getattr(Trainer, name)
    # every step logged (logging_steps=1): train() returns Trainer's summary alone, as TRL (fastgrpo added the last log's keys,
    # so a script's save_metrics("train", …) wrote ≈ 40 more into train_results.json)
    assert set(out.metrics) == {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss", "epoch"}
    trainer.log_metrics("train", out.metrics)
    assert "***** train metrics *****" in capsys.readouterr().out
    trainer.save_metrics("train", out.metrics)
    trainer.save_state()
    with open(os.path.join(args.output_dir, "train_results.json")) as f:
        assert json.load(f)["train_loss"] == out.training_loss
    with open(os.path.join(args.output_dir, "trainer_state.json")) as f:
        assert json.load(f)["global_step"] == 3
    assert trainer.get_learning_rates() == [0.0]  # the schedule's end, after the last step
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()

    trainer.log({"my_metric": 2.5})  # Trainer.log: log_history with epoch and step, metrics.jsonl, on_log
    assert trainer.state.log_history[-1] == {"my_metric": 2.5, "epoch": trainer.state.epoch, "step": 3}
    assert read_metrics(args.output_dir)[-1] == {"step": 3, "my_metric": 2.5}
    trainer.log({"step": 99, "tensor": torch.tensor(1.5), "numpy": np.float32(0.25)})  # Trainer sets the step; numbers as numbers
    assert read_metrics(args.output_dir)[-1] == {"step": 3, "tensor": 1.5, "numpy": 0.25}  # was 99, and a JSON TypeError
    trainer.end()


def test_a_log_before_training_leaves_the_folder_to_the_run(tmp_path, tokenizer, make_model, prompts):
    """trainer.log() before train() wrote metrics.jsonl, and train() then refused the folder as another run's."""
    args = config(tmp_path, max_steps=1)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.log({"dataset_rows": 32})
    assert trainer.state.log_history == [{"dataset_rows": 32, "epoch": 0.0, "step": 0}] and not os.path.exists(args.output_dir + "/metrics.jsonl")
    assert trainer.train().global_step == 1


def test_an_evaluation_before_training_leaves_the_folder_to_the_run(tmp_path, tokenizer, make_model, prompts):
    """trainer.evaluate() before train() (Trainer's baseline evaluation) wrote metrics.jsonl, and train() then refused
    the folder as another run's (found by the break sweep); evaluations once train() has begun are written."""
    args = config(tmp_path, max_steps=1, per_device_eval_batch_size=4)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    before = trainer.evaluate(prompts.select(range(2)))
    assert before["eval_model_preparation_time"] >= 0 and not os.path.exists(args.output_dir + "/metrics.jsonl")
    assert [r["step"] for r in trainer.state.log_history if "eval_loss" in r] == [0]
    assert trainer.train().global_step == 1
    trainer.evaluate(prompts.select(range(2)))
    records = [json.loads(line) for line in open(args.output_dir + "/metrics.jsonl")]
    assert [r["step"] for r in records if "eval_loss" in r] == [1]


def test_trls_attributes_read_the_runs_arguments(tmp_path, tokenizer, make_model, prompts):
    """TRL's GRPOTrainer copies these from args in __init__ (asserted on its source), and user code (rollout functions,
    callbacks) reads them: trainer.num_generations, trainer.processing_class, …"""
    source = __import__("inspect").getsource(trl.GRPOTrainer.__init__)
    assert all(f"self.{name} = " in source for name in TRL_ARGS_ATTRIBUTES)
    args = config(tmp_path, beta=0.04, temperature=0.7, epsilon_high=0.28, num_generations_eval=2)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert all(getattr(trainer, name) == getattr(args, name) for name in TRL_ARGS_ATTRIBUTES)
    assert (trainer.num_generations, trainer.beta, trainer.temperature, trainer.loss_type) == (4, 0.04, 0.7, "dapo")
    assert (trainer.epsilon_low, trainer.epsilon_high, trainer.num_generations_eval) == (0.2, 0.28, 2)
    assert trainer.processing_class is trainer.tokenizer and trainer.lr_scheduler is trainer.scheduler
    assert trainer.model_wrapped is trainer.model and trainer.control is trainer.events.control
    assert trainer.callback_handler is trainer.events.handler
    with pytest.raises(AttributeError, match=r"trainer.temperature = 0.5: fastgrpo reads temperature from the run's config once, when the "
                       r"trainer is built, so setting it here would change nothing; give GRPOConfig\(temperature=…\) to a new trainer"):
        trainer.temperature = 0.5  # TRL's plain attribute; a bare "property has no setter" named nothing


def test_trls_attributes_it_fills_in_when_args_leave_them_none(tmp_path, tokenizer, make_model, prompts):
    """TRL sets trainer.max_tool_calling_iterations = sys.maxsize and trainer.chat_template_kwargs = {} when args leave
    them None (asserted on its source), so a rollout_func's `range(trainer.max_tool_calling_iterations)` or
    `apply_chat_template(…, **trainer.chat_template_kwargs)` works; fastgrpo gave None (a TypeError in both) and had
    no chat_template_kwargs attribute at all."""
    import sys

    source = __import__("inspect").getsource(trl.GRPOTrainer.__init__)
    assert "args.max_tool_calling_iterations if args.max_tool_calling_iterations is not None else sys.maxsize" in source
    assert "self.chat_template_kwargs = args.chat_template_kwargs or {}" in source
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    assert (trainer.max_tool_calling_iterations, trainer.chat_template_kwargs) == (sys.maxsize, {})
    args = config(tmp_path, chat_template_kwargs={"enable_thinking": False})
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert trainer.chat_template_kwargs == {"enable_thinking": False} and set(trl_methods.TRL_ARGS_FILLED) == {"max_tool_calling_iterations", "chat_template_kwargs"}
    with pytest.raises(AttributeError, match="trainer.chat_template_kwargs = {}: fastgrpo reads chat_template_kwargs from the run's config once"):
        trainer.chat_template_kwargs = {}


def test_model_card_and_push_to_hub_offline(tmp_path, tokenizer, make_model, prompts, monkeypatch):
    """create_model_card writes README.md with huggingface_hub's metadata; push_to_hub saves the model first, then
    fails in huggingface_hub's own words offline (no hub is reachable here), as Trainer's does."""
    import huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled

    args = config(tmp_path, max_steps=1, gradient_accumulation_steps=1, hub_model_id="me/tiny-grpo")
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.train()
    with pytest.raises(TypeError, match=r"tags=5: give a tag \(str\) or a list of them"):
        trainer.create_model_card(tags=5)
    trainer.create_model_card(dataset_name="counting", tags="tiny")
    card = huggingface_hub.ModelCard.load(os.path.join(args.output_dir, "README.md"))
    assert card.data.tags == ["fastgrpo", "grpo", "tiny"] and card.data.datasets == ["counting"]
    assert "G = 4 completions per prompt, μ = 1, β = 0.0, learning rate 0.001, 1 optimizer steps" in card.text
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    os.remove(os.path.join(args.output_dir, "README.md"))
    with pytest.raises(OfflineModeIsEnabled):
        trainer.push_to_hub()
    assert {"model.safetensors", "README.md", "tokenizer.json"} <= set(os.listdir(args.output_dir))  # saved before the hub was asked


def test_every_checkpoint_writes_trls_model_card_into_output_dir(tmp_path, tokenizer, make_model, prompts):
    """TRL's _save_checkpoint writes README.md (the model card) into output_dir at every save, named after hub_model_id
    or the folder, before the callbacks' on_save: `hf upload output_dir` after a run sends a card. fastgrpo wrote
    none unless the script called create_model_card."""
    import huggingface_hub

    seen = []

    class CardAtSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            seen.append(os.path.exists(os.path.join(args.output_dir, "README.md")))

    args = config(tmp_path, max_steps=1, gradient_accumulation_steps=1)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer,
                          callbacks=[CardAtSave()])
    trainer.train()
    assert seen == [True]
    card = huggingface_hub.ModelCard.load(os.path.join(args.output_dir, "README.md"))
    assert card.data.model_name == "out" and "# out\n" in card.text and "1 optimizer steps" in card.text


def test_checkpoints_keep_a_readme_that_is_not_a_model_card(tmp_path, tokenizer, make_model, prompts):
    """A project's README.md in output_dir (output_dir=".") was replaced by the model card at the first checkpoint (TRL's
    does so too); nothing saved is lost now: it is kept with a warning, and a card a trainer wrote is still replaced."""
    import huggingface_hub

    args = config(tmp_path, max_steps=2, gradient_accumulation_steps=1, save_steps=1)
    os.makedirs(args.output_dir)
    readme = os.path.join(args.output_dir, "README.md")
    with open(readme, "w") as f:
        f.write("---\ntitle: my project\n---\n# My project notes\n")
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    with pytest.warns(UserWarning, match="README.md is not a model card a trainer wrote, so checkpoints leave it as it is"):
        trainer.train()
    assert open(readme).read() == "---\ntitle: my project\n---\n# My project notes\n"
    trainer.create_model_card()  # asked for: replaced, and later checkpoints keep it current
    assert "fastgrpo" in huggingface_hub.metadata_load(readme)["tags"]


def test_a_subclass_overriding_trainers_save_or_optimizer_hooks_is_refused(tmp_path, tokenizer, prompts):
    # transformers' Trainer.save_model writes through _save, its create_optimizer asks get_decay_parameter_names and
    # get_optimizer_cls_and_kwargs, compute_loss_context_manager wraps each loss: subclasses override them (extra files in
    # every save, no decay on norms, a custom optimizer). fastgrpo calls none of them (its own saves; transformers' own
    # get_optimizer_cls_and_kwargs), so each override was silently ignored.
    class Custom(GRPOTrainer):
        def _save(self, output_dir=None, state_dict=None):
            pass

        def get_decay_parameter_names(self, model):
            return []

        @staticmethod
        def get_optimizer_cls_and_kwargs(args, model=None):
            return torch.optim.SGD, {}

    with pytest.raises(TypeError, match=r"Custom overrides _save, get_decay_parameter_names, get_optimizer_cls_and_kwargs: TRL's"):
        Custom("no-such-model", reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)

    class Mixin:
        def compute_loss_context_manager(self):
            return None

    class Mixed(GRPOTrainer, Mixin):  # after GRPOTrainer in the MRO too
        pass

    with pytest.raises(TypeError, match="Mixed overrides compute_loss_context_manager"):
        Mixed("no-such-model", reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)


def test_a_subclass_overriding_log_sees_every_record_the_trainer_logs_as_trls(tmp_path, tokenizer, make_model, prompts):
    """TRL's loop logs through self.log (each logged step, each evaluation, the run's summary), so a subclass overriding
    `log` sees and may change every record; TRL 1.16 called this one 4 times here. fastgrpo's loop logged around it
    (0 calls): the override was silently ignored."""
    calls = []

    class Logged(GRPOTrainer):
        def log(self, logs, start_time=None):
            calls.append(set(logs))
            logs["mine"] = 1.0
            super().log(logs, start_time)

    args = config(tmp_path, max_steps=2, gradient_accumulation_steps=1, eval_strategy="steps", eval_steps=2)
    trainer = Logged(make_model(), reward_even_tokens, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(2)),
                     processing_class=tokenizer)
    trainer.train()
    assert len(calls) == 4 and "step" not in calls[0] and "loss" in calls[0] and "eval_reward" in calls[2] and "train_runtime" in calls[3]
    assert all(r["mine"] == 1.0 for r in trainer.state.log_history) and len(trainer.state.log_history) == 4
    assert [(r["step"], r["mine"]) for r in read_metrics(args.output_dir)] == [(1, 1.0), (2, 1.0), (2, 1.0)]  # no summary line
    assert trainer.evaluate()["mine"] == 1.0 and len(calls) == 5  # evaluate() returns the dict log() was given, as Trainer's


def test_the_model_card_names_no_local_folder_as_its_base_model(tmp_path, tokenizer, make_model, prompts):
    """TRL's create_model_card gives base_model only for a hub id, never a local folder (get_config_model_id, then
    `not os.path.isdir`): the hub refuses a card whose base_model is no model id. fastgrpo's every checkpoint wrote the
    folder's path (for a built-in model, its cache folder) as base_model and in the text, so `hf upload output_dir` sent it."""
    import huggingface_hub

    folder = str(tmp_path / "local-model")
    make_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    args = config(tmp_path, max_steps=1, gradient_accumulation_steps=1, hub_model_id="org/name")
    GRPOTrainer(folder, reward_even_tokens, args=args, train_dataset=prompts).train()
    card = huggingface_hub.ModelCard.load(os.path.join(args.output_dir, "README.md"))
    assert card.data.base_model is None and folder not in card.content and card.data.model_name == "name"
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, output_dir=str(tmp_path / "hub")), train_dataset=prompts,
                          processing_class=tokenizer)
    trainer.model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"  # as from_pretrained of a hub id sets it
    trainer.create_model_card()
    card = huggingface_hub.ModelCard.load(os.path.join(tmp_path, "hub", "README.md"))
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and "Fine-tuned from HuggingFaceTB/SmolLM2-135M-Instruct" in card.text


def test_evaluate_reports_trls_eval_keys(tmp_path, tokenizer, make_model, prompts):
    """The same tiny model, data and config evaluated by TRL 1.16 and fastgrpo: the same keys (fastgrpo returned 4 of
    TRL's 25), but fastgrpo's frac_reward_none; model_preparation_time is accelerate's prepare (TRL's at its first
    evaluation, fastgrpo's when the trainer was built).
    Before any update both are the same random model, so the entropy of its sampled tokens is close."""
    def config_of(module, **extra):
        return module.GRPOConfig(output_dir=str(tmp_path / module.__name__), per_device_train_batch_size=4, num_generations=4,
                                 max_completion_length=8, max_steps=1, report_to="none", bf16=False, per_device_eval_batch_size=4, **extra)

    import fastgrpo
    got = {}
    for module, extra in ((trl, {"use_cpu": True}), (fastgrpo, {})):
        trainer = module.GRPOTrainer(make_model(), reward_even_tokens, args=config_of(module, **extra), train_dataset=prompts, processing_class=tokenizer)
        got[module.__name__] = trainer.evaluate(prompts.select(range(2)))
    assert set(got["fastgrpo"]) - set(got["trl"]) == {"eval_frac_reward_none"} and set(got["trl"]) <= set(got["fastgrpo"])
    assert got["fastgrpo"]["eval_model_preparation_time"] == trainer.model_preparation_time >= 0
    assert abs(got["trl"]["eval_entropy"] - got["fastgrpo"]["eval_entropy"]) < 0.05 * got["trl"]["eval_entropy"]
    assert got["trl"]["eval_completions/max_length"] == got["fastgrpo"]["eval_completions/max_length"] == 8.0  # a random model runs to the cap


def test_trains_summary_state_and_saved_files_are_trls(tmp_path, tokenizer, make_model):
    """The same tiny model, data and config trained by TRL 1.16 and fastgrpo: every key TRL logs at a step (its
    step_time among them) and returns from train() (its total_flos among them) is fastgrpo's too; state.num_train_epochs
    is Trainer's passes for max_steps (fastgrpo said ⌈num_train_epochs⌉ = 3); save_model and every checkpoint hold
    Trainer's training_args.bin, which loads back as the run's config.

    total_flos is transformers' estimate, 6 × non-embedding parameters × tokens the update ran forward and backward
    (TRL's GRPO inputs carry no input_ids, so transformers counts 0 there). Here each optimizer step trains one
    prompt of P tokens, run once for its G = 4 completions of 8 tokens (a random model never stops early): P + 32."""
    def config_of(module, **extra):
        return module.GRPOConfig(output_dir=str(tmp_path / module.__name__), per_device_train_batch_size=4, num_generations=4,
                                 gradient_accumulation_steps=1, max_completion_length=8, max_steps=3, logging_steps=2, save_steps=2,
                                 report_to="none", bf16=False, learning_rate=1e-3, seed=0, **extra)

    import fastgrpo
    runs = {}
    for module, extra in ((trl, {"use_cpu": True}), (fastgrpo, {"disable_tqdm": True, "max_prompt_length": 64})):
        trainer = module.GRPOTrainer(make_model(), reward_even_tokens, args=config_of(module, **extra), train_dataset=single_digit_prompts(),
                                     processing_class=tokenizer)
        runs[module.__name__] = trainer, trainer.train()
    (trl_trainer, trl_out), (trainer, out) = runs["trl"], runs["fastgrpo"]
    # Trainer's summary, with the metrics of steps after the last log merged in (TRL's log() updates the summary dict that
    # train() returns); fastgrpo added the last log's ≈ 40 keys even where every step was logged
    assert set(trl_out.metrics) <= set(out.metrics) and set(out.metrics) - set(trl_out.metrics) <= set(trainer.state.log_history[-1])
    for theirs, ours in zip(trl_trainer.state.log_history, trainer.state.log_history, strict=True):
        assert set(theirs) <= set(ours)
    assert trainer.state.log_history[0]["step_time"] > 0
    assert trainer.state.num_train_epochs == trl_trainer.state.num_train_epochs == 1  # 10 prompts, one a step: 3 steps of an epoch's 10

    text = tokenizer.apply_chat_template([{"role": "user", "content": "Count to 3."}], add_generation_prompt=True, tokenize=False)
    P = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    non_embedding = sum(p.numel() for name, p in trainer.model.named_parameters() if "embed_tokens" not in name)  # tied head: embed_tokens
    assert out.metrics["total_flos"] == trainer.state.total_flos == 6 * non_embedding * 3 * (P + 4 * 8)
    assert trl_out.metrics["total_flos"] == 0.0

    args = trainer.args
    trainer.save_model(str(tmp_path / "saved"))
    for folder in (tmp_path / "saved", tmp_path / "fastgrpo" / "checkpoint-2", tmp_path / "fastgrpo" / "checkpoint-3"):
        saved = torch.load(folder / "training_args.bin", weights_only=False)
        assert type(saved) is fastgrpo.GRPOConfig and saved.to_dict() == args.to_dict()
    assert os.path.isfile(tmp_path / "trl" / "checkpoint-2" / "training_args.bin")

    # a resume from step 2 counts on from the checkpoint: the same tokens and FLOPs as the run that never stopped
    resumed = GRPOTrainer(make_model(), reward_even_tokens, args=config_of(fastgrpo, disable_tqdm=True, max_prompt_length=64, overwrite_output_dir=True),
                          train_dataset=single_digit_prompts(), processing_class=tokenizer)
    with pytest.warns(UserWarning, match="also holds the later checkpoint-3"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "fastgrpo" / "checkpoint-2"))
    assert (resumed.state.total_flos, resumed.state.num_input_tokens_seen) == (trainer.state.total_flos, trainer.state.num_input_tokens_seen)


@pytest.mark.parametrize("num_iterations,steps_per_generation,max_steps,stream", [(2, 2, 6, False), (2, 1, 4, True)])
def test_state_epoch_moves_at_each_step_as_trls(tmp_path, tokenizer, make_model, num_iterations, steps_per_generation, max_steps, stream):
    """TRL's loader repeats a generation batch once per optimizer step on it, so Trainer's epoch moves by the same share
    at each of a rollout's steps: 10 prompts, 1 per step's batch → 0.1 an epoch per rollout, over μ × steps_per_generation
    steps (fastgrpo's moved only at a rollout's draw: 0.2, 0.2, 0.2, 0.2, 0.4, …). A stream has no length: Trainer's epoch
    is steps / max_steps (fastgrpo's stayed 0). Past a pass: tests/test_callbacks.py's resume test."""
    import fastgrpo
    from datasets import IterableDataset

    def data():
        rows = single_digit_prompts()
        return IterableDataset.from_generator(lambda: iter(rows)) if stream else rows

    epochs = {}
    for module, extra in ((trl, {"use_cpu": True}), (fastgrpo, {"disable_tqdm": True, "max_prompt_length": 64})):
        args = module.GRPOConfig(output_dir=str(tmp_path / module.__name__), per_device_train_batch_size=4, num_generations=4,
                                 gradient_accumulation_steps=1, max_completion_length=4, max_steps=max_steps, logging_steps=1,
                                 save_strategy="no", report_to="none", bf16=False, num_iterations=num_iterations,
                                 steps_per_generation=steps_per_generation, **extra)
        trainer = module.GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=data(), processing_class=tokenizer)
        trainer.train()
        epochs[module.__name__] = [round(r["epoch"], 6) for r in trainer.state.log_history]
    assert epochs["fastgrpo"] == epochs["trl"]
    per_step = 1 / max_steps if stream else 0.1 * steps_per_generation / (num_iterations * steps_per_generation)
    assert epochs["fastgrpo"][:-1] == [round(per_step * s, 6) for s in range(1, max_steps + 1)]  # then the summary's, the last again


@pytest.mark.parametrize("num_iterations,num_train_epochs", [(2, 2), (1, 2.5)])
def test_epochs_over_a_dataset_that_is_not_whole_rollouts_are_trls(tmp_path, tokenizer, make_model, num_iterations, num_train_epochs):
    """5 prompts, 2 a rollout: TRL's sampler drops each pass's incomplete batch, so a pass is 2 rollouts (fastgrpo drew
    on into the next pass: 6 steps an epoch, its ends at epoch 1.2, max_steps 20 where TRL's was 16). Trainer's
    max_steps is ⌈num_train_epochs × steps per pass⌉; on_epoch_end, epoch-strategy saves and state.epoch are TRL's."""
    import fastgrpo

    class Ends(TrainerCallback):
        def __init__(self):
            self.ends, self.saves = [], []

        def on_epoch_end(self, args, state, control, **kwargs):
            self.ends.append((state.global_step, round(state.epoch, 6)))

        def on_save(self, args, state, control, **kwargs):
            self.saves.append(state.global_step)

    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(5)])
    got = {}
    for module, extra in ((trl, {"use_cpu": True}), (fastgrpo, {"disable_tqdm": True, "max_prompt_length": 64})):
        ends = Ends()
        args = module.GRPOConfig(output_dir=str(tmp_path / module.__name__), per_device_train_batch_size=4, num_generations=4,
                                 gradient_accumulation_steps=1, steps_per_generation=2, num_iterations=num_iterations,
                                 max_completion_length=4, num_train_epochs=num_train_epochs, logging_steps=100, save_strategy="epoch",
                                 report_to="none", bf16=False, **extra)
        trainer = module.GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=rows, processing_class=tokenizer, callbacks=[ends])
        trainer.train()
        got[module.__name__] = (ends.ends, ends.saves, trainer.state.max_steps, trainer.state.num_train_epochs)
    assert got["fastgrpo"] == got["trl"]
    per_pass = 2 * (num_iterations * 2)  # 2 rollouts of μ × steps_per_generation / GA steps each
    assert got["fastgrpo"][2] == math.ceil(num_train_epochs * per_pass)


def reward_odd_length_with_extra(completions, log_extra, **kwargs):
    """1 for a completion of odd text length; logs two extra columns (out of name order: TRL writes them sorted)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    log_extra("length", [len(t) for t in texts])
    log_extra("first_char", [t[:1] for t in texts])
    return [float(len(t) % 2) for t in texts]


def test_log_completions_writes_trls_parquet_tables(tmp_path, tokenizer, make_model):
    """TRL 1.16 writes output_dir/completions/completions_<step:05d>.parquet at each log: the latest generation batch
    (generation_batch_size rows), so with μ = 2 and steps_per_generation = 2 steps 1–4 repeat the first rollout's rows
    and step 5 holds the second's. fastgrpo wrote completions.jsonl only, and a script reading TRL's tables found
    nothing. Both runs here: the same file names, columns and order, schema (dtypes), rows and step column, and the
    same prompts in the same order (the same seed draws TRL's data order; the completions differ: each samples its own)."""
    import fastgrpo
    import pandas as pd
    import pyarrow.parquet as pq

    tables = {}
    for module, extra in ((trl, {"use_cpu": True}), (fastgrpo, {"disable_tqdm": True, "max_prompt_length": 64})):
        args = module.GRPOConfig(output_dir=str(tmp_path / module.__name__), per_device_train_batch_size=2, num_generations=2,
                                 gradient_accumulation_steps=1, steps_per_generation=2, num_iterations=2, max_completion_length=4,
                                 max_steps=5, logging_steps=1, save_strategy="no", report_to="none", bf16=False, seed=0,
                                 log_completions=True, num_completions_to_print=0, **extra)
        trainer = module.GRPOTrainer(make_model(), [reward_even_tokens, reward_odd_length_with_extra], args=args,
                                     train_dataset=single_digit_prompts(), processing_class=tokenizer)
        assert os.path.isdir(os.path.join(args.output_dir, "completions"))  # made when the trainer is built, as TRL's
        trainer.train()
        folder = os.path.join(args.output_dir, "completions")
        tables[module.__name__] = {name: (pd.read_parquet(os.path.join(folder, name)), pq.read_schema(os.path.join(folder, name)).remove_metadata())
                                   for name in sorted(os.listdir(folder))}
    ours, theirs = tables["fastgrpo"], tables["trl"]
    assert list(ours) == list(theirs) == [f"completions_{s:05d}.parquet" for s in range(1, 6)]
    columns = ["step", "prompt", "completion", "reward_even_tokens", "reward_odd_length_with_extra", "first_char", "length", "advantage"]
    for name, ((df, schema), (trl_df, trl_schema)) in zip(ours, zip(ours.values(), theirs.values())):
        assert list(df.columns) == list(trl_df.columns) == columns
        assert schema == trl_schema, f"{name}: {schema} != {trl_schema}"
        assert list(df.dtypes) == list(trl_df.dtypes)
        assert len(df) == len(trl_df) == 4  # generation_batch_size: 2 prompts × G = 2
        assert list(df["step"]) == list(trl_df["step"]) == [int(name[12:17])] * 4
        assert list(map(str, df["prompt"])) == list(map(str, trl_df["prompt"]))
        assert all(list(c) == [{"role": "assistant", "content": c[0]["content"]}] for c in df["completion"])
    for run in (ours, theirs):  # steps 1–4 train on one generation batch: each log writes it again; step 5 is the next
        frames = [df.drop(columns="step") for df, _ in run.values()]
        assert all(frames[0].astype(str).equals(f.astype(str)) for f in frames[1:4])
        assert not set(map(str, frames[4]["prompt"])) & set(map(str, frames[0]["prompt"]))


def test_a_resumed_run_writes_the_tables_of_its_own_steps_from_the_checkpoints_batch(tmp_path, tokenizer, make_model):
    """Resumed from checkpoint-2 of a 5-step run (μ = 2, steps_per_generation = 2: steps 1–4 train one rollout, logged
    at step 1), the table of step 3 holds that rollout's rows, as the run that never stopped wrote it: the batch rides in
    the checkpoint. The tables of steps 4 and 5 (the abandoned branch's) are removed at the resume (TRL leaves them).
    A new run counts a folder of tables as a run's logs; the empty folder a trainer makes when built is not one."""
    import pandas as pd
    from fastgrpo.run import runs

    def run(max_steps, resume=None):
        args = config(tmp_path, per_device_train_batch_size=2, num_generations=2, gradient_accumulation_steps=1, steps_per_generation=2,
                      num_iterations=2, max_completion_length=4, max_prompt_length=64, max_steps=max_steps, save_steps=2,
                      log_completions=True, num_completions_to_print=0)
        GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=single_digit_prompts(), processing_class=tokenizer).train(resume)
        folder = os.path.join(args.output_dir, "completions")
        return {name: pd.read_parquet(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}

    first = run(5)
    assert list(first) == [f"completions_{s:05d}.parquet" for s in range(1, 6)]
    assert runs.claim_output_dir(str(tmp_path / "out"), overwrite=True)[-1] == "completions"
    with pytest.warns(UserWarning, match="also holds the later checkpoint-4"):
        resumed = run(3, resume=str(tmp_path / "out" / "checkpoint-2"))
    assert list(resumed) == [f"completions_{s:05d}.parquet" for s in range(1, 4)]
    for name in resumed:
        assert resumed[name].astype(str).equals(first[name].astype(str))


def test_a_subclass_overriding_a_trl_method_fastgrpo_never_calls_is_refused(tmp_path, tokenizer, make_model, prompts):
    # TRL users customise by subclassing: a compute_loss override changes TRL's loss. fastgrpo's loop never calls it, so
    # the subclass trained the stock loss, silently. Refused before the model loads, naming the methods.
    class CustomLoss(GRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs)

        def _generate_and_score_completions(self, inputs):
            return inputs

    with pytest.raises(TypeError, match=r"CustomLoss overrides compute_loss, _generate_and_score_completions: TRL's GRPOTrainer calls these"):
        CustomLoss("no-such-model", reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    # every listed method is one TRL's GRPOTrainer or transformers' Trainer has; fastgrpo's own trainers define some for
    # user code to call (get_train_dataloader, create_optimizer; compute_loss refused), which are no override, but a
    # subclass's definition of one of those is: fastgrpo's loop still never calls it
    from fastgrpo.experimental.async_grpo import AsyncGRPOTrainer
    from fastgrpo.run.inputs import TRL_HOOKS, check_trainer_class

    assert all(hasattr(trl.GRPOTrainer, name) for name in TRL_HOOKS)
    assert {"get_train_dataloader", "compute_loss", "create_optimizer"} <= {n for n in TRL_HOOKS if hasattr(GRPOTrainer, n)}
    check_trainer_class(GRPOTrainer)
    check_trainer_class(AsyncGRPOTrainer)

    class OwnLoader(AsyncGRPOTrainer):
        def get_train_dataloader(self):
            return super().get_train_dataloader()

    with pytest.raises(TypeError, match=r"OwnLoader overrides get_train_dataloader: TRL's GRPOTrainer calls it while training"):
        check_trainer_class(OwnLoader)

    class Logged(GRPOTrainer):  # overriding what fastgrpo does call is fine
        def log(self, logs, start_time=None):
            super().log(logs, start_time)

    Logged(make_model(), reward_even_tokens, args=config(tmp_path, output_dir=str(tmp_path / "ok")), train_dataset=prompts, processing_class=tokenizer)


def test_a_subclass_save_model_is_called_for_each_checkpoint_as_trls(tmp_path, tokenizer, make_model):
    """Trainer._save_checkpoint calls `self.save_model(folder, _internal_call=True)`: a subclass that saves more there (a
    value head, its own config) finds it in every checkpoint. fastgrpo called it only when user code did. Its folder is
    named as Trainer's, `checkpoint-N` (inside `.tmp-checkpoint-N` until renamed into place; it was `.tmp-checkpoint-N`, so
    an override reading the name saw another); what it writes is in the manifest, and a resume loads."""
    import fastgrpo

    calls = {}
    for module, extra in ((trl, {"use_cpu": True}), (fastgrpo, {"disable_tqdm": True, "max_prompt_length": 64})):
        made = calls[module.__name__] = []

        class SavesMore(module.GRPOTrainer):
            def save_model(self, output_dir=None, _internal_call=False):
                super().save_model(output_dir, _internal_call)
                made.append((os.path.basename(output_dir), _internal_call, self.state.global_step))
                if self.args.should_save:
                    with open(os.path.join(output_dir, "value_head.json"), "w") as f:
                        json.dump({"step": self.state.global_step}, f)

        fields = dict(output_dir=str(tmp_path / module.__name__), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                      max_steps=1, save_steps=1, report_to="none", bf16=False, seed=0, **extra)
        trainer = SavesMore(make_model(), reward_even_tokens, args=module.GRPOConfig(**fields), train_dataset=single_digit_prompts(), processing_class=tokenizer)
        trainer.train()
        trainer.save_model(str(tmp_path / module.__name__ / "final"))
    assert calls["fastgrpo"] == calls["trl"] == [("checkpoint-1", True, 1), ("final", False, 1)]
    out = tmp_path / "fastgrpo"
    assert json.loads((out / "checkpoint-1" / "value_head.json").read_text()) == {"step": 1}
    assert "value_head.json" in json.loads((out / "checkpoint-1" / "manifest.json").read_text())["files"]
    resumed = GRPOTrainer(make_model(), reward_even_tokens, args=fastgrpo.GRPOConfig(**{**fields, "max_steps": 2}),
                          train_dataset=single_digit_prompts(), processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=True)  # the checkpoint with the subclass's file loads (its manifest checks it)
    assert resumed.state.global_step == 2
