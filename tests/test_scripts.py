"""End to end on the real SmolLM2-135M-Instruct: TRL's seed script with only the import
changed, and the command line (few steps each; these are the slowest tests)."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from fastgrpo.cli import main, resolve_job, train_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_trl_seed_script_runs_with_only_the_import_changed(tmp_path):
    source = open(os.path.join(ROOT, "examples", "trl_seed_script.py")).read()
    assert "from fastgrpo import GRPOConfig, GRPOTrainer" in source
    script = tmp_path / "seed.py"
    short = {"max_steps=200": "max_steps=2", "logging_steps=5": "logging_steps=1", "max_completion_length=64": "max_completion_length=16"}
    for old, new in short.items():
        assert old in source, old
        source = source.replace(old, new)
    script.write_text(source)
    subprocess.run([sys.executable, str(script)], cwd=tmp_path, check=True, timeout=900)
    with open(tmp_path / "SmolLM2-135M-GRPO" / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["kl_old"] == 0 and records[1]["kl_old"] > 0  # μ = 4: step 2 reuses the rollout, against the moved policy
    assert os.path.exists(tmp_path / "SmolLM2-135M-GRPO" / "checkpoint-2" / "model.safetensors")


def test_cli_flags_override_yaml_which_overrides_the_builtin_job(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"num_iterations": 2, "learning_rate": 1e-5, "reward": "length,format", "model": "m"}))
    ns = train_parser().parse_args(["--config", str(run), "--num_iterations", "3", "--bf16", "false", "--top_k", "5"])
    job, fields, _ = resolve_job(ns)
    assert job["model"] == "m" and job["reward"] == ["length", "format"]
    assert job["dataset"].startswith("reasoning-gym:basic_arithmetic")  # the built-in job's
    assert fields["num_iterations"] == 3 and fields["learning_rate"] == 1e-5 and fields["bf16"] is False and fields["top_k"] == 5


def test_cli_refuses_bad_values_before_loading_anything(capsys):
    assert main(["train", "--num_generations", "1"]) == 2
    assert "num_generations=1" in capsys.readouterr().err
    assert main(["train", "--reward", "nope"]) == 2
    assert "reward 'nope' is unknown" in capsys.readouterr().err
    assert main(["train", "--model", "./no-such-model", "--dataset", "reasoning-gym:basic_arithmetic", "--dataset_size", "8", "--reward", "length"]) == 2
    assert "model './no-such-model' does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a misspelt flag is an error, never a prefix match
        main(["train", "--num_generation", "4"])


def test_cli_trains_on_a_local_file_with_a_builtin_reward(tmp_path, model_dir):
    # A local model folder too (the suite's tiny Llama): the built-in model's own runs are the seed script's above and `make train`.
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Write a word about {w}."}) + "\n" for w in ("cats", "dogs", "rain", "sun")))
    out = tmp_path / "out"
    code = subprocess.run(
        [sys.executable, "-m", "fastgrpo.cli", "train", "--model", model_dir, "--dataset", str(data), "--reward", "length", "--output_dir", str(out),
         "--max_steps", "2", "--num_generations", "4", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1",
         "--max_completion_length", "8", "--logging_steps", "1", "--save_steps", "2", "--disable_tqdm", "true"],
        cwd=tmp_path, timeout=600,
    ).returncode
    assert code == 0
    assert os.path.exists(out / "model.safetensors") and os.path.exists(out / "checkpoint-2")
    assert len(open(out / "metrics.jsonl").read().splitlines()) == 2


TRL_GRPO_SCRIPT = os.path.join(os.path.dirname(__import__("trl").__file__), "scripts", "grpo.py")
IMPORTS = {  # TRL's imports → fastgrpo's: the only change made to TRL's script
    "    from trl import GRPOTrainer, get_dataset, get_peft_config, get_quantization_config\n":
        "    from fastgrpo import GRPOTrainer\n    from trl import get_dataset, get_peft_config, get_quantization_config\n",
    "    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser\n":
        "    from fastgrpo import GRPOConfig\n    from trl import DatasetMixtureConfig, ModelConfig, TrlParser\n",
}


def test_trls_grpo_script_runs_with_only_its_imports_changed(tmp_path, tokenizer):
    from conftest import vllm_tiny_model

    source = open(TRL_GRPO_SCRIPT).read()
    for old, new in IMPORTS.items():
        assert old in source, old
        source = source.replace(old, new)
    (tmp_path / "grpo.py").write_text(source)
    model = vllm_tiny_model(tokenizer)  # 2 layers, 64 wide, SmolLM2's vocabulary
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Count to {i}."}]}) + "\n" for i in range(8)))
    (tmp_path / "rewards.py").write_text("def short(completions, **kwargs):\n    return [-len(c[0]['content']) / 8 for c in completions]\n")
    flags = ("--model_name_or_path model --dataset_name data --reward_funcs rewards.short --output_dir out --max_steps 2 "
             "--max_completion_length 8 --per_device_train_batch_size 4 --num_generations 4 --run_name x --use_cpu true")
    subprocess.run([sys.executable, "grpo.py", *flags.split()], cwd=tmp_path, check=True, timeout=600)
    with open(tmp_path / "out" / "metrics.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [2]  # logging_steps=10: the last step's line
    assert os.path.exists(tmp_path / "out" / "model.safetensors")  # trainer.save_model(output_dir)
