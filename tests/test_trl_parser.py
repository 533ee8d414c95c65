"""GRPOConfig through transformers' HfArgumentParser and TRL's TrlParser, as TRL's scripts parse TRL's GRPOConfig;
its TrainingArguments methods against TRL's in a single-process CPU run. TRL is the oracle (trl/scripts/grpo.py
parses `(GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)` with TrlParser)."""

import json
import logging

import pytest
import trl
from transformers import HfArgumentParser

from fastgrpo import GRPOConfig
from fastgrpo.config.trl_fields import TRL_FIELDS

# README "Differences from TRL": fastgrpo's own defaults (and disable_tqdm, whose None TRL resolves per log level).
OWN_DEFAULTS = {"disable_dropout", "gradient_checkpointing", "num_completions_to_print", "output_dir", "disable_tqdm"}


def parse(*args, dataclass_types=(GRPOConfig,)):
    return HfArgumentParser(dataclass_types).parse_args_into_dataclasses(list(args))


def test_no_flags_give_every_default():
    (args,) = parse()
    assert args.to_dict() == GRPOConfig().to_dict()
    assert args.report_to == [] and args.debug == [] and args.run_name is None
    (args,) = trl.TrlParser((GRPOConfig,)).parse_args_and_config([])
    assert args.to_dict() == GRPOConfig().to_dict()


def test_each_flag_left_out_holds_what_trls_holds():
    ours = vars(HfArgumentParser((GRPOConfig,)).parse_args([]))
    theirs = vars(HfArgumentParser((trl.GRPOConfig,)).parse_args([]))
    assert set(theirs) <= set(ours)  # every TRL field is a flag
    differ = {name for name in theirs if (ours[name], type(ours[name])) != (theirs[name], type(theirs[name]))}
    assert differ == OWN_DEFAULTS | {"debug"}
    assert (ours["debug"], theirs["debug"]) == ("", None)  # both mean no debug option: [] once built, as TRL's
    assert (ours["report_to"], ours["include_num_input_tokens_seen"]) == ("none", False)  # TRL's text and bool flags


def test_trls_training_arguments_flags_parse_and_read_back():
    flags = ("--run_name exp1 --push_to_hub false --do_eval --log_level info --hub_model_id x --resume_from_checkpoint path "
             "--logging_strategy steps --dataloader_num_workers 2 --remove_unused_columns false --fp16 false --use_liger_kernel "
             "--use_cpu true --report_to tensorboard")
    (args,) = parse(*flags.split())
    assert (args.run_name, args.push_to_hub, args.do_eval, args.log_level, args.hub_model_id) == ("exp1", False, True, "info", "x")
    assert (args.resume_from_checkpoint, args.logging_strategy, args.dataloader_num_workers) == ("path", "steps", 2)
    assert (args.remove_unused_columns, args.fp16, args.use_liger_kernel, args.use_cpu) == (False, False, True, True)
    assert args.report_to == ["tensorboard"]


@pytest.mark.parametrize("flags,message", [
    (("--push_to_hub", "true"), "push_to_hub=True is not supported by fastgrpo.*huggingface_hub"),
    (("--fp16", "true"), "fp16=True is not supported by fastgrpo.*bf16=True"),
    (("--torch_compile", "true"), "torch_compile=True is not supported by fastgrpo.*torch.compile"),
    (("--log_level", "loud"), "log_level='loud' is not supported by fastgrpo.*passive, detail, debug, info"),
])
def test_a_refused_value_from_a_flag_is_refused_as_from_python(flags, message):
    with pytest.raises(ValueError, match=message):
        parse(*flags)
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**{flags[0][2:]: {"true": True}.get(flags[1], flags[1])})


def test_a_trl_parser_config_file_sets_trls_other_fields(tmp_path):
    config = tmp_path / "grpo.yaml"
    config.write_text("run_name: exp1\nlog_level: info\ndo_eval: true\nhub_model_id: me/model\nnum_generations: 4\n")
    (args,) = trl.TrlParser((GRPOConfig,)).parse_args_and_config(["--config", str(config), "--per_device_train_batch_size", "4"])
    assert (args.run_name, args.log_level, args.do_eval, args.hub_model_id) == ("exp1", "info", True, "me/model")
    assert (args.num_generations, args.per_device_train_batch_size) == (4, 4)


def test_to_dict_keeps_trls_other_fields_as_trls_does(tmp_path):
    ours = GRPOConfig(use_cpu=True, run_name="exp1", hub_token="secret").to_dict()
    theirs = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, run_name="exp1", hub_token="secret").to_dict()
    assert set(theirs) <= set(ours)
    assert ours["run_name"] == "exp1" and ours["hub_token"] == theirs["hub_token"] == "<HUB_TOKEN>"  # never the token
    # TRL's __post_init__ resolves these fields fastgrpo does not read (an AcceleratorConfig, CPU data-loader settings);
    # bf16 and epsilon_high are resolved by each library its own way (README, "Precision").
    resolved_by_trl = {"accelerator_config", "dataloader_pin_memory", "pad_to_multiple_of", "bf16", "epsilon_high"}
    assert {k for k in theirs if ours[k] != theirs[k]} == (OWN_DEFAULTS - {"disable_tqdm"}) | resolved_by_trl
    assert json.loads(GRPOConfig(run_name="exp1").to_json_string())["run_name"] == "exp1"


def test_every_trl_field_is_a_keyword_only_dataclass_field():
    args = GRPOConfig("out")  # the first positional argument is output_dir, as TrainingArguments'
    assert args.output_dir == "out" and args.run_name is None
    assert set(TRL_FIELDS) <= set(args.to_dict())
    with pytest.raises(TypeError, match="did you mean 'run_name'"):
        GRPOConfig(run_nam="x")


def test_training_arguments_methods_match_trls_in_a_single_cpu_process(tmp_path):
    ours = GRPOConfig(use_cpu=True, per_device_train_batch_size=4, num_generations=4, per_device_eval_batch_size=2, log_level="info")
    theirs = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, num_generations=4,
                            per_device_eval_batch_size=2, log_level="info")
    for name in ("process_index", "local_process_index", "world_size", "device", "n_gpu", "train_batch_size", "eval_batch_size",
                 "should_log", "should_save", "parallel_mode"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert (ours.process_index, ours.world_size, str(ours.device), ours.n_gpu, ours.train_batch_size, ours.eval_batch_size) == (0, 1, "cpu", 0, 4, 2)
    assert ours.should_log and ours.should_save and ours.parallel_mode.value == "not_parallel"
    assert ours.get_process_log_level() == theirs.get_process_log_level() == logging.INFO
    passive = GRPOConfig(use_cpu=True).get_process_log_level()  # "passive": transformers' verbosity as it is now
    assert passive == trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True).get_process_log_level()
    ran = []
    with ours.main_process_first(desc="dataset map"):
        ran.append(1)
    with ours.main_process_first(local=False):
        ran.append(2)
    assert ran == [1, 2]
    sanitized = ours.to_sanitized_dict()
    assert (sanitized["train_batch_size"], sanitized["eval_batch_size"], sanitized["report_to"], sanitized["run_name"]) == (4, 2, "[]", "None")
    assert theirs.to_sanitized_dict()["report_to"] == "[]" and theirs.to_sanitized_dict()["run_name"] == "None"


def test_use_cpu_builds_a_cpu_accelerator_where_a_gpu_is(tmp_path, monkeypatch):
    from fastgrpo.run import setup

    asked, real = [], setup.Accelerator

    def accelerator(cpu, **kwargs):
        asked.append(cpu)
        return real(cpu=True, **kwargs)  # this machine has no GPU to build the other one on

    monkeypatch.setattr(setup, "cpu_only", lambda: False)  # as on a machine with a GPU
    monkeypatch.setattr(setup, "Accelerator", accelerator)
    acc, bf16 = setup.build_accelerator(GRPOConfig(output_dir=str(tmp_path), use_cpu=True))
    assert acc.device.type == "cpu" and bf16 is False  # bf16 decided for the CPU (conftest: one without bf16 units)
    setup.build_accelerator(GRPOConfig(output_dir=str(tmp_path)))
    assert asked == [True, False]


def test_use_cpu_with_vllm_where_a_gpu_is_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=r"use_cpu=True with vLLM \(server mode\) on a machine with a GPU.*use_cpu=False.*use_vllm=False"):
        GRPOConfig(use_vllm=True, vllm_mode="server", use_cpu=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert GRPOConfig(use_vllm=True, use_cpu=True).use_cpu  # without a GPU vLLM's CPU build samples where the policy trains


def test_to_json_string_writes_a_dtype_by_name_as_trl():
    """model_init_kwargs={"dtype": torch.bfloat16} (TRL's documented way to load in bf16): json.dumps raised on the dtype."""
    import torch

    text = GRPOConfig(model_init_kwargs={"dtype": torch.bfloat16}).to_json_string()
    assert json.loads(text)["model_init_kwargs"] == {"dtype": "bfloat16"}
