"""The command line: which values apply, typed YAML and flags, LoRA options, --help time, the example run file.

The run tests call `cli.main` in-process on the tiny model (a few seconds each).
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import yaml

from fastgrpo import cli
from fastgrpo.cli import BUILTIN_JOB, main, resolve_job, train_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "run.yaml")


def parse(*argv):
    return resolve_job(train_parser().parse_args(list(argv)))


def test_builtin_job_values_apply_to_the_builtin_job_only():
    job, fields, _ = parse("--num_iterations", "2")
    assert job["model"] == BUILTIN_JOB["model"] and fields["max_steps"] == 48 and fields["num_iterations"] == 2
    job, fields, _ = parse("--dataset", "data.jsonl", "--reward", "length")
    assert job["dataset"] == "data.jsonl" and fields == {}  # GRPOConfig's defaults, not the built-in job's


def test_own_job_without_reward_is_refused_listing_the_rewards(capsys):
    assert main(["train", "--model", "./no-such-model"]) == 2  # refused before the model path is even looked at
    err = capsys.readouterr().err
    assert "needs --reward" in err and "length, format, brevity, reasoning_gym" in err


def test_builtin_reward_names_match_the_library():
    from fastgrpo.tasks.rewards import BUILTIN_REWARDS

    assert tuple(BUILTIN_REWARDS) == cli.BUILTIN_REWARD_NAMES


def test_flags_are_typed_by_hf_argument_parser(capsys):
    _, fields, _ = parse("--reward_weights", "1", "0.5", "--generation_kwargs", '{"top_k": 20}', "--bf16", "false", "--report_to", "tensorboard")
    assert fields["reward_weights"] == [1.0, 0.5] and fields["bf16"] is False and fields["report_to"] == "tensorboard"  # one text, as TRL's flag
    from fastgrpo import GRPOConfig

    assert GRPOConfig(**fields).report_to == ["tensorboard"]
    assert GRPOConfig(**fields).generation_kwargs == {"top_k": 20}  # JSON text → dict, as TrainingArguments does
    assert GRPOConfig(**parse("--report_to", "none")[1]).report_to == []  # "none" is no tracker, as in transformers
    with pytest.raises(SystemExit):
        train_parser().parse_args(["--num_iterations", "four"])
    assert "--num-iterations: invalid int value: 'four'" in capsys.readouterr().err


def test_trl_grpos_model_loading_flags_become_model_init_kwargs_as_there(tmp_path):
    # trl grpo puts ModelConfig's model_revision, attn_implementation and dtype into model_init_kwargs, a model_init_kwargs
    # given too winning; they were "unknown flag --dtype; did you mean --loss_type?" here.
    _, fields, _ = parse("--dataset", "d.jsonl", "--reward", "length", "--dtype", "bfloat16", "--attn_implementation", "sdpa",
                         "--model_revision", "v2", "--model_init_kwargs", '{"dtype": "float32"}')
    assert fields["model_init_kwargs"] == {"revision": "v2", "attn_implementation": "sdpa", "dtype": "float32"}
    assert parse("--dataset", "d.jsonl", "--reward", "length", "--dtype", "auto")[1]["model_init_kwargs"] == {"dtype": "auto"}
    assert "model_init_kwargs" not in parse("--dataset", "d.jsonl", "--reward", "length")[1]  # fastgrpo's fp32 default stands
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "m", "dataset_name": "d.jsonl", "reward": "length", "dtype": "bfloat16"}))
    assert parse("--config", str(recipe))[1]["model_init_kwargs"] == {"dtype": "bfloat16"}
    with pytest.raises(SystemExit):
        train_parser().parse_args(["--dtype", "bf16"])  # TRL's choices


def test_trl_grpos_bitsandbytes_flags_become_the_trainers_quantization_config_as_there(tmp_path):
    # trl grpo builds quantization_config from ModelConfig's load_in_4bit/8bit options (get_quantization_config, compute
    # dtype = --dtype); they were "unknown flag --load_in_4bit".
    job, fields, _ = parse("--dataset", "d.jsonl", "--reward", "length", "--use_peft", "--load_in_4bit", "--dtype", "bfloat16",
                           "--bnb_4bit_quant_type", "fp4", "--use_bnb_nested_quant", "--bnb_4bit_quant_storage", "uint8")
    q = job["quantization_config"]
    assert (q.load_in_4bit, q.load_in_8bit, q.bnb_4bit_quant_type, q.bnb_4bit_use_double_quant) == (True, False, "fp4", True)
    assert (q.bnb_4bit_compute_dtype, q.bnb_4bit_quant_storage) == (torch.bfloat16, torch.uint8)
    assert fields["model_init_kwargs"] == {"dtype": "bfloat16"} and "load_in_4bit" not in fields
    q = parse("--dataset", "d.jsonl", "--reward", "length", "--load_in_4bit", "--dtype", "auto")[0]["quantization_config"]
    assert (q.bnb_4bit_quant_type, q.bnb_4bit_compute_dtype) == ("nf4", torch.float32)  # TRL's default; auto names no dtype yet
    q = parse("--dataset", "d.jsonl", "--reward", "length", "--load_in_8bit")[0]["quantization_config"]
    assert (q.load_in_8bit, q.load_in_4bit) == (True, False)
    assert parse("--dataset", "d.jsonl", "--reward", "length")[0]["quantization_config"] is None
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": "m", "dataset": "d.jsonl", "reward": "length", "load_in_4bit": "true"}))
    assert parse("--config", str(recipe))[0]["quantization_config"].load_in_4bit  # YAML text typed as the flag
    with pytest.raises(ValueError, match="--load_in_4bit and --load_in_8bit were both given; choose one"):
        parse("--dataset", "d.jsonl", "--reward", "length", "--load_in_4bit", "--load_in_8bit")
    with pytest.warns(UserWarning, match=r"^bnb_4bit_quant_type='fp4' has no effect while load_in_4bit is off; add --load_in_4bit"):
        assert parse("--dataset", "d.jsonl", "--reward", "length", "--bnb_4bit_quant_type", "fp4")[0]["quantization_config"] is None
    with pytest.raises(SystemExit):
        train_parser().parse_args(["--bnb_4bit_quant_type", "int4"])  # TRL's choices


def test_a_4bit_run_is_refused_without_adapters_and_reaches_the_loader_with_them(tmp_path, make_model, tokenizer, capsys):
    folder, data = str(tmp_path / "tiny"), tmp_path / "d.jsonl"
    make_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data.write_text("".join(json.dumps({"prompt": f"count to {i}"}) + "\n" for i in range(8)))
    argv = ["train", "--model", folder, "--dataset", str(data), "--reward", "length", "--output_dir", str(tmp_path / "out"), "--load_in_4bit"]
    assert main(argv) == 2
    assert "quantized by bitsandbytes, but no peft_config was given: quantized weights do not train" in capsys.readouterr().err
    assert main(argv + ["--use_peft"]) == 2  # this machine has no bitsandbytes: transformers' refusal shows the config reached it
    assert "cannot load the model with quantization_config" in capsys.readouterr().err


def test_trls_other_lora_options_reach_peft(tmp_path):
    # TRL's ModelConfig: lora_modules_to_save, lora_target_parameters, use_rslora, use_dora (get_peft_config's LoraConfig).
    _, _, lora = parse("--dataset", "d.jsonl", "--reward", "length", "--use_peft", "--use_rslora", "--use_dora",
                       "--lora_modules_to_save", "lm_head", "--lora_target_parameters", "mlp.experts.down_proj")
    config = cli.peft_kwargs(lora)["peft_config"]
    assert (config.use_rslora, config.use_dora, config.modules_to_save) == (True, True, ["lm_head"])
    assert config.target_parameters == ["mlp.experts.down_proj"] and config.bias == "none"
    plain = cli.peft_kwargs(parse("--dataset", "d.jsonl", "--reward", "length", "--use_peft")[2])["peft_config"]
    assert (plain.use_rslora, plain.use_dora, plain.modules_to_save, plain.target_parameters) == (False, False, None, None)


def test_mistyped_yaml_value_names_field_and_type(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"num_iterations": "four", "model": "m", "reward": "length"}))
    with pytest.raises(ValueError, match=r"num_iterations: expected int, got 'four'"):
        parse("--config", str(run))
    run.write_text(yaml.safe_dump({"learning_rate": 1, "bf16": None, "model": "m", "reward": "length"}))
    assert parse("--config", str(run))[1] == {"learning_rate": 1, "bf16": None}  # an int is a float; None fits bool | None
    # a mapping under environment: was "fastgrpo: error: unhashable type: 'dict'", naming neither the key nor the value
    run.write_text(yaml.safe_dump({"model": "m", "dataset": "calculator", "environment": {"calculator": 1}}))
    with pytest.raises(ValueError, match=r"^environment: \{'calculator': 1\} has type dict; give a name or a path \(text\), module:Class or calculator\.$"):
        parse("--config", str(run))
    # YAML 1.1 reads a bare `no` as false: `logging_strategy: no` (TRL's parser: "False is not a valid IntervalStrategy") named no fix
    run.write_text("model: m\nreward: length\nlogging_strategy: no\n")
    with pytest.raises(ValueError, match=r"logging_strategy: expected str, got False \(bool\); YAML reads a bare no, off or false as false: quote the text, logging_strategy: \"no\""):
        parse("--config", str(run))


def test_a_yaml_key_given_twice_is_refused_naming_it_and_its_line(tmp_path):
    """PyYAML (and so `trl grpo --config`) kept the last of two values silently: a recipe's second learning_rate, or a
    generation_kwargs' second top_k, replaced the first without a word."""
    run = tmp_path / "run.yaml"
    run.write_text("model: m\nreward: length\nlearning_rate: 1.0e-5\nlearning_rate: 1.0\n")
    with pytest.raises(ValueError, match=r"is not valid YAML: .*found the key 'learning_rate' twice \(only the last value would be kept\); "
                                         r"give each key once in \".*run.yaml\", line 4"):
        parse("--config", str(run))
    run.write_text("model: m\nreward: length\nuse_vllm: true\ngeneration_kwargs: {logit_bias: {5: 100, 5: -100}}\n")
    with pytest.raises(ValueError, match=r"found the key 5 twice"):
        parse("--config", str(run))
    # YAML's merge key is no repetition: an explicit key over a merged one stays YAML's override
    run.write_text("model: m\nreward: length\ngeneration_kwargs: {<<: {top_k: 5, top_p: 0.5}, top_k: 20}\n")
    assert parse("--config", str(run))[1]["generation_kwargs"] == {"top_k": 20, "top_p": 0.5}


def test_trls_script_spellings_of_model_and_dataset(tmp_path):
    """`trl grpo --model_name_or_path … --dataset_name …` and a TRL recipe's YAML keys name the model and dataset here too
    (they were "unknown flag", and --dataset_name got "did you mean --dataset_size?")."""
    job, _, _ = parse("--model_name_or_path", "m", "--dataset_name", "d.jsonl", "--reward", "length")
    assert (job["model"], job["dataset"]) == ("m", "d.jsonl")
    run = tmp_path / "recipe.yaml"
    run.write_text(yaml.safe_dump({"model_name_or_path": "m2", "dataset_name": "d2.jsonl", "reward": "length"}))
    job, fields, _ = parse("--config", str(run))
    assert (job["model"], job["dataset"]) == ("m2", "d2.jsonl") and "model_name_or_path" not in fields
    run.write_text(yaml.safe_dump({"model_name_or_path": "m2", "dataset_nme": "d2.jsonl", "reward": "length"}))
    with pytest.raises(ValueError, match=r"unknown key 'dataset_nme' \(did you mean 'dataset_name'\?\): a recipe takes GRPOConfig's fields"):
        parse("--config", str(run))  # GRPOConfig's own error suggested 'data_seed'


def test_trls_script_reward_flags_name_the_rewards_in_trls_order(tmp_path):
    """TRL's grpo script: the reward model first, then --reward_funcs, each a name of its registry (trl.rewards) or a
    dotted path module.function; they replace the built-in job's reward and count as naming the rewards."""
    import trl.rewards

    job, fields, _ = parse("--reward_funcs", "think_format_reward", "myrewards.short", "exact", "--reward_model_name_or_path", "./rm")
    assert job["model"] == BUILTIN_JOB["model"] and "reward_funcs" not in fields and job["reward"] == []
    assert cli.reward_specs(job) == ["./rm", trl.rewards.think_format_reward, "myrewards:short", "exact"]
    overlong = cli.reward_specs(parse("--reward_funcs", "get_soft_overlong_punishment")[0])[0]
    assert overlong(completion_ids=[[0] * 1000, [0] * 1200], completions=None) == [0.0, -(1200 - 1024) / 256]  # TRL's script's 1280, 256
    job, _, _ = parse("--model", "m", "--reward_funcs", "myrewards.short")  # a job of its own: no --reward needed
    assert cli.reward_specs(job) == ["myrewards:short"]
    run = tmp_path / "recipe.yaml"
    run.write_text(yaml.safe_dump({"model_name_or_path": "m", "reward_funcs": "a.b,c.d", "dataset_streaming": True, "max_steps": 2}))
    job, fields, _ = parse("--config", str(run))
    assert (job["reward_funcs"], job["dataset_streaming"], fields) == (["a.b", "c.d"], True, {"max_steps": 2})


def test_trls_script_dataset_flags_read_splits_of_a_dataset_folder(tmp_path, monkeypatch, tokenizer, make_model, capsys):
    """`--dataset_name <folder> --eval_strategy steps`: the folder's train split trains and its test split is evaluated,
    as TRL's script reads a hub dataset's (the reward tells them apart: 1 for a test prompt); a split the folder lacks
    is named with those it has; a configuration for a data file is refused (it has one split, no configuration)."""
    model_dir = tmp_path / "tiny"
    make_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (tmp_path / "data").mkdir()
    for split, n in (("train", 8), ("test", 2)):
        (tmp_path / "data" / f"{split}.jsonl").write_text("".join(json.dumps({"prompt": f"{split} {i}:"}) + "\n" for i in range(n)))
    (tmp_path / "splitrewards.py").write_text("def is_test(prompts, **kwargs):\n    return [float(p.startswith('test')) for p in prompts]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    flags = ["--model_name_or_path", str(model_dir), "--reward_funcs", "splitrewards.is_test", "--max_steps", "1", "--max_prompt_length", "64", "--per_device_train_batch_size", "4",
             "--num_generations", "4", "--max_completion_length", "4", "--disable_tqdm", "true", "--per_device_eval_batch_size", "4"]
    assert main(["train", *flags, "--dataset_name", "data", "--dataset_train_split", "validation", "--output_dir", "a"]) == 2
    assert "dataset 'data' has no split 'validation'; it has train, test" in capsys.readouterr().err
    assert main(["train", *flags, "--dataset_name", "data/train.jsonl", "--dataset_config", "main", "--output_dir", "b"]) == 2
    assert "config='main' apply to a hub dataset or a dataset folder" in capsys.readouterr().err
    assert main(["train", *flags, "--dataset_name", "data", "--eval_strategy", "steps", "--eval_steps", "1", "--output_dir", "out"]) == 0
    assert "rewards is_test; 1 step, μ=1" in capsys.readouterr().out  # the start-up line counts in English ("1 steps" before)
    records = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    train, evaluated = ([r for r in records if key in r] for key in ("rewards/is_test/mean", "eval_rewards/is_test/mean"))
    assert [r["rewards/is_test/mean"] for r in train] == [0.0] and [r["eval_rewards/is_test/mean"] for r in evaluated] == [1.0]


def test_trls_script_inputs_that_cannot_train_are_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """Found by the break sweep, each after the model loaded and sampled, or as a traceback: TRL's accuracy_reward
    without math_verify (an ImportError at the first scoring), think_format_reward over text prompts ("string indices
    must be integers"), a dotted path with an empty part ("Empty module name"), a model folder as --dataset_name
    (DatasetGenerationError), and a test split whose rows lack a prompt, streamed too (named without its split, or
    after the model loaded). The model path does not exist: each is refused before it is looked at."""
    from trl.import_utils import is_math_verify_available

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps({"prompt": f"Count to {i}.", "solution": str(i)}) + "\n" for i in range(4)))
    (tmp_path / "data" / "test.jsonl").write_text(json.dumps({"solution": "1"}) + "\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_text("")
    monkeypatch.chdir(tmp_path)
    flags = ["train", "--model_name_or_path", "./no-such-model", "--output_dir", "out"]

    def refused(*argv):
        assert main([*flags, *argv]) == 2
        return capsys.readouterr().err

    err = refused("--dataset_name", "data", "--reward_funcs", "accuracy_reward")
    assert ("accuracy_reward checks answers with math_verify, which is not installed" in err) != is_math_verify_available()
    assert "'./rm' is not a dotted import path" in refused("--dataset_name", "data", "--reward_funcs", "./rm")
    assert "'rewards.' is not a dotted import path" in refused("--dataset_name", "data", "--reward_funcs", "rewards.")
    for stream in ("false", "true"):
        err = refused("--dataset_name", "data", "--reward_funcs", "think_format_reward", "--dataset_streaming", stream, "--max_steps", "1")
        assert "think_format_reward reads chat completions" in err and "(train split) has text prompts ('Count to 0.')" in err
        err = refused("--dataset_name", "data", "--reward", "length", "--eval_strategy", "steps", "--dataset_streaming", stream, "--max_steps", "1")
        assert "data (test split) row 0 has no prompt (None)" in err
    assert "dataset folder 'model' holds a model (config.json and weights), not a dataset" in refused("--dataset_name", "model", "--reward", "length")
    assert not os.path.exists(tmp_path / "out")


def test_the_overlap_on_the_builtin_job_names_the_flag_that_turns_its_dynamic_sampling_off(tmp_path, capsys):
    # The README's `--max_staleness 2` added to the built-in job (filter_groups on) said "set one of them", naming no
    # value and no flag. Refused when the config is built, before any model loads or server is asked.
    out = str(tmp_path / "out")
    assert main(["train", "--use_vllm", "true", "--vllm_mode", "server", "--max_staleness", "2", "--output_dir", out]) == 2
    err = capsys.readouterr().err
    assert "max_staleness=2 with filter_groups=True" in err and "set filter_groups=False to overlap (`--filter_groups false`" in err
    assert "or max_staleness=None to keep dynamic sampling" in err and not os.path.exists(out)


def test_lora_options_parse_into_lora_config_arguments(monkeypatch):
    _, fields, lora = parse("--use_peft", "--lora_r", "8", "--lora_target_modules", "q_proj", "v_proj", "--reward", "length", "--model", "m")
    assert lora == {"use_peft": True, "lora_r": 8, "lora_target_modules": ["q_proj", "v_proj"]} and "lora_r" not in fields
    seen = {}
    monkeypatch.setattr("fastgrpo.model.loading.lora_config", lambda **kw: seen.update(kw) or "cfg", raising=False)
    assert cli.peft_kwargs(lora) == {"peft_config": "cfg"}
    assert seen == {"lora_r": 8, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": ["q_proj", "v_proj"], "lora_task_type": "CAUSAL_LM",
                    "lora_target_parameters": None, "lora_modules_to_save": None, "use_rslora": False, "use_dora": False}  # TRL's defaults
    assert cli.peft_kwargs({}) == {}


def test_help_imports_neither_torch_nor_transformers():
    # `fastgrpo --help` must answer at once: the property is what it imports, not a time on this machine.
    code = (
        "import sys\nfrom fastgrpo.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "train" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "LOADED []"


def test_example_yaml_runs_with_reward_from_the_current_folder(tmp_path, monkeypatch, tokenizer, make_model):
    # The example file as shipped, with flags swapping in the tiny model and a 1-step run;
    # the reward module lives in the current folder (no PYTHONPATH).
    model_dir = tmp_path / "tiny"
    make_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (tmp_path / "myrewards.py").write_text("def short(completions, **kwargs):\n    return [-float(len(str(c))) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    example = yaml.safe_load(open(EXAMPLE))
    assert {"model", "dataset", "reward", "num_iterations"} <= set(example)
    code = main([
        "train", "--config", EXAMPLE, "--model", str(model_dir), "--reward", "brevity,myrewards:short", "--dataset_size", "8",
        "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "4", "--steps_per_generation", "1",
        "--max_completion_length", "4", "--num_iterations", "2", "--output_dir", "out", "--disable_tqdm", "true",
    ])
    assert code == 0
    records = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2]  # logging_first_step from the YAML, then the end
    assert "rewards/short/mean" in records[0] and "rewards/brevity_reward/std" in records[0]


def test_environment_and_tools_flags_run_the_calculator_task(tmp_path, monkeypatch, tokenizer, make_model):
    """`--environment calculator --tools module:function` (TRL's environment_factory / tools) from the command line."""
    model_dir = tmp_path / "tiny"
    make_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (tmp_path / "mytools.py").write_text(
        'def add(a: int, b: int) -> int:\n    """Add two integers.\n\n    Args:\n        a: first.\n        b: second.\n    """\n    return a + b\n'
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    code = main([
        "train", "--model", str(model_dir), "--dataset", "calculator", "--environment", "calculator", "--tools", "mytools:add",
        "--reward", "fastgrpo.tasks.calculator:answer_correct", "--dataset_size", "4", "--max_steps", "1",
        "--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "8", "--max_prompt_length", "400",
        "--output_dir", "out", "--disable_tqdm", "true", "--logging_steps", "1",
    ])
    assert code == 0
    record = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")][-1]
    assert {"rewards/answer_correct/mean", "rewards/Calculator/mean", "tools/call_frequency", "tools/failure_frequency"} <= set(record)
    assert main(["train", "--model", str(model_dir), "--dataset", "calculator", "--environment", "nomodule:Env"]) == 2


# ------------------------------------------------------------------ fastgrpo vllm-serve: bad arguments before vLLM starts
SERVE_ERRORS = [  # (arguments after --model, the one line on stderr); the model folder is {good}, one without config.json {bad}
    (["--port", "99999"], "fastgrpo: error: --port 99999: give a port from 1 to 65535 (the trainer's vllm_server_port; default 8000)."),
    (["--gpu_memory_utilization", "5"], "fastgrpo: error: --gpu_memory_utilization 5.0: give the share of GPU memory (CPU: of RAM) the "
                                        "engine may use, above 0 and at most 1 (default 0.9 on CUDA, 0.3 on CPU)."),
    (["--tensor_parallel_size", "0"], "fastgrpo: error: --tensor_parallel_size 0: give 1 or more."),
    (["--max-model-len", "-1"], "fastgrpo: error: --max_model_len -1: give 1 or more."),
    (["--log_level", "loud"], "fastgrpo: error: --log_level 'loud': give one of critical, error, warning, info, debug, trace."),
    (["--dtype", "bogus"], "fastgrpo: error: --dtype 'bogus': vLLM takes one of auto, half, float16, bfloat16, float, float32."),
    (["--prot", "8001"], "fastgrpo: error: unknown flag --prot: neither vllm-serve nor vLLM has it; did you mean --port? "
                         "(`fastgrpo vllm-serve --help` lists vllm-serve's; vLLM's pass through to `vllm serve`)."),
    (["--max-num-seq", "8"], "fastgrpo: error: unknown flag --max-num-seq: neither vllm-serve nor vLLM has it; did you mean "
                             "--max-num-seqs? (`fastgrpo vllm-serve --help` lists vllm-serve's; vLLM's pass through to `vllm serve`)."),
    (["--port", "abc"], "fastgrpo vllm-serve: error: argument --port: invalid int value: 'abc' (`fastgrpo vllm-serve --help` lists the flags)"),
    # found by the session-29 sweep: vLLM started, then failed ≈ 20 s later with a traceback
    (["--max_model_len", "100000"], "fastgrpo: error: --max_model_len 100000: the model's context is 512 tokens (config.json "
                                    "max_position_embeddings); give 512 or less, or leave it out for the model's own."),
    (["--host", "999.1.1.1"], "fastgrpo: error: --host '999.1.1.1': it does not resolve to an address ({resolver}); "
                              "give one this machine listens on: 0.0.0.0 (every interface, the default) or 127.0.0.1 (this machine only)."),
    (["--host", "127.0.0.1", "--port", "{busy}"], "fastgrpo: error: --host 127.0.0.1 --port {busy}: the server cannot listen there "
                                                  "(Address already in use); another process listens there (a server already running?): "
                                                  "stop it, or give another --port."),
]


def test_vllm_serve_refuses_bad_arguments_in_one_line_before_vllm_or_torch_loads(tmp_path):
    # Each took vLLM ≈ 12 s to refuse, with a 14-300 line usage dump or traceback; now one line each, in one process
    # that never imports torch or vLLM.
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(), bad.mkdir()
    (good / "config.json").write_text('{"max_position_embeddings": 512}')
    (good / "model.safetensors").write_text("")
    (bad / "model.safetensors").write_text("")
    listener = socket.create_server(("127.0.0.1", 0))  # a port another process listens on
    busy = str(listener.getsockname()[1])
    runs = [["--model", str(good), *[a.replace("{busy}", busy) for a in argv]] for argv, _ in SERVE_ERRORS] + [["--model", str(bad)], ["--port", "8000"]]
    code = (
        "import json, sys\nfrom fastgrpo.cli import main\nfor argv in json.loads(sys.argv[1]):\n"
        "    try:\n        code = main(['vllm-serve', *argv])\n    except SystemExit as stop:\n        code = stop.code\n"
        "    print('EXIT', code, file=sys.stderr, flush=True)\n"
        "print('LOADED', sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    with listener:
        out = subprocess.run([sys.executable, "-c", code, json.dumps(runs)], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "LOADED []", out.stderr
    replies = out.stderr.split("EXIT 2\n")
    assert replies[-1] == "" and len(replies) == len(runs) + 1, out.stderr
    try:  # the resolver's own words for a name it cannot resolve (offline: no name server to ask, or none that knows it)
        socket.getaddrinfo("999.1.1.1", 8000)
    except socket.gaierror as err:
        resolver = err.strerror
    expected = [error.replace("{busy}", busy).replace("{resolver}", resolver) for _, error in SERVE_ERRORS] + [
        f"fastgrpo: error: model folder '{bad}' has no config.json; give the folder save_pretrained wrote (config.json and the weights), "
        "a .gguf file or a hub id.",
        "fastgrpo vllm-serve: error: the following arguments are required: --model (`fastgrpo vllm-serve --help` lists the flags)"]
    assert [reply.rstrip("\n") for reply in replies[:-1]] == expected


def test_vllm_serve_passes_vllms_own_flags_through():
    # Arguments vllm-serve does not know go to `vllm serve`: every form vLLM's parser takes passes the check.
    import importlib.util

    from fastgrpo.generation.vllm.serve import ServeArguments, check_vllm_flags

    root = list(importlib.util.find_spec("vllm").submodule_search_locations)[0]
    check_vllm_flags(ServeArguments(model="m"), ["--max-num-seqs", "8", "--max_num_batched_tokens=512", "--no-enable-log-requests",
                                                 "--hf-overrides.rope_theta", "1e6", "-O3", "-tp", "1", "--seed", "-1"], root)
    with pytest.raises(ValueError, match=r"^unknown flag --enable-prefix-cache: .*; did you mean --enable-prefix-caching\?"):
        check_vllm_flags(ServeArguments(model="m"), ["--enable-prefix-cache"], root)
    # a vLLM whose source is laid out otherwise (another version): its flags are left to vLLM, never refused here
    check_vllm_flags(ServeArguments(model="m"), ["--a-flag-of-a-newer-vllm", "1"], str(os.path.dirname(root)))
