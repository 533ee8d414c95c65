"""Bad input is refused before compute; a fault loses nothing; resume never duplicates or mixes runs (issue 12).

One test per kind of bad input or fault; docs/reliability.md lists them. Trainer
runs are a few optimizer steps of the tiny random model from conftest.py.
"""

import copy
import errno
import functools
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import threading
import warnings

import pytest
import torch
from datasets import Dataset
from rich.console import Console
from transformers import EarlyStoppingCallback, TrainerCallback
from test_trainer import config, read_metrics, reward_even_tokens

import fastgrpo.run.checkpoint_files as ckpt
import fastgrpo.run.runs as runs
from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.experimental.async_grpo import AsyncGRPOConfig
from fastgrpo.cli import main
from fastgrpo.model.model_files import check_model_name
from fastgrpo.run.datasets import load_dataset_spec
from fastgrpo.rollout.prompts import PromptEncoder
from fastgrpo.run.interrupt import StopOnInterrupt, TrainingInterrupted
from fastgrpo.rollout.rewards import RewardFunctionError
from fastgrpo.algo.advantages import group_advantages
from fastgrpo.run.completion_tables import CompletionTables
from fastgrpo.run.metrics import CompletionRows
from fastgrpo.model.loading import load_tokenizer, resolve_model_path

NOT_LOADED = "./this-model-must-not-be-loaded"  # loading it would raise "does not exist": our check must come first


def train(tmp_path, tokenizer, make_model, prompts, reward=reward_even_tokens, resume=None, **overrides):
    trainer = GRPOTrainer(make_model(), reward, args=config(tmp_path, **overrides), train_dataset=prompts, processing_class=tokenizer)
    return trainer, trainer.train(resume_from_checkpoint=resume)


def steps(path):
    with open(path) as f:
        return [json.loads(line)["step"] for line in f]


# ---------------------------------------------------------------- rewards


def test_advantages_leave_rows_without_reward_out_of_the_group():
    # NaN = no reward applies. Group 0: rewards 1, 3, 5 (row 1 has none): mean 3, n−1 std sqrt((4+0+4)/2) = 2
    # → Â = −1, 0, 0, 1. Group 1: the two scored rewards are equal → all 0. Group 2: nothing scored → all 0.
    nan = float("nan")
    rewards = torch.tensor([[1.0, nan, 3.0, 5.0], [2.0, 2.0, nan, nan], [nan] * 4])
    for scale in ("group", "none"):
        adv = group_advantages(rewards, scale, eps=0.0)
        expected = [-1.0, 0.0, 0.0, 1.0] if scale == "group" else [-2.0, 0.0, 0.0, 2.0]
        assert adv.tolist() == [expected, [0.0] * 4, [0.0] * 4]
    assert group_advantages(rewards, "batch", torch.tensor(2.0), eps=0.0)[0].tolist() == [-1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="'batch' needs batch_std"):
        group_advantages(rewards, "batch")


def test_a_reward_that_scored_nothing_in_a_window_logs_none_as_trl(tmp_path, tokenizer, make_model, prompts):
    # TRL's log() turns the NaN of its nanmean/nanstd of an all-None column into None (JSON loggers fail on NaN); fastgrpo
    # left the keys out, then logged NaN (metrics.jsonl then held a bare NaN, which strict JSON readers refuse).
    def never(completion_ids, **kw):
        return [None] * len(completion_ids)

    trainer, _ = train(tmp_path, tokenizer, make_model, prompts, [reward_even_tokens, never], max_steps=2)
    for record in read_metrics(trainer.args.output_dir):
        assert record["rewards/never/mean"] is None and record["rewards/never/std"] is None
        assert 0 <= record["rewards/reward_even_tokens/mean"] <= 1 and record["frac_reward_none"] == 0.0
    assert trainer.state.log_history[0]["rewards/never/mean"] is None
    with open(os.path.join(trainer.args.output_dir, "metrics.jsonl")) as f:
        assert all(json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl")) for line in f)
    # every reward None (TRL's quick start without its math_verify): reward and reward_std are None, as TRL logs them
    trainer, _ = train(tmp_path / "none", tokenizer, make_model, prompts, [never], max_steps=1)
    (record,) = read_metrics(trainer.args.output_dir)
    assert record["reward"] is None and record["reward_std"] is None and record["frac_reward_none"] == 1.0


def test_rows_without_reward_train_with_zero_advantage_and_log_the_fraction(tmp_path, tokenizer, make_model, prompts, caplog):
    def first_of_four_unscored(completion_ids, **kw):  # completion 0 of every group of G = 4 gets None
        return [None if i % 4 == 0 else float(len(ids)) for i, ids in enumerate(completion_ids)]

    with caplog.at_level("WARNING", logger="fastgrpo.rewards"):
        trainer, out = train(tmp_path, tokenizer, make_model, prompts, first_of_four_unscored, max_steps=2, log_completions=True)
    assert out.global_step == 2 and caplog.text.count("got None from every reward function") == 2  # once per rollout
    assert [r["frac_reward_none"] for r in read_metrics(trainer.args.output_dir)] == [0.25, 0.25]
    with open(os.path.join(trainer.args.output_dir, "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    unscored = [r for r in rows if r["rewards"]["first_of_four_unscored"] is None]
    assert len(unscored) == len(rows) // 4 and all(r["advantage"] == 0.0 for r in unscored)


def test_non_finite_reward_stops_before_the_update(tmp_path, tokenizer, make_model, prompts):
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(model, lambda completions, **kw: [float("inf")] + [1.0] * (len(completions) - 1),
                          args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(ValueError, match="'<lambda>' returned inf for completion 0"):
        trainer.train()
    after = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    assert all(torch.equal(before[k], after[k].cpu()) for k in before)  # no NaN step was taken


def test_reward_functions_receive_trainer_state(tmp_path, tokenizer, make_model, prompts):
    seen = []

    def spy(completions, trainer_state, **kw):
        seen.append(trainer_state.global_step)  # steps done before this rollout
        return [0.0] * len(completions)

    train(tmp_path, tokenizer, make_model, prompts, spy, max_steps=2)  # one optimizer step per rollout
    assert seen == [0, 1]


# ---------------------------------------------------------------- data, model, output_dir


@pytest.mark.parametrize("rows,match", [
    ([], "is empty"),
    ([{"prompt": "Count to 3."}, {"prompt": None}], "row 1 has no prompt"),
    ([{"prompt": ""}, {"prompt": ""}], "row 0 has a blank prompt"),
    ([{"prompt": " \n"}], "row 0 has a blank prompt"),
    ([{"prompt": [{"role": "user", "content": "hi"}]}, {"prompt": []}], "row 1 has no messages"),
    ([{"prompt": [{"content": "hi"}]}], "row 0: prompt .* is a list but not chat messages"),
    ([{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": None}]}],
     "row 0, message 1 \\(user\\): content None is not text; the chat template would fail on it"),  # a Jinja TypeError naming no row
    ([{"prompt": "a", "completions": "x"}], "column named 'completions'"),
    ([{"prompt": "a", "trainer_state": 1}], "column named 'trainer_state'"),
    ([{"prompt": "a", "image": "cat.png"}], r"train_dataset has an 'image' column, which TRL reads as the prompts' images .*fastgrpo trains "
     r"text-only models and would drop them\. Remove or rename the column .*dataset\.remove_columns\('image'\)"),
    ([{"prompt": "a", "images": ["cat.png"]}], "train_dataset has an 'images' column"),
])
def test_bad_datasets_are_refused_before_the_model_loads(tmp_path, rows, match):
    dataset = Dataset.from_list(rows) if rows else Dataset.from_dict({"prompt": []})
    with pytest.raises(ValueError, match=match):
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path), train_dataset=dataset)


def test_chat_prompts_the_template_cannot_render_are_refused_before_the_model_loads(tmp_path, tokenizer, prompts):
    """A chat prompt the tokenizer's template fails on reached it only at the first rollout (or evaluation): jinja's bare
    "can only concatenate str (not "list") to str" for content given as parts to SmolLM2's text-only template, or
    transformers' paragraph for a tokenizer without a template. Now the first prompt of each shape in each dataset is
    rendered once the tokenizer loads, before the model (NOT_LOADED): the dataset, the row and the fix are named."""
    text = lambda i: [{"role": "user", "content": f"Count to {i}."}]  # noqa: E731
    parts = lambda i: [{"role": "user", "content": [{"type": "text", "text": f"Count to {i}."}]}]  # noqa: E731
    mixed = [{"prompt": text(i)} for i in range(5)] + [{"prompt": parts(5)}]  # row 5 is the only one of its shape (rows as a list: Arrow holds one kind)
    build = lambda tok, **kw: GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path), processing_class=tok, **kw)  # noqa: E731
    with pytest.raises(ValueError, match=r"^train_dataset row 5: the chat template cannot render \[\{'role': 'user', 'content': \[\{'type': 'text', "
                       r"'text': 'Count to 5\.'\}\]\}\] \(TypeError: can only concatenate str \(not \"list\"\) to str\); its content is a "
                       r"list of parts, and this template takes content as text only: give each message's content as a str") as info:
        build(tokenizer, train_dataset=mixed)
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(ValueError, match=r"^eval_math dataset row 5: the chat template cannot render"):
        build(tokenizer, train_dataset=prompts, eval_dataset={"math": mixed})
    bare = copy.copy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match=r"^train_dataset row 0: chat messages \[\{'role': 'user', 'content': 'Count to 0\.'\}\] need a chat "
                       r"template to render; the tokenizer has no chat template: give text prompts, or set tokenizer\.chat_template"):
        build(bare, train_dataset=prompts)
    with pytest.raises(ValueError, match="does not exist"):  # text prompts need no template: the check passes, the model load fails
        build(bare, train_dataset=Dataset.from_list([{"prompt": f"Count to {i}."} for i in range(4)]))
    odd = [{"prompt": [{"role": "user", "content": [{"type": ["text"], "text": "Hi."}]}]}]  # an unhashable part type: a kind too
    with pytest.raises(ValueError, match=r"^train_dataset row 0: the chat template cannot render"):  # was "unhashable type: 'list'"
        build(tokenizer, train_dataset=odd)
    encode = PromptEncoder(tokenizer, None)  # a row no sample covered (a stream's later rows) is named when its rollout renders it
    with pytest.raises(ValueError, match=r"^a prompt: the chat template cannot render .*its content is a list of parts"):
        encode([text(0), parts(1)])



def test_a_processing_class_that_is_no_usable_tokenizer_is_named_before_the_model_loads(tmp_path, tokenizer, make_model, prompts):
    """processing_class="name" failed with a bare "'str' object has no attribute 'padding_side'"; a tokenizer without an EOS
    token with "'<' not supported between 'NoneType' and 'int'" after the model loaded. Now the first is named before the
    model loads, and the second ends completions at the model's own EOS (generation_config's); without a pad token either, named."""
    build = lambda tok, model=NOT_LOADED: GRPOTrainer(model, reward_even_tokens, args=config(tmp_path, max_steps=1),  # noqa: E731
                                                      train_dataset=prompts, processing_class=tok)
    with pytest.raises(TypeError, match=r"^processing_class is 'HuggingFaceTB/SmolLM2-135M-Instruct' \(str\); give the policy's tokenizer \(e\.g\. "
                       r"AutoTokenizer\.from_pretrained\(name\)\), or None to load the model's own\."):
        build("HuggingFaceTB/SmolLM2-135M-Instruct")
    no_eos = copy.deepcopy(tokenizer)
    no_eos.eos_token = None
    trainer = build(no_eos, make_model())
    assert trainer.eos_token_ids == [tokenizer.eos_token_id]  # the model's generation config's
    trainer.train()
    no_eos.pad_token = None
    with pytest.raises(ValueError, match="^processing_class has neither a pad_token nor an eos_token"):
        build(no_eos)

def test_malformed_json_lines_name_file_and_line(tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c",\n')
    with pytest.raises(ValueError, match=r"data.jsonl, line 3: not valid JSON"):
        load_dataset_spec(str(path))
    assert main(["train", "--dataset", str(path), "--reward", "length", "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "line 3" in err  # one line, no traceback


def test_output_dir_that_is_a_file_or_not_writable_is_refused_before_the_model_loads(tmp_path, monkeypatch, prompts):
    a_file = tmp_path / "out"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="output_dir .* is a file"):
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path), train_dataset=prompts)

    def denied(*args, **kwargs):  # tests run as root, where chmod cannot make a folder read-only
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(runs.tempfile, "TemporaryFile", denied)
    with pytest.raises(ValueError, match="is not writable \\(Permission denied\\)"):
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path / "elsewhere"), train_dataset=prompts)


@pytest.mark.parametrize("value,shown", [(lambda: 1, "Can't pickle <function <lambda>"), (threading.Lock(), "cannot pickle '_thread.lock' object")])
def test_a_config_value_pickle_cannot_write_is_refused_before_the_model_loads(tmp_path, tokenizer, prompts, value, shown):
    # Every checkpoint and save_model pickle the config (trainer_state.pt, training_args.bin): a lambda in
    # model_init_kwargs trained a step, then failed the run at its first save and left .tmp-checkpoint-1 behind.
    args = config(tmp_path, model_init_kwargs={"x": value})
    with pytest.raises(ValueError, match=re.escape("the config cannot be saved with the run's checkpoints and model: model_init_kwargs={'x': ")
                       + ".*" + re.escape(shown)):
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert not os.path.exists(args.output_dir)


def test_unknown_model_name_says_not_local_and_not_on_the_hub_at_once(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="'some-folder' is not a local folder or file .* HF_HUB_OFFLINE is set"):
        resolve_model_path("some-folder")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    import huggingface_hub

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    with pytest.raises(ValueError, match="not a local folder or file .* the hub could not be reached \\(ConnectionError\\)"):
        resolve_model_path("some-folder")
    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", unreachable)  # a near miss of the built-in alias never asks the hub
    with pytest.raises(ValueError, match="'smollm2-135m-instruc' is not a local folder or file .*; did you mean the built-in 'smollm2-135m-instruct'\\?"):
        check_model_name("smollm2-135m-instruc")
    with pytest.raises(ValueError, match="'SmolLM2-135M-Instruct' is not a local folder or file .*; did you mean the built-in 'smollm2-135m-instruct'\\?"):
        check_model_name("SmolLM2-135M-Instruct")  # the model's own spelling (README's prose), without the hub's owner


def test_unknown_dataset_name_offline_is_one_quick_line(monkeypatch, tmp_path):
    # load_dataset retried for ≈ 24 s, then a 10-frame ConnectionError; the name gets the model's one probe instead.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    import huggingface_hub

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", unreachable)
    with pytest.raises(ValueError, match="dataset 'org/name' is not a local folder or file .* the hub could not be reached \\(ConnectionError\\); "
                                         "check the path, or the network \\(HF_DATASETS_OFFLINE=1 reads the datasets cache\\)"):
        load_dataset_spec("org/name")


def test_model_folder_without_tokenizer_names_folder_and_files(tmp_path, make_model):
    make_model().save_pretrained(tmp_path)  # config.json and the weights, no tokenizer files
    with pytest.raises(ValueError, match=f"model folder '{tmp_path}' has no tokenizer \\(none of tokenizer.json"):
        load_tokenizer(str(tmp_path))


def test_rich_markup_in_prompts_and_completions_is_printed_literally(tmp_path):
    console = Console(record=True, width=200)
    tables = CompletionTables(str(tmp_path), ["[b]"], [], False, capacity=1, console=console)
    rows = CompletionRows(["[INST] Count to 3. [/INST]"], ["[/bold] 1 2 3 [red]"], torch.tensor([[float("nan")]]), torch.zeros(1),
                          {"[i]note": ["[u]x"]})
    tables.update([rows], 1)
    tables.print_sample(1, 1)
    text = console.export_text()
    assert all(literal in text for literal in ("[INST] Count to 3. [/INST]", "[/bold] 1 2 3 [red]", "[b]", "[i]note", "[u]x"))
    assert "nan" in text  # a None reward, as TRL's panel prints it


# ---------------------------------------------------------------- output_dir ownership and resume


def test_a_new_run_refuses_a_folder_holding_another_run(tmp_path, tokenizer, make_model, prompts):
    first, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=2, save_steps=1)
    with pytest.raises(ValueError, match="already holds a run \\(checkpoint-1, checkpoint-2, metrics.jsonl\\).*overwrite_output_dir=True"):
        train(tmp_path, tokenizer, make_model, prompts, max_steps=1)
    assert steps(os.path.join(first.args.output_dir, "metrics.jsonl")) == [1, 2]  # untouched by the refused run
    second, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=1, overwrite_output_dir=True)
    assert sorted(n for n in os.listdir(second.args.output_dir) if n.startswith("checkpoint-")) == ["checkpoint-1"]
    assert ckpt._run_id(os.path.join(second.args.output_dir, "checkpoint-1")) == second.run_id != first.run_id


def test_overwrite_keeps_the_previous_run_until_the_new_one_first_writes(tmp_path, tokenizer, make_model, prompts):
    # A new run that fails in its first rollout (here its reward function) has nothing to save: the run it would
    # replace stays whole. One that gets as far as a checkpoint, or only to its end, replaces it.
    first, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=2, save_steps=1)
    out = first.args.output_dir
    before = sorted(os.listdir(out))

    def broken_reward(completions, **kwargs):
        raise RuntimeError("reward server down")

    with pytest.raises(RuntimeError, match="reward server down"):
        train(tmp_path, tokenizer, make_model, prompts, reward=broken_reward, max_steps=1, overwrite_output_dir=True)
    assert sorted(os.listdir(out)) == before and steps(os.path.join(out, "metrics.jsonl")) == [1, 2]
    second, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=1, save_steps=1, logging_steps=5, overwrite_output_dir=True)
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-1"]
    assert ckpt._run_id(os.path.join(out, "checkpoint-1")) == second.run_id
    assert steps(os.path.join(out, "metrics.jsonl")) == [1]  # the previous run's lines went before this run's checkpoint
    third, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=1, save_strategy="no", logging_steps=5, overwrite_output_dir=True)
    assert not [n for n in os.listdir(out) if n.startswith("checkpoint-")]  # replaced at the run's end, though it saved nothing


def test_overwrite_removes_only_what_fastgrpo_wrote(tmp_path, tokenizer, make_model, prompts):
    # Another trainer's checkpoint folder (no manifest) and a file named like a checkpoint are not this library's to
    # delete: they refuse a new run without overwrite_output_dir, and stay where they are with it.
    first, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=1, save_steps=1)
    out = first.args.output_dir
    os.makedirs(os.path.join(out, "checkpoint-500"))
    (tmp_path / "out" / "checkpoint-500" / "trainer_state.json").write_text("{}")
    (tmp_path / "out" / "checkpoint-7").write_text("notes")
    with pytest.raises(ValueError, match="already holds a run \\(checkpoint-1, checkpoint-7, checkpoint-500, metrics.jsonl\\)"):
        train(tmp_path, tokenizer, make_model, prompts, max_steps=1)
    second, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=2, save_steps=2, overwrite_output_dir=True)
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-2", "checkpoint-500", "checkpoint-7"]
    assert (tmp_path / "out" / "checkpoint-7").read_text() == "notes" and steps(os.path.join(out, "metrics.jsonl")) == [1, 2]


def test_ctrl_c_before_an_overwriting_run_writes_anything_keeps_the_previous_run(tmp_path, tokenizer, make_model, prompts):
    first, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=2, save_steps=1)
    out = first.args.output_dir
    before = sorted(os.listdir(out))

    def interrupted_at_once(completion_ids, **kw):  # Ctrl-C on a mistaken command, in its first rollout
        os.kill(os.getpid(), signal.SIGINT)
        return reward_even_tokens(completion_ids)

    with pytest.raises(TrainingInterrupted, match="before this run wrote anything: nothing was saved and the previous run in .* was left as it was"):
        train(tmp_path, tokenizer, make_model, prompts, interrupted_at_once, max_steps=4, logging_steps=5, overwrite_output_dir=True)
    assert sorted(os.listdir(out)) == before and steps(os.path.join(out, "metrics.jsonl")) == [1, 2]
    assert [ckpt._run_id(p) for p in ckpt.checkpoints(out)] == [first.run_id] * 2


def test_a_completion_longer_than_the_models_context_is_refused_before_compute(tmp_path, tokenizer, make_model, prompts):
    # conftest's model has 512 positions: a completion of 513 tokens cannot fit even without a prompt.
    with pytest.raises(ValueError, match="max_completion_length=513 is longer than the model's context of 512 tokens"):
        GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, max_completion_length=513), train_dataset=prompts,
                    processing_class=tokenizer)
    assert not os.path.exists(os.path.join(tmp_path, "out", "metrics.jsonl"))
    with pytest.warns(UserWarning, match="max_prompt_length=500 \\+ max_completion_length=16 exceeds the model's context of 512 tokens: "
                                         "a rollout holding a prompt of more than 496 tokens will be refused"):
        GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, max_prompt_length=500, max_completion_length=16),
                    train_dataset=prompts, processing_class=tokenizer)


def test_a_prompt_whose_completion_would_run_past_the_context_is_refused_at_its_rollout(tmp_path, tokenizer, make_model, prompts):
    # 512 positions, 490 completion tokens: 22 left for a prompt, and each chat-rendered prompt has more (a model with learned
    # positions failed inside sampling with an IndexError; one with rotary positions decoded past them without a word).
    args = config(tmp_path, max_completion_length=490, save_steps=1)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    longest = len(tokenizer.apply_chat_template(prompts[0]["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    assert longest > 22
    with pytest.raises(ValueError, match=r"the prompt '<\|im_start\|>.*… has \d+ tokens, more than the 22 the model's context \(config.max_position_embeddings\) "
                                         r"leaves beside max_completion_length\. Set max_prompt_length=22 or less"):
        trainer.train()
    assert not os.path.exists(os.path.join(tmp_path, "out", "metrics.jsonl"))


def test_pruning_keeps_the_checkpoint_just_saved_after_a_resume_from_an_older_one(tmp_path):
    # Resumed from checkpoint-1 while checkpoints 2–4 of the same run exist, the run saves checkpoint-2 again: with
    # save_total_limit=1 the highest step (4) used to push it out. Both the newest step and the one just saved stay.
    for step in (1, 2, 3, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        ckpt.write_manifest(str(tmp_path / f"checkpoint-{step}"), step, "a")
    ckpt.prune(str(tmp_path), 1, "a", latest=str(tmp_path / "checkpoint-2"))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-4"]


def test_pruning_only_touches_this_runs_checkpoints(tmp_path):
    for step, run in [(1, "a"), (2, "a"), (3, "a"), (10, "b")]:
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        ckpt.write_manifest(str(folder), step, run)
    ckpt.prune(str(tmp_path), 1, "a")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-10", "checkpoint-3"]  # run b's higher step survives


def test_resuming_an_older_checkpoint_names_the_later_ones_it_leaves(tmp_path, tokenizer, make_model, prompts):
    trainer, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=3, save_steps=1)
    out = trainer.args.output_dir
    older = os.path.join(out, "checkpoint-1")
    with pytest.warns(UserWarning, match=f"resumed from step 1, but '{out}' also holds the later checkpoint-2, checkpoint-3: this run replaces "
                      r"each when it saves that step, and until then resume_from_checkpoint=True \(`--resume`\) picks checkpoint-3"):
        train(tmp_path, tokenizer, make_model, prompts, resume=older, max_steps=2, save_steps=1)
    with open(os.path.join(out, "checkpoint-2", "trainer_state.json")) as f:
        assert json.load(f)["max_steps"] == 2  # the resumed run replaced the left branch's step 2; its step 3 stays
    assert os.path.isdir(os.path.join(out, "checkpoint-3"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the latest checkpoint: nothing later, nothing to say
        train(tmp_path, tokenizer, make_model, prompts, resume=os.path.join(out, "checkpoint-3"), max_steps=4, save_steps=1)


def test_resuming_with_other_tools_or_rewards_than_the_saved_run_warns(tmp_path, tokenizer, make_model, prompts):
    # The trainer's arguments are not in the config: a tools run resumed without tools= went on single-turn, silently.
    def multiply(a: int, b: int) -> int:
        """
        Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a * b

    def length_reward(completion_ids, **kwargs):
        return [float(len(ids)) for ids in completion_ids]

    args = lambda steps: config(tmp_path, max_steps=steps, save_steps=1)  # noqa: E731
    GRPOTrainer(make_model(), reward_even_tokens, args=args(1), train_dataset=prompts, processing_class=tokenizer, tools=[multiply]).train()
    with pytest.warns(UserWarning, match=r"resumed .*checkpoint-1 with other trainer arguments than the run that saved it \(reward_funcs "
                      r"reward_even_tokens → reward_even_tokens, length_reward; tools multiply → none\): it trains on with this run's \(without "
                      r"its tools or environments, single-turn\); pass the saved ones"):
        GRPOTrainer(make_model(), [reward_even_tokens, length_reward], args=args(2), train_dataset=prompts,
                    processing_class=tokenizer).train(resume_from_checkpoint=True)


def test_resuming_on_another_train_dataset_warns_naming_both(tmp_path, tokenizer, make_model, prompts):
    # Found by the session-29 sweep: an 8-row file resumed as a 3-row one trained on from the saved position without a word.
    args = lambda steps: config(tmp_path, max_steps=steps, save_steps=1)  # noqa: E731
    GRPOTrainer(make_model(), reward_even_tokens, args=args(1), train_dataset=prompts, processing_class=tokenizer).train()
    with pytest.warns(UserWarning, match=r"other trainer arguments than the run that saved it \(train_dataset 32 rows, prompts [0-9a-f]{8} → "
                                         r"3 rows, prompts [0-9a-f]{8}\)"):
        GRPOTrainer(make_model(), reward_even_tokens, args=args(2), train_dataset=prompts.select(range(3)),
                    processing_class=tokenizer).train(resume_from_checkpoint=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same rows as a list of dicts: the same dataset, no warning
        GRPOTrainer(make_model(), reward_even_tokens, args=args(3), train_dataset=prompts.select(range(3)).to_list(),
                    processing_class=tokenizer).train(resume_from_checkpoint=True)


def test_a_runs_setup_is_named_as_it_routes():
    # Environments are routed by key, so a dict in another order is the same setup; a partial is named by its function.
    from types import SimpleNamespace

    from fastgrpo.run.runs import run_setup, setup_changes

    class EnvA:
        pass

    class EnvB:
        pass

    def agents(factories, tools=()):
        return SimpleNamespace(tools=list(tools), environments=SimpleNamespace(factories=factories), rollout_func=None)

    first = run_setup(["r"], agents({"a": EnvA, "b": EnvB}))
    assert first["environment_factory"] == ["a: EnvA", "b: EnvB"]
    assert setup_changes(first, run_setup(["r"], agents({"b": EnvB, "a": functools.partial(EnvA)}))) == []
    assert setup_changes(first, run_setup(["r"], agents({"a": EnvA}))) == [("environment_factory", ["a: EnvA", "b: EnvB"], ["a: EnvA"])]
    assert setup_changes(None, first) == []  # a checkpoint from before the record


def test_resuming_a_finished_run_trains_logs_and_rewrites_nothing(tmp_path, tokenizer, make_model, prompts, capsys):
    # Step 3 is logged at the run's end (logging_steps=2), after checkpoint-3 was saved, with its completions table. Resuming
    # checkpoint-3 logged step 3 again (its metrics.jsonl line rewritten with this call's phase timings), printed and rewrote
    # its table, re-truncated both logs and called on_epoch_begin. Trainer, resumed at max_steps, logs its summary alone.
    from conftest import file_states

    common = dict(max_steps=3, logging_steps=2, save_steps=3, log_completions=True, num_completions_to_print=1)
    _, first = train(tmp_path, tokenizer, make_model, prompts, **common)
    out = str(tmp_path / "out")
    before, events = file_states(out), []
    assert os.path.join(out, "completions", "completions_00003.parquet") in before and len(read_metrics(out)) == 2
    capsys.readouterr()

    class Events(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            events.append("epoch_begin")

        def on_log(self, args, state, control, logs=None, **kwargs):
            events.append(sorted(logs))

    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, **common), train_dataset=prompts, processing_class=tokenizer,
                          callbacks=[Events])
    result = trainer.train(resume_from_checkpoint=True)
    assert file_states(out) == before  # no file written, truncated or touched
    assert events == [["epoch", "total_flos", "train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second"]]
    assert (result.global_step, result.training_loss) == (3, first.training_loss)  # the run's mean loss, as the run reported it
    assert result.metrics["train_samples_per_second"] == result.metrics["train_steps_per_second"] == 0.0  # no step in this call
    printed = capsys.readouterr().out
    assert "the run is already at max_steps=3: nothing to train; raise max_steps (--max_steps 6) to train on from step 3" in printed
    assert " Step 3 " not in printed  # the table the run printed at its end is not printed again


def test_a_resumed_runs_throughput_counts_the_steps_it_ran(tmp_path, tokenizer, make_model, prompts):
    # transformers 5 divides the steps that train() call ran by its runtime; fastgrpo divided every step since step 0, so a
    # resume at step 2 of 4 reported twice its throughput (and a resume at max_steps thousands of steps per second).
    train(tmp_path, tokenizer, make_model, prompts, max_steps=2, save_steps=2)
    _, out = train(tmp_path, tokenizer, make_model, prompts, resume=True, max_steps=4, save_steps=2)
    m = out.metrics
    assert out.global_step == 4 and m["train_steps_per_second"] == pytest.approx(2 / m["train_runtime"], rel=1e-3, abs=2e-3)  # steps 3, 4
    assert m["train_samples_per_second"] == pytest.approx(2 * 4 * 2 / m["train_runtime"], rel=1e-3, abs=2e-3)  # 2 steps × 4 × GA 2


def test_resume_cuts_logs_back_to_the_checkpoint_step(tmp_path, tokenizer, make_model, prompts):
    # A run killed after step 3 whose last checkpoint is step 2: logs hold steps 1–3, resume must not log step 3 twice.
    common = dict(max_steps=4, save_steps=2, log_completions=True, num_completions_to_print=0)
    trainer, _ = train(tmp_path, tokenizer, make_model, prompts, **common)
    out = trainer.args.output_dir
    shutil.rmtree(os.path.join(out, "checkpoint-4"))
    for name in ("metrics.jsonl", "completions.jsonl"):  # as if killed after logging step 3
        with open(os.path.join(out, name)) as f:
            kept = [line for line in f if json.loads(line)["step"] <= 3]
        with open(os.path.join(out, name), "w") as f:
            f.writelines(kept)
    train(tmp_path, tokenizer, make_model, prompts, resume=True, **common)
    assert steps(os.path.join(out, "metrics.jsonl")) == [1, 2, 3, 4]
    per_step = trainer.args.generation_batch_size
    assert steps(os.path.join(out, "completions.jsonl")) == [s for s in (1, 2, 3, 4) for _ in range(per_step)]


def test_corrupt_latest_checkpoint_is_named_and_true_falls_back(tmp_path, tokenizer, make_model, prompts):
    trainer, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=2, save_steps=1)
    latest = os.path.join(trainer.args.output_dir, "checkpoint-2")
    weights = os.path.join(latest, "model.safetensors")
    os.truncate(weights, os.path.getsize(weights) // 2)
    with pytest.raises(ckpt.CorruptCheckpointError, match="checkpoint-2' is corrupt: model.safetensors holds"):
        train(tmp_path, tokenizer, make_model, prompts, resume=latest, max_steps=3, save_steps=1)
    with pytest.warns(UserWarning, match="checkpoint-2' is corrupt.*Falling back"):
        resumed, out = train(tmp_path, tokenizer, make_model, prompts, resume=True, max_steps=3, save_steps=1)
    assert out.global_step == 3
    assert steps(os.path.join(trainer.args.output_dir, "metrics.jsonl")) == [1, 2, 3]  # resumed at 1: step 2 logged once
    with pytest.raises(ckpt.CorruptCheckpointError, match="manifest.json cannot be read"):
        os.remove(os.path.join(trainer.args.output_dir, "checkpoint-1", "manifest.json"))
        ckpt.read_manifest(os.path.join(trainer.args.output_dir, "checkpoint-1"))


def test_a_checkpoint_file_changed_at_the_same_size_is_named_by_its_crc(tmp_path, tokenizer, make_model, prompts):
    trainer, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=1, save_steps=1)
    checkpoint = os.path.join(trainer.args.output_dir, "checkpoint-1")
    weights = os.path.join(checkpoint, "model.safetensors")
    with open(os.path.join(checkpoint, "manifest.json")) as f:
        entry = json.load(f)["files"]["model.safetensors"]
    assert entry == {"bytes": os.path.getsize(weights), "crc32": ckpt.file_crc32(weights)}
    with open(weights, "r+b") as f:  # one byte of the last weight's data flipped: same size, other bytes
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(ckpt.CorruptCheckpointError, match=f"checkpoint-1' is corrupt: model.safetensors has CRC-32 [0-9a-f]{{8}}, "
                       f"the manifest says {entry['crc32']} \\(the file changed after it was saved\\)"):
        train(tmp_path, tokenizer, make_model, prompts, resume=checkpoint, max_steps=2)


def test_a_manifest_of_sizes_alone_still_loads(tmp_path, tokenizer, make_model, prompts):
    trainer, _ = train(tmp_path, tokenizer, make_model, prompts, max_steps=1, save_steps=1)
    manifest = os.path.join(trainer.args.output_dir, "checkpoint-1", "manifest.json")
    with open(manifest) as f:
        saved = json.load(f)
    saved["files"] = {name: entry["bytes"] for name, entry in saved["files"].items()}  # as checkpoints before CRC-32s were written
    with open(manifest, "w") as f:
        json.dump(saved, f)
    _, out = train(tmp_path, tokenizer, make_model, prompts, resume=True, max_steps=2, save_steps=1)
    assert out.global_step == 2


def test_resume_with_changed_config(tmp_path, tokenizer, make_model, prompts, capsys):
    train(tmp_path, tokenizer, make_model, prompts, max_steps=2, save_steps=1, lr_scheduler_type="constant")
    with pytest.raises(ValueError, match="per_device_train_batch_size=2, but the checkpoint was saved with per_device_train_batch_size=4"):
        train(tmp_path, tokenizer, make_model, prompts, resume=True, max_steps=3, lr_scheduler_type="constant",
              per_device_train_batch_size=2, gradient_accumulation_steps=4)
    trainer, _ = train(tmp_path, tokenizer, make_model, prompts, resume=True, max_steps=3, lr_scheduler_type="constant",
                       learning_rate=5e-4, logging_steps=2)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [5e-4]  # applied, not the saved 1e-3
    notice = [line for line in capsys.readouterr().out.splitlines() if "applied" in line]
    assert len(notice) == 1  # one notice listing every change
    for change in ("learning_rate 0.001 → 0.0005", "max_steps 2 → 3", "logging_steps 1 → 2"):
        assert change in notice[0]


def test_failed_checkpoint_write_is_named_cleaned_up_and_keeps_the_last_good_one(tmp_path, tokenizer, make_model, prompts, monkeypatch):
    real_save = ckpt.torch.save

    def disk_full_at_step_2(obj, path):
        if "checkpoint-2" in path and path.endswith("trainer_state.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, path)

    monkeypatch.setattr(ckpt.torch, "save", disk_full_at_step_2)
    with pytest.raises(ckpt.CheckpointWriteError, match="could not write checkpoint .*checkpoint-2' \\(No space left on device\\).*checkpoint-1' is untouched"):
        train(tmp_path, tokenizer, make_model, prompts, max_steps=3, save_steps=1)
    out = str(tmp_path / "out")
    assert sorted(os.listdir(out)) == ["README.md", "checkpoint-1", "metrics.jsonl"]  # no .tmp-checkpoint-2 left
    ckpt.read_manifest(os.path.join(out, "checkpoint-1"))  # complete


def test_ctrl_c_saves_the_current_step_and_says_how_to_resume(tmp_path, tokenizer, make_model, prompts):
    calls = []

    def interrupted_in_second_rollout(completion_ids, **kw):  # one rollout per optimizer step here
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the handler only sets a flag: this rollout and its step finish
        return reward_even_tokens(completion_ids)

    with pytest.raises(TrainingInterrupted, match="interrupted at step 2/4; saved .*checkpoint-2. Resume with trainer.train\\(resume_from_checkpoint=True\\)"):
        train(tmp_path, tokenizer, make_model, prompts, interrupted_in_second_rollout, save_steps=1000)
    out = str(tmp_path / "out")
    assert [os.path.basename(p) for p in ckpt.checkpoints(out)] == ["checkpoint-2"]
    _, result = train(tmp_path, tokenizer, make_model, prompts, resume=True, save_steps=1000)
    assert result.global_step == 4 and steps(os.path.join(out, "metrics.jsonl")) == [1, 2, 3, 4]


def test_the_same_trainer_resumes_after_ctrl_c_and_refuses_what_it_would_not_do(tmp_path, tokenizer, make_model, prompts):
    # A notebook: Ctrl-C, then train(resume_from_checkpoint=True) on the same trainer goes on from the saved step. train()
    # again without a resume used to claim output_dir afresh, so with overwrite_output_dir it removed the run's
    # checkpoints and metrics, then trained nothing (the trainer was at max_steps); a max_steps raised in args after
    # __init__ was reported "applied" and trained nothing. Both are refused now, before output_dir is touched.
    calls = []

    def interrupted_in_second_rollout(completion_ids, **kw):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return reward_even_tokens(completion_ids)

    trainer = GRPOTrainer(make_model(), interrupted_in_second_rollout, args=config(tmp_path, save_steps=1000, overwrite_output_dir=True),
                          train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(TrainingInterrupted, match="interrupted at step 2/4"):
        trainer.train()
    assert trainer.train(resume_from_checkpoint=True).global_step == 4
    out = str(tmp_path / "out")
    kept = {name: os.path.getmtime(os.path.join(out, name)) for name in os.listdir(out)}
    assert {"checkpoint-2", "checkpoint-4", "metrics.jsonl"} <= set(kept) and steps(os.path.join(out, "metrics.jsonl")) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"this trainer has already trained to step 4/4: call train\(resume_from_checkpoint=True\) to go on "
                                         r"from \S+checkpoint-4, or build a "
                                         r"new GRPOTrainer to start a new run \(nothing in '.*out' was touched\)\.$"):
        trainer.train()
    trainer.args.max_steps = 6
    with pytest.raises(ValueError, match=r"args.max_steps is 6, but this trainer was built for max_steps=4 .* --max_steps 6 --resume`\)\.$"):
        trainer.train(resume_from_checkpoint=True)
    assert {name: os.path.getmtime(os.path.join(out, name)) for name in os.listdir(out)} == kept


def test_second_ctrl_c_aborts_at_once():
    before = signal.getsignal(signal.SIGINT)
    with StopOnInterrupt() as interrupt:
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupt.flag
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


# ---------------------------------------------------------------- found by a bad-input sweep after the round-2 merge


@pytest.mark.parametrize("field,value,error", [
    ("temperature", "0.7", "temperature='0.7' has type str; give one of type float"),
    ("num_generations", 2.5, "num_generations=2.5 has type float; give one of type int"),
    ("seed", "abc", "seed='abc' has type str; give one of type int"),
    ("disable_dropout", 1, "disable_dropout=1 has type int; give one of type bool"),
    ("learning_rate", float("inf"), "learning_rate=inf: give a finite number"),
    ("beta", float("nan"), "beta=nan: give a finite number"),
    ("reward_weights", [1.0, float("nan")], "every value must be a finite number"),
    # found by the session-36 rewards sweep: torch.tensor(["1"]) said "too many dimensions 'str'" when the trainer was built
    ("reward_weights", ["1", 0.5], "reward_weights=[[]'1', 0.5] holds '1' (str); give numbers, e.g. [[]1.0, 0.5]"),
    ("reward_weights", [1.0, None], "reward_weights=[[]1.0, None] holds None (NoneType); give numbers"),
    # found by the session-23 sweep: a TypeError from inside fastgrpo ("got multiple values for keyword argument"), a bare
    # "'NoneType' object is not iterable" for TRL's report_to=None (now "none"), a contradictory message for ["none", …]
    ("chat_template_kwargs", {"add_generation_prompt": False}, "chat_template_kwargs holds 'add_generation_prompt', which fastgrpo passes"),
    ("chat_template_kwargs", '{"tools": "x", "enable_thinking": false}', "chat_template_kwargs holds 'tools', which"),
    ("report_to", ["none", "tensorboard"], "'tensorboard'.: 'none' means no tracker; give it alone"),
    # found by the session-29 sweep: torch's optimizer refused these after the model loaded, in words naming no field
    ("adam_beta1", 1.5, "adam_beta1=1.5: use a value in [[]0, 1), e.g. 0.9"),
    ("adam_beta2", -0.1, "adam_beta2=-0.1: use a value in [[]0, 1), e.g. 0.999"),
    ("adam_epsilon", -1e-8, "adam_epsilon=-1e-08: use 0 or a small positive value"),
    ("weight_decay", -1.0, "weight_decay=-1.0: use 0 (none) or a positive value"),
])
def test_config_values_of_the_wrong_type_or_not_finite_name_the_field(tmp_path, field, value, error):
    with pytest.raises((TypeError, ValueError), match=error.replace("(", r"\(").replace(")", r"\)")):
        config(tmp_path, **{field: value})


def test_config_keeps_trls_bool_spelling_and_an_int_for_a_float(tmp_path):
    args = config(tmp_path, scale_rewards=False, learning_rate=1, max_grad_norm=float("inf"))  # inf: no clipping
    assert args.scale_rewards == "none" and args.learning_rate == 1
    assert config(tmp_path, report_to=None).report_to == []  # transformers 5: None reports to no tracker


def test_a_reward_argument_no_dataset_column_fills_is_refused_before_loading(tmp_path, prompts):
    # It failed at the first scoring for the train set, and for an eval set only at the first evaluation, after training.
    def needs_ans(completions, ans, **kwargs):
        return [float(a in c) for a, c in zip(ans, completions)]

    with pytest.raises(ValueError, match="reward function 'needs_ans' needs 'ans', which train_dataset does not have \\(columns: prompt, n\\)"):
        GRPOTrainer(NOT_LOADED, needs_ans, args=config(tmp_path), train_dataset=prompts)
    train = [{"prompt": "Count to 3.", "ans": "3"}] * 8
    with pytest.raises(ValueError, match="reward function 'needs_ans' needs 'ans', which eval dataset does not have \\(columns: prompt\\)"):
        GRPOTrainer(NOT_LOADED, needs_ans, args=config(tmp_path), train_dataset=train, eval_dataset=[{"prompt": "Count to 4."}])


def test_a_misspelt_reward_argument_is_named_with_the_one_meant(tmp_path, prompts):
    # TRL's docs' "Example 1" declares `completions_ids`: TRL fails inside train() ("missing 1 required positional argument").
    def reward_func(completions_ids, **kwargs):
        return [float(len(ids)) for ids in completions_ids]

    with pytest.raises(ValueError, match=r"needs 'completions_ids', which train_dataset does not have \(columns: prompt, n\); did you mean 'completion_ids'\? Else add"):
        GRPOTrainer(NOT_LOADED, reward_func, args=config(tmp_path), train_dataset=prompts)


def test_a_datasets_prompt_completion_and_completion_ids_columns_never_reach_the_rewards_as_trls(tmp_path, tokenizer, make_model):
    # A prompt–completion dataset (TL;DR's): TRL's _calculate_rewards drops "prompt", "completion" and "completion_ids";
    # fastgrpo passed the reference `completion` to every reward function, and refused a "completion_ids" column.
    seen = []

    def reward(completions, completion_ids, **kwargs):
        seen.append((sorted(kwargs), completion_ids))
        return [0.5] * len(completions)

    rows = [{"prompt": "Count to 3.", "completion": "1 2 3", "completion_ids": [7, 7], "answer": "3"}] * 4
    args = config(tmp_path, per_device_train_batch_size=4, num_generations=4, max_steps=1)
    GRPOTrainer(make_model(), reward, args=args, train_dataset=rows, processing_class=tokenizer).train()
    (keys, ids), = seen
    assert keys == ["answer", "log_extra", "log_metric", "prompts", "trainer_state"] and [7, 7] not in ids  # the sampled tokens, not the column

    def wants_reference(completions, completion, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="needs 'completion', a train_dataset column that reward functions never receive \\(TRL drops prompt, completion, completion_ids"):
        GRPOTrainer(NOT_LOADED, wants_reference, args=args, train_dataset=rows)


@pytest.mark.parametrize("fields,error", [
    # each used to fail only after the model loaded, or after the first optimizer step (ReduceLROnPlateau.step wants a metric)
    ({"lr_scheduler_type": "reduce_lr_on_plateau"}, "lr_scheduler_type='reduce_lr_on_plateau' steps on a metric the GRPO loop does not have"),
    ({"lr_scheduler_type": "bogus"}, "lr_scheduler_type='bogus' with lr_scheduler_kwargs=None: transformers' get_scheduler refuses it"),
    ({"lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {"num_cycle": 2}}, "lr_scheduler_kwargs=\\{'num_cycle': 2\\}: transformers' get_scheduler refuses it"),
    ({"lr_scheduler_type": "cosine_with_min_lr"}, "lr_scheduler_type='cosine_with_min_lr' with lr_scheduler_kwargs=None: transformers' get_scheduler refuses it"),
    ({"eval_strategy": "steps"}, "eval_strategy='steps' but no eval_dataset was passed"),  # transformers' Trainer refuses it too
    ({"optim_args": "foo"}, "optim_args='foo' cannot be built here .*; give optim_args as key=value pairs"),
    ({"optim": "adamw_bnb_8bit"}, "optim='adamw_bnb_8bit' with optim_args=None cannot be built here \\(You need to install `bitsandbytes`"),
    ({"eval_on_start": True}, "eval_strategy='no' with eval_on_start but no eval_dataset was passed"),
])
def test_a_schedule_or_evaluation_that_cannot_run_is_refused_before_loading(tmp_path, prompts, fields, error):
    with pytest.raises(ValueError, match=error):
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, **fields), train_dataset=prompts)


@pytest.mark.parametrize("report_to", ["wandb", "trackio", ["tensorboard", "wandb"]])
def test_a_tracker_that_is_not_installed_is_refused_before_loading(tmp_path, prompts, monkeypatch, report_to):
    import fastgrpo.run.trackers as trackers

    monkeypatch.setitem(trackers.AVAILABLE, "wandb", (lambda: False, "wandb"))  # whatever this machine has: the check reads the table
    monkeypatch.setitem(trackers.AVAILABLE, "trackio", (lambda: False, "trackio"))
    missing = "wandb" if "wandb" in report_to else "trackio"  # it warned and logged nowhere (accelerate), where transformers raises
    with pytest.raises(ValueError, match=f"but {missing} is not installed: pip install {missing}, or report_to='none'"):
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, report_to=report_to), train_dataset=prompts)


@pytest.mark.parametrize("report_to,error", [
    # transformers' own availability functions decide, as its callbacks do; the pip name is not always the key
    ("comet_ml", "but comet_ml is not installed: pip install comet-ml, or report_to='none'"),
    (["swanlab", "clearml"], "but swanlab, clearml are not installed: pip install swanlab clearml, or report_to='none'"),
    ("dagshub", "but dagshub is not installed: pip install dagshub mlflow, or report_to='none'"),
    ("kubeflow", "but kubeflow is not installed: set KUBEFLOW_TRAINER_SERVER_URL \\(a Kubeflow TrainJob"),  # an environment, not a package
])
def test_any_tracker_transformers_takes_that_cannot_run_is_refused_before_loading(tmp_path, prompts, monkeypatch, report_to, error):
    if any(importlib.util.find_spec(p) for p in ("comet_ml", "swanlab", "clearml", "dagshub")):  # none is in the dev extra
        pytest.skip("needs comet_ml, swanlab, clearml and dagshub absent")
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    with pytest.raises(ValueError, match=error):  # each used to stop at GRPOConfig: only tensorboard, wandb and trackio were taken
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, report_to=report_to), train_dataset=prompts)


def test_an_empty_dict_of_eval_sets_is_refused_before_loading(tmp_path, prompts):
    with pytest.raises(ValueError, match="eval_dataset is an empty dict: nothing would be evaluated"):  # it trained on, never evaluating
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, eval_strategy="steps", eval_steps=1), train_dataset=prompts, eval_dataset={})


def test_a_best_metric_evaluation_does_not_report_is_refused_before_loading(tmp_path, prompts):
    evals = {"easy": prompts.select(range(4)), "hard": prompts.select(range(4, 8))}
    with pytest.raises(ValueError, match=r"metric_for_best_model='eval_rewrad': did you mean 'eval_hard_reward'\? evaluation reports, for "
                       r"eval_easy, eval_hard: _loss, _reward, _reward_std, .*, _entropy, .*, _rewards/reward_even_tokens/std; use one of them\."):
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, metric_for_best_model="eval_rewrad"), train_dataset=prompts,
                    eval_dataset=evals)
    for name, fields in (("eval_hard_reward", {}), ("easy_rewards/reward_even_tokens/mean", {}), ("eval_easy_entropy", {}),
                         ("eval_hard_num_tokens", {}), ("eval_easy_clip_ratio/region_mean", {}), ("eval_easy_kl", {"beta": 0.1})):
        with pytest.raises(ValueError, match="does not exist"):  # past the check ("eval_" added when missing), at the model it must not load
            GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, metric_for_best_model=name, **fields), train_dataset=prompts,
                        eval_dataset=evals)
    with pytest.raises(ValueError, match="did you mean 'eval_easy_loss'"):  # no KL term at β = 0: not reported
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, metric_for_best_model="eval_easy_kl"), train_dataset=prompts,
                    eval_dataset=evals)


def test_a_best_metric_of_a_reward_that_applied_to_no_eval_completion_is_none_and_never_best(tmp_path, tokenizer, make_model, prompts):
    """A reward returning None on every eval completion was left out of the eval metrics, so metric_for_best_model naming
    it passed the check and then stopped the run at its first evaluation. TRL logs None (its log() of nanmean's NaN); it is
    never the best. Both now hold: the run trains on, with no best metric."""
    def train_only(completion_ids, trainer_state, **kw):
        return [None] * len(completion_ids) if trainer_state.global_step == 0 or kw.get("n") is None else reward_even_tokens(completion_ids)

    evals = [{"prompt": row["prompt"]} for row in prompts.select(range(2))]  # no "n" column: the reward applies to none
    args = config(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1, metric_for_best_model="eval_rewards/train_only/mean")
    trainer = GRPOTrainer(make_model(), train_only, args=args, train_dataset=prompts, eval_dataset=evals, processing_class=tokenizer)
    trainer.train()
    logged = [r for r in trainer.state.log_history if "eval_rewards/train_only/mean" in r]
    assert len(logged) == 2 and all(r["eval_rewards/train_only/mean"] is None for r in logged)  # TRL's log(): None
    assert trainer.state.best_metric is None and trainer.state.global_step == 2


class PatientStopping(EarlyStoppingCallback):
    pass


@pytest.mark.parametrize("callback", [EarlyStoppingCallback(early_stopping_patience=2), EarlyStoppingCallback, PatientStopping])
@pytest.mark.parametrize("fields,error", [
    ({"eval_strategy": "steps", "eval_steps": 1}, "EarlyStoppingCallback stops on a metric .* metric_for_best_model is None; set it, e.g. metric_for_best_model='reward'"),
    ({"metric_for_best_model": "reward"}, "EarlyStoppingCallback compares 'reward' across evaluations, and eval_strategy='no' runs none; set eval_strategy='steps'"),
])
def test_early_stopping_that_cannot_compare_is_refused_before_loading(tmp_path, prompts, callback, fields, error):
    # transformers asserts both at on_train_begin, after the model loaded (AssertionError, no fix named).
    with pytest.raises(ValueError, match=error):
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, **fields), train_dataset=prompts, eval_dataset=prompts.select(range(4)),
                    callbacks=[callback])
    fine = {"eval_strategy": "steps", "eval_steps": 1, "metric_for_best_model": "reward"}
    with pytest.raises(ValueError, match="does not exist"):  # past the check, at the model it must not load
        GRPOTrainer(NOT_LOADED, reward_even_tokens, args=config(tmp_path, **fine), train_dataset=prompts, eval_dataset=prompts.select(range(4)),
                    callbacks=[callback])


def test_early_stopping_added_later_is_checked_when_added(tmp_path, tokenizer, make_model, prompts):
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, eval_strategy="steps", eval_steps=1), train_dataset=prompts,
                          eval_dataset=prompts.select(range(4)), processing_class=tokenizer)
    for callback in (EarlyStoppingCallback(), PatientStopping):  # it failed at train() with transformers' bare AssertionError
        with pytest.raises(ValueError, match="EarlyStoppingCallback stops on a metric .* metric_for_best_model is None"):
            trainer.add_callback(callback)


@pytest.mark.parametrize("kwargs,error", [
    ({"args": "trl-args"}, "args has type builtins.str; give a fastgrpo GRPOConfig"),
    ({"model": 5}, "model has type int; give a model name"),
    ({"reward_funcs": []}, "reward_funcs is empty"),
    ({"reward_funcs": None}, "reward_funcs is empty"),
    ({"reward_funcs": [42]}, "reward_funcs entry 42 has type int"),
    ({"callbacks": TrainerCallback()}, r"callbacks is <.*TrainerCallback object at .*> \(TrainerCallback\), not a list; give a list: "
     r"callbacks=\[TrainerCallback\(\)\] \(transformers' Trainer takes a list\)"),
    ({"reward_processing_classes": ["tok"]}, r"reward_processing_classes\[0\] is 'tok' \(str\); give the reward model's tokenizer"),
    ({"reward_processing_classes": "tok"}, r"reward_processing_classes is 'tok' \(str\)"),
])
def test_trainer_arguments_of_the_wrong_kind_are_refused_before_loading(tmp_path, prompts, kwargs, error):
    given = {"model": NOT_LOADED, "reward_funcs": reward_even_tokens, "args": config(tmp_path), "train_dataset": prompts, **kwargs}
    with pytest.raises((TypeError, ValueError), match=error):
        GRPOTrainer(**given)


def test_non_finite_gradient_stops_before_the_optimizer_step(tmp_path, tokenizer, make_model, prompts):
    model = make_model()
    model.model.layers[0].mlp.down_proj.weight.register_hook(lambda grad: torch.full_like(grad, float("nan")))  # a NaN gradient
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(model, reward_even_tokens, args=config(tmp_path, save_steps=1), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(FloatingPointError, match=r"step 1: the gradient norm is nan .* the weights were not updated"):
        trainer.train()
    after = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    assert all(torch.equal(before[k], after[k].cpu()) for k in before)  # no step was applied
    assert not ckpt.checkpoints(trainer.args.output_dir)  # and no checkpoint of a broken step was written


def test_sampler_refuses_non_finite_logits(tokenizer, make_model):
    from fastgrpo.generation.contract import SamplingSettings
    from fastgrpo.generation.sampler import Sampler

    model = make_model().eval()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    ids = torch.tensor([tokenizer("Hi")["input_ids"]])
    sampler = Sampler(model, SamplingSettings(max_completion_length=4, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id))
    with pytest.raises(ValueError, match="logits hold inf or NaN at completion token 0"):
        sampler.sample(ids, torch.ones_like(ids), 2)


@pytest.mark.parametrize("value", [1e308, -1e39])
def test_reward_beyond_float32_names_the_function(tmp_path, tokenizer, make_model, prompts, value):
    def huge(completions, **kw):
        return [value] + [0.0] * (len(completions) - 1)

    trainer = GRPOTrainer(make_model(), huge, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(ValueError, match="'huge' returned .* for completion 0; rewards must be finite numbers within"):
        trainer.train()


@pytest.mark.parametrize("argv,error", [
    (["--config", "/no/such/run.yaml"], "cannot read it"),
    (["--dataset_size", "0"], "dataset_size=0"),
])
def test_cli_file_and_size_errors_are_one_line(tmp_path, capsys, argv, error):
    assert main(["train", *argv, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and error in err


def test_cli_yaml_syntax_error_is_one_line(tmp_path, capsys):
    bad = tmp_path / "run.yaml"
    bad.write_text("model: [unclosed\n")
    assert main(["train", "--config", str(bad), "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not valid YAML" in err


# ---------------------------------------------------------------- token ids the model has no embedding row for
@pytest.fixture
def grown_tokenizer(tokenizer):
    """SmolLM2's tokenizer with one token added (id 49152) and the model's embedding not grown: tiny_model has 49152 rows."""
    grown = copy.deepcopy(tokenizer)
    grown.add_tokens(["<secret>"])
    return grown


def test_a_prompt_token_the_embedding_lacks_is_refused_naming_both_sizes(tmp_path, grown_tokenizer, make_model):
    secret = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say <secret> {i}."}]} for i in range(8)])
    with pytest.warns(UserWarning, match="the tokenizer has 49153 tokens but the model's input embedding has 49152 rows: a prompt holding one of the last 1"):
        trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, save_steps=1), train_dataset=secret,
                              processing_class=grown_tokenizer)
    # it used to fail in the embedding with "index out of range in self"
    with pytest.raises(ValueError, match=r"prompt '.*Say <secret> \d\.<\|im_end\|>\\n<\|im_start\|>assistant\\n' holds token '<secret>' id 49152, "
                       r"but the model's input embedding has 49152 rows \(its tokenizer has 49153 tokens\); .*model\.resize_token_embeddings"):
        trainer.train()
    assert not ckpt.checkpoints(trainer.args.output_dir)


def test_a_padding_id_the_embedding_lacks_is_refused_when_the_trainer_is_built(tmp_path, grown_tokenizer, make_model, prompts):
    grown_tokenizer.pad_token = "<secret>"
    with pytest.raises(ValueError, match=r"the tokenizer's pad_token_id=49152 \('<secret>'\) is not among the model's 49152 embedding rows"):
        GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=grown_tokenizer)


def test_rollout_func_token_ids_the_embedding_lacks_are_refused(tmp_path, tokenizer, make_model, prompts):
    def rollout_func(prompts, trainer):  # one completion per prompt received; the third holds an id one past the vocabulary
        n = len(prompts)
        completions = [[5, 6, tokenizer.eos_token_id]] * 2 + [[5, 49152, tokenizer.eos_token_id]] + [[5, 6, tokenizer.eos_token_id]] * (n - 3)
        return {"prompt_ids": [[1, 2, 3]] * n, "completion_ids": completions, "logprobs": [[-1.0] * 3] * n}

    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer,
                          rollout_func=rollout_func)
    with pytest.raises(ValueError, match=r"rollout_func's completion_ids\[2\] holds token id 49152, but the model's input embedding has 49152 rows"):
        trainer.train()


def test_a_tilde_in_the_output_folder_or_the_model_path_is_the_home_folder(tmp_path, tokenizer, make_model, prompts, monkeypatch):
    # A YAML file's "~/…" reaches fastgrpo unexpanded: output_dir made a folder named "~" in the working folder (transformers'
    # TrainingArguments expands it), and a model "~/…" passed the existence check, then was looked up on the hub.
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    make_model().save_pretrained(home / "models" / "tiny")
    tokenizer.save_pretrained(home / "models" / "tiny")
    args = GRPOConfig(output_dir="~/runs/a", max_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                      report_to=[], disable_tqdm=True)
    assert args.output_dir == str(home / "runs" / "a")
    GRPOTrainer("~/models/tiny", reward_even_tokens, args=args, train_dataset=prompts).train()
    assert os.path.exists(home / "runs" / "a" / "metrics.jsonl") and os.listdir(work) == []


# ---------------------------------------------------------------- found by the notebook sweep (one process, many calls)


def test_args_changed_after_the_trainer_was_built_are_refused_or_applied(tmp_path, tokenizer, make_model, prompts):
    # transformers' Trainer builds the optimizer and schedule in train() and reads the rest of args where it uses them, so
    # `trainer.args.learning_rate = 0` before train() applies there. fastgrpo built them (and the sampler, the loss, the
    # gradient clip) in __init__: the run trained at 1e-3 with a decaying schedule and logged no sign of the change.
    # Refused now before anything is written, naming each field, both values and the fix; the log/save intervals apply.
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, max_steps=2), train_dataset=prompts, processing_class=tokenizer)
    trainer.args.learning_rate, trainer.args.lr_scheduler_type = 0.0, "constant"
    with pytest.raises(ValueError, match=r"^args changed after this GRPOTrainer was built: learning_rate=0.0 \(built with 0.001\), "
                                         r"lr_scheduler_type='constant' \(built with 'linear'\)\. .*build a new GRPOTrainer with these args"):
        trainer.train()
    trainer.args.generation_kwargs = {"top_p": 0.5}  # a dict changed in place counts too
    trainer.args.learning_rate, trainer.args.lr_scheduler_type = 1e-3, "linear"
    with pytest.raises(ValueError, match=r"built: generation_kwargs=\{'top_p': 0.5\} \(built with None\)\. The trainer read it when"):
        trainer.train()
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")
    trainer.args.generation_kwargs, trainer.args.logging_steps, trainer.args.save_steps = None, 2, 1
    trainer.args.max_steps = 2  # the planned length itself is no change
    assert trainer.train().global_step == 2
    assert steps(str(tmp_path / "out" / "metrics.jsonl")) == [2] and os.path.isdir(tmp_path / "out" / "checkpoint-1")
    # another config put in its place: fields it lacked were a KeyError; a long list is cut short
    trainer.args = AsyncGRPOConfig(trainer.args.output_dir, max_steps=2, use_cpu=True, report_to="none", request_timeout=5)
    with pytest.raises(ValueError, match=r"^args changed after this GRPOTrainer was built: .* and \d+ more\. The trainer read them when"):
        trainer.train(resume_from_checkpoint=True)


def test_datasets_set_on_the_trainer_are_evaluated_or_refused(tmp_path, tokenizer, make_model, prompts):
    # Trainer reads trainer.eval_dataset at each evaluation and trainer.train_dataset in train(). fastgrpo had read both
    # once in __init__: evaluate() after `trainer.eval_dataset = other` scored the old rows, and train() after
    # `trainer.train_dataset = other` drew the old order's row numbers from the new rows (IndexError mid-run, after the
    # model loaded; with more rows, rows silently left out). The eval rows apply now; the train rows are refused.
    seen = []

    def recorded(completion_ids, prompts, **kw):
        seen.extend(p[0]["content"] for p in prompts)
        return reward_even_tokens(completion_ids)

    trainer = GRPOTrainer(make_model(), recorded, args=config(tmp_path, max_steps=2, per_device_eval_batch_size=4),
                          train_dataset=prompts, eval_dataset=prompts.select(range(4)), processing_class=tokenizer)
    other = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Spell {i}."}]} for i in range(4)])
    trainer.eval_dataset = other
    trainer.evaluate()
    assert trainer.eval_dataset is other and sorted(set(seen)) == [f"Spell {i}." for i in range(4)]
    with pytest.raises(AttributeError, match=r"(?s)^trainer.train_dataset = .*: fastgrpo plans the run's data order .*give "
                                             r"GRPOTrainer\(train_dataset=…\) to a new trainer\.$"):
        trainer.train_dataset = other
    assert trainer.train_dataset is prompts
    trainer.args.eval_strategy = "steps"  # eval_dataset=None would skip the scheduled evaluations silently
    with pytest.raises(ValueError, match=r"^trainer.eval_dataset = None with eval_strategy='steps': the scheduled evaluations"):
        trainer.eval_dataset = None
    assert trainer.eval_dataset is other


def test_trainer_objects_it_built_with_are_read_only(tmp_path, tokenizer, make_model, prompts):
    # TRL reads trainer.reward_funcs and trainer.reward_weights at each rollout, and transformers' train() uses a
    # trainer.optimizer set before it; fastgrpo had handed all of them (and the model) to its parts in __init__, so a
    # notebook's `trainer.reward_weights = torch.tensor([0.0])` was accepted and changed nothing it trained on.
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, max_steps=1), train_dataset=prompts, processing_class=tokenizer)
    kept = trainer.model, trainer.optimizer, trainer.reward_funcs, trainer.reward_weights
    for name, value, fix in [("reward_funcs", [reward_even_tokens], r"GRPOTrainer\(reward_funcs=…\)"),
                             ("reward_weights", torch.tensor([0.0]), r"GRPOConfig\(reward_weights=\[…\]\)"),
                             ("optimizer", torch.optim.SGD(trainer.model.parameters(), lr=0.1), r"GRPOTrainer\(optimizers=\(optimizer, None\)\)"),
                             ("model", make_model(1), r"GRPOTrainer\(model=…\)")]:
        with pytest.raises(AttributeError, match=rf"(?s)^trainer.{name} = .*: .*so setting it here would change nothing; give {fix} to a new trainer\.$"):
            setattr(trainer, name, value)
    assert (trainer.model, trainer.optimizer, trainer.reward_funcs, trainer.reward_weights) == kept
    assert trainer.reward_funcs == [reward_even_tokens] and trainer.reward_weights.tolist() == [1.0]


def test_train_again_after_a_failure_before_the_first_step_starts_the_data_afresh(tmp_path, tokenizer, make_model, prompts):
    # Trainer's train() builds a new dataloader, so a train() retried after one that failed in its first rollout (a reward
    # function raised) starts from the first prompts. fastgrpo's data order kept the failed rollout's draw: the retry
    # skipped those prompts and its epoch ran one rollout ahead (0.1875 at step 2 of a 32-prompt set, not 0.125).
    seen, fail = [], [True]

    def flaky(completion_ids, prompts, **kw):
        if fail.pop() if fail else False:
            raise ValueError("a bug fixed in the notebook")
        seen.append(sorted(p[0]["content"] for p in prompts))
        return reward_even_tokens(completion_ids)

    trainer = GRPOTrainer(make_model(), flaky, args=config(tmp_path, max_steps=2), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(RewardFunctionError, match="a bug fixed in the notebook"):
        trainer.train()
    assert trainer.train().metrics["epoch"] == 0.125
    retried, seen[:] = list(seen), []
    fresh = GRPOTrainer(make_model(), flaky, args=config(tmp_path / "fresh", max_steps=2), train_dataset=prompts, processing_class=tokenizer)
    fresh.train()
    assert retried == seen and [r["step"] for r in read_metrics(str(tmp_path / "out"))] == [1, 2]
