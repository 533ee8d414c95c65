"""GRPOConfig: every invalid combination is refused up front with one sentence
naming the fix, and the batch arithmetic matches docs/design.md's "Batch semantics".

Run: python -m pytest tests/test_config.py -q
"""

import re

import warnings

import pytest

from fastgrpo.config import GRPOConfig
from fastgrpo.config.checks import LOSS_TYPES


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    # world_size is read from the launcher's WORLD_SIZE; tests choose it explicitly.
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def refused(match, **kwargs) -> str:
    """Assert GRPOConfig(**kwargs) raises a one-sentence ValueError matching `match`."""
    with pytest.raises(ValueError, match=match) as info:
        GRPOConfig(**kwargs)
    message = str(info.value)
    assert message.endswith("."), message
    assert not re.search(r"[.;?!] [A-Z]", message), f"more than one sentence: {message}"
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------
# batch arithmetic
# ---------------------------------------------------------------------------


def test_trl_seed_config_arithmetic(tmp_path):
    # The TRL quick-start script's config, unchanged but for the import.
    cfg = GRPOConfig(
        output_dir=str(tmp_path), logging_steps=5, gradient_accumulation_steps=4, per_device_train_batch_size=4,
        num_generations=8, max_prompt_length=64, max_completion_length=64, log_completions=True, max_steps=200,
        num_iterations=4,
    )
    # generation_batch_size default = one optimizer step = per_device 4 × GA 4 × world 1 = 16 completions
    assert cfg.world_size == 1
    assert cfg.generation_batch_size == 16
    # = 16/8 = 2 prompts per rollout, 16/4 = 4 micro-batches per rollout
    assert cfg.prompts_per_rollout == 2
    assert cfg.steps_per_generation == 4
    # steps_per_rollout = μ × steps_per_generation / GA = 4 × 4 / 4 = 4 optimizer steps,
    # so max_steps = 200 takes 50 rollouts.
    assert cfg.steps_per_rollout == 4
    assert cfg.max_steps // cfg.steps_per_rollout == 50
    # TRL defaults that the seed relies on
    assert cfg.loss_type == "dapo" and cfg.epsilon == 0.2 and cfg.epsilon_high == 0.2 and cfg.beta == 0.0


def test_generation_batch_size_default_counts_all_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=4, num_generations=8)
    # 4 × 4 × 2 processes = 32 completions; steps_per_generation counts micro-batches per process: 32/(4·2) = 4
    assert (cfg.world_size, cfg.generation_batch_size, cfg.steps_per_generation) == (2, 32, 4)
    assert cfg.steps_per_rollout == 1


def test_steps_per_generation_sets_the_rollout():
    cfg = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4, num_generations=8, num_iterations=3)
    # 4 micro-batches of 4 = 16 completions = 2 optimizer steps of GA 2; × μ = 3 → 6 steps per rollout
    assert (cfg.generation_batch_size, cfg.steps_per_generation, cfg.steps_per_rollout) == (16, 4, 6)


def test_explicit_generation_batch_size():
    cfg = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, generation_batch_size=32, num_generations=8, world_size=2)
    # 32/(4 × 2) = 4 micro-batches per process = 2 optimizer steps; μ = 1
    assert (cfg.steps_per_generation, cfg.steps_per_rollout, cfg.prompts_per_rollout) == (4, 2, 4)


def test_defaults_resolved():
    cfg = GRPOConfig()
    assert cfg.epsilon_high == cfg.epsilon  # None → ε
    assert GRPOConfig(loss_type="cispo").epsilon_high == 5.0  # CISPO's default truncation
    assert GRPOConfig(epsilon_high=0.28).epsilon_high == 0.28
    assert GRPOConfig(scale_rewards=True).scale_rewards == "group"  # TRL's older spelling
    assert GRPOConfig(scale_rewards=False).scale_rewards == "none"
    assert GRPOConfig(report_to="none").report_to == []
    assert GRPOConfig(report_to=["none"]).report_to == []  # transformers' rule; `--report_to none` gives this list
    assert GRPOConfig(report_to="wandb").report_to == ["wandb"]


def test_every_tracker_transformers_takes_is_accepted():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    # installed or not: GRPOConfig checks the name (as TrainingArguments takes any); the trainer checks it can run (run/trackers.py)
    for name in ["mlflow", "comet_ml", "swanlab", "clearml", "dvclive", "neptune", "azure_ml", "codecarbon", "dagshub", "flyte"]:
        assert name in INTEGRATION_TO_CALLBACK and GRPOConfig(report_to=name).report_to == [name]
    assert GRPOConfig(report_to=list(INTEGRATION_TO_CALLBACK)).report_to == list(INTEGRATION_TO_CALLBACK)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_accepted(loss_type):
    assert GRPOConfig(loss_type=loss_type).loss_type == loss_type


# ---------------------------------------------------------------------------
# refused combinations
# ---------------------------------------------------------------------------


def test_epsilon_high_below_epsilon():
    msg = refused("epsilon_high=0.1 is below epsilon=0.2", epsilon=0.2, epsilon_high=0.1)
    assert "epsilon_high ≥ epsilon" in msg
    GRPOConfig(epsilon=0.2, epsilon_high=0.2)  # equal is fine
    # CISPO has no lower clip, so its epsilon_high (the weight cap) is not tied to epsilon
    GRPOConfig(loss_type="cispo", epsilon=0.2, epsilon_high=0.1)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo", "luspo", "cispo", "sapo", "vespo"])
def test_sequence_level_with_clipped_objective_accepted(loss_type):
    GRPOConfig(loss_type=loss_type, importance_sampling_level="sequence")


def test_luspo_at_token_level_warns_like_trl():
    # TRL 1.16 warns (and runs): LUSPO is GSPO's sequence-level loss scaled by length.
    with pytest.warns(UserWarning, match="importance_sampling_level='sequence' to mirror the paper"):
        GRPOConfig(loss_type="luspo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOConfig(loss_type="luspo", importance_sampling_level="sequence")


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"vespo_k_pos": -1.0}, r"vespo_k_pos=-1.0: VESPO's kernel .* needs k, λ ≥ 0"),
        ({"vespo_lambda_neg": -0.5}, r"vespo_lambda_neg=-0.5: VESPO's kernel"),
        ({"entropy_coef_min": 0.5, "entropy_coef_max": 0.1}, r"entropy_coef_min=0.5 exceeds entropy_coef_max=0.1"),
        ({"entropy_coef_delta": -0.01}, r"entropy_coef_delta=-0.01: use a step ≥ 0"),
        ({"entropy_target": -1.0}, r"entropy_target=-1.0: entropies are ≥ 0 nats"),
    ],
)
def test_vespo_and_entropy_fields_refused(fields, match):
    refused(match, **fields)


def test_unknown_importance_sampling_level():
    refused("use 'token' or 'sequence'", importance_sampling_level="seq")


@pytest.mark.parametrize("delta", [1.1, 1.28])
def test_delta_inside_trust_region(delta):
    # must exceed 1 + epsilon_high = 1.28, or the two-sided bound clips inside the region
    msg = refused(rf"delta={delta} must exceed 1 \+ epsilon_high = 1.28", epsilon_high=0.28, delta=delta)
    assert "use e.g. 2.08, or None" in msg
    GRPOConfig(epsilon_high=0.28, delta=1.29)


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_delta_with_a_loss_without_a_clipped_ratio(loss_type):
    # cispo's epsilon_high is 5: the trust-region bound, checked first, said "use e.g. 6.8", which this then refused
    refused(rf"delta=2.0 bounds the PPO-clipped ratio; loss_type='{loss_type}' has no such ratio, so set delta=None", loss_type=loss_type, delta=2.0)


@pytest.mark.parametrize("g", [1, 0])
def test_group_of_fewer_than_two(g):
    refused(rf"num_generations={g}: .* use 2 or more", num_generations=g)


def test_rollout_not_whole_groups_suggests_a_value_that_works():
    # 12 completions = 3 micro-batches of 4 = 3 steps of GA 1, but not whole groups of 8;
    # lcm(8, 4·1·1) = 8 fixes it.
    msg = refused(r"generation_batch_size=12 \(per_device_train_batch_size=4 × steps_per_generation=3 × 1 process\(es\)\) does not split "
                  r"into whole groups of num_generations=8", per_device_train_batch_size=4, generation_batch_size=12, num_generations=8)
    # item 13: the values of G that would split the 12 completions: its divisors ≥ 2; per device: 8 / gcd(8, 3) = 8
    assert msg.endswith("use a generation_batch_size that is a multiple of 8, or num_generations in {2, 3, 4, 6, 12} (or, leaving "
                        "generation_batch_size unset, a per_device_train_batch_size that is a multiple of 8).")
    # a user who set only per_device_train_batch_size=6 with G = 4 (a new user's case): 4 / gcd(4, 1) = 4 names the field set
    msg = refused(r"per_device_train_batch_size=6 × steps_per_generation=1", per_device_train_batch_size=6, num_generations=4)
    assert msg.endswith("or num_generations in {2, 3, 6} (or, leaving generation_batch_size unset, a per_device_train_batch_size that is a multiple of 4).")
    assert GRPOConfig(per_device_train_batch_size=4, num_generations=4).generation_batch_size == 4  # the number works
    # G = 3 with micro-batches of 4 and GA 2: the fix must be whole groups AND whole
    # optimizer steps: lcm(3, 4·2) = 24 (lcm(3, 4) = 12 would make 3 micro-batches,
    # not whole steps of GA 2).
    msg = refused(r"does not split into whole groups", per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=3)
    suggested = int(re.search(r"multiple of (\d+)[.,]", msg).group(1))
    assert suggested == 24
    cfg = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=3, generation_batch_size=suggested)
    assert cfg.steps_per_rollout == 3


def test_groups_split_per_process():
    # 16 completions over 4 processes = 4 each: not a group of 8 on each process
    refused(r"× 4 process\(es\)\) does not split into whole groups of num_generations=8 on each process; use a generation_batch_size that is "
            r"a multiple of 32, .* a per_device_train_batch_size that is a multiple of 4\)", per_device_train_batch_size=2, gradient_accumulation_steps=2,
            num_generations=8, world_size=4)


def test_rollout_not_whole_micro_batches():
    refused(r"generation_batch_size=10 is not a whole number of micro-batches .* use a multiple of 4", per_device_train_batch_size=4, generation_batch_size=10, num_generations=2)


def test_rollout_not_whole_optimizer_steps():
    # 8 completions = 2 micro-batches of 4, but an optimizer step needs GA = 4 of them (16 completions)
    refused(
        r"makes 2 micro-batches per process, not a whole number of optimizer steps of gradient_accumulation_steps=4; "
        r"use a generation_batch_size that is a multiple of 16",
        per_device_train_batch_size=4, gradient_accumulation_steps=4, generation_batch_size=8, num_generations=8,
    )
    # on 2 processes one optimizer step is 4 × 4 × 2 = 32 completions
    refused(r"use a generation_batch_size that is a multiple of 32", per_device_train_batch_size=4, gradient_accumulation_steps=4, generation_batch_size=16, num_generations=8, world_size=2)
    # set through steps_per_generation: the fix names that field (setting generation_batch_size too would be refused)
    refused(r"use a steps_per_generation that is a multiple of 4", per_device_train_batch_size=4, gradient_accumulation_steps=4, steps_per_generation=6, num_generations=8)


def test_generation_batch_size_and_steps_per_generation_both_set():
    refused(r"generation_batch_size=16 and steps_per_generation=4 are both set; set only one of them", generation_batch_size=16, steps_per_generation=4)


@pytest.mark.parametrize(
    "name", ["per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size", "num_iterations"]
)
def test_zero_counts_refused_not_divided_by(name):
    # a ValueError naming the field, not a ZeroDivisionError, and steps_per_generation=0
    # is not silently read as "unset"
    refused(rf"{name}=0: use 1 or more", **{name: 0})


def test_unknown_loss_type():
    msg = refused(r"loss_type='ppo' is unknown", loss_type="ppo")
    assert msg.endswith("use one of grpo, bnpo, dapo, dr_grpo, cispo, sapo, luspo, vespo.")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(scale_rewards="std"), "use one of group, batch, none"),
        (dict(kl_estimator="k2"), "use one of k3, full"),
        (dict(beta=-0.1), "use 0"),
        (dict(sync_ref_model=True), "set beta > 0 or sync_ref_model=False"),
        (dict(top_entropy_quantile=0.0), r"use a value in \(0, 1\]"),
        (dict(temperature=0.0), "positive temperature"),
        (dict(epsilon=1.0), r"use a value in \[0, 1\)"),
        (dict(max_steps=0), "use a positive number"),
        (dict(target_kl=0.0), "use a positive value or None"),
        (dict(multi_objective_aggregation="mean"), "'sum_then_normalize' or 'normalize_then_sum'"),
        (dict(report_to="mlfow"), "report_to='mlfow': use 'none', 'all' or one of azure_ml, comet_ml, mlflow, .*, trackio, wandb, .*swanlab.* "
                                  r"\(transformers' trackers\)"),
        (dict(report_to=["all", "wandb"]), r"report_to=\['all', 'wandb'\]: 'all' means every installed tracker; give it alone"),
        (dict(report_to=["none", "wandb"]), r"report_to=\['none', 'wandb'\]: 'none' means no tracker; give it alone, or list the trackers without it"),
        # break sweep: transformers' Trainer raised the same (when built) with no fix named; a tracker named twice logged every
        # number twice at each step (Trainer adds one callback per mention, with a warning)
        (dict(report_to="MLflow"), r"report_to='MLflow': did you mean 'mlflow' \(lower case, no spaces\)\? use 'none', 'all'"),
        (dict(report_to=" none"), r"report_to=' none': did you mean 'none'"),
        (dict(report_to="wandb,mlflow"), r"report_to='wandb,mlflow': several trackers are a list \(YAML `report_to: \[wandb, mlflow\]`"),
        (dict(report_to=["mlflow", "wandb", "mlflow"]), r"report_to=\['mlflow', 'wandb', 'mlflow'\] names a tracker twice, so its callback "
                                                        r"would log every number twice at each step .*; name each once\.$"),
        (dict(generation_kwargs='{"top_k": 5, "top_k": 50}'), r"^generation_kwargs: the JSON gives 'top_k' twice \(only the last value "
                                                              r"would be kept\); give each key once\.$"),  # json.loads kept 50 silently
        (dict(use_vllm=True, generation_kwargs='{"logit_bias": {"5": 100, "5": -100}}'), r"^generation_kwargs: the JSON gives '5' twice"),
        (dict(seed=-1), r"seed=-1: use a value in \[0, 2\*\*32\)"),  # numpy's own error named no field
        (dict(save_steps=1.5), "save_steps=1.5: above 1 it counts steps; use a whole number"),  # transformers' rule
        (dict(eval_steps=2.5), "eval_steps=2.5: above 1 it counts steps"),
        (dict(generation_kwargs={"temperature": "hot"}), "generation_kwargs: temperature='hot' has type str; give one of type float"),
        (dict(generation_kwargs={"top_p": None}), "generation_kwargs: top_p=None has type NoneType"),
    ],
)
def test_other_bad_values(kwargs, match):
    refused(match, **kwargs)


def test_unknown_field_suggests_the_closest():
    with pytest.raises(TypeError, match=r"no field 'num_generation'; did you mean 'num_generations'\?"):
        GRPOConfig(num_generation=8)
    with pytest.raises(TypeError, match=r"did you mean 'epsilon_high'\?"):
        GRPOConfig(epsilon_hi=0.28)
    # a name in neither fastgrpo nor TRL still names itself
    with pytest.raises(TypeError, match=r"no field 'zzz_unknown'"):
        GRPOConfig(zzz_unknown=1)


@pytest.mark.parametrize("kwargs,match", [
    # each would only fail in the first backward, after a rollout was spent (and a replaced run was removed)
    ({"determinism_check": "x"}, "determinism_check='x': use 'default' or 'none'"),
    ({"context_fn": "x"}, "context_fn='x': give a function"),
    ({"debug": "false"}, "debug='false': use true or false"),  # torch would read the string as True
    ({"preserve_rng_state": 0}, "preserve_rng_state=0: use true or false"),
    ({"use_reentrant": True, "debug": True}, "use_reentrant=True with context_fn or debug: torch takes those only non-reentrant"),
    ({"debug": True, "context_fn": print}, "debug=True with a context_fn: torch refuses the pair"),
    ({"use_reentrat": False}, "has 'use_reentrat', which torch.utils.checkpoint does not take"),
])
@pytest.mark.parametrize("checkpointing", [True, False])  # a value set is a value meant, whether or not it is used now
def test_checkpointing_kwargs_are_checked_when_the_config_is_built(kwargs, match, checkpointing):
    refused(match, gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs=kwargs)
    refused(match, activation_checkpointing_kwargs=kwargs)  # transformers 5.25's name


def test_checkpointing_kwargs_torch_takes_are_kept():
    kwargs = {"use_reentrant": False, "determinism_check": "none", "debug": True, "preserve_rng_state": False, "early_stop": False}
    assert GRPOConfig(gradient_checkpointing=True, gradient_checkpointing_kwargs=kwargs).gradient_checkpointing_kwargs == kwargs


# A field only one feature reads, set while that feature is off: (field and value, the state the warning names,
# the settings that turn the feature on). TRL accepts each silently; here each warns and still runs.
SERVER = {"use_vllm": True, "vllm_mode": "server"}
INERT = [
    ({"vllm_mode": "server"}, "use_vllm=False (generation_backend='fastgrpo')", {"use_vllm": True}),
    ({"vllm_server_port": 8001}, "use_vllm=False", SERVER),
    ({"vllm_gpu_memory_utilization": 0.5}, "use_vllm=False", {"use_vllm": True}),
    ({"vllm_server_base_url": "http://host:9000", "use_vllm": True}, "vllm_mode='colocate'", {"vllm_mode": "server"}),
    ({"vllm_max_model_length": 1024, "use_vllm": True, "vllm_mode": "server"}, "vllm_mode='server'", {"vllm_mode": "colocate"}),
    ({"vllm_server_port": 8001, "vllm_server_base_url": "http://127.0.0.1:8000", **SERVER}, "vllm_server_base_url='http://127.0.0.1:8000' "
     "is set (it wins, as in TRL", {"vllm_server_base_url": None}),
    ({"max_num_gen_batches": 3}, "filter_groups=False", {"filter_groups": True}),
    ({"filter_groups_metric": "accuracy"}, "filter_groups=False", {"filter_groups": True}),
    ({"queue_maxsize": 4096}, "max_staleness=None", {**SERVER, "max_staleness": 2}),
    ({"kl_estimator": "full"}, "beta=0", {"beta": 0.04}),
    ({"ref_model_sync_steps": 64, "beta": 0.04}, "sync_ref_model=False", {"sync_ref_model": True}),
    ({"sapo_temperature_neg": 2.0}, "loss_type='dapo'", {"loss_type": "sapo"}),
    ({"vespo_k_pos": 1.0}, "loss_type='dapo'", {"loss_type": "vespo"}),
    ({"entropy_target": 1.5}, "use_adaptive_entropy=False", {"use_adaptive_entropy": True}),
    ({"vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_correction": False},
     "vllm_importance_sampling_correction=False", {"vllm_importance_sampling_correction": True}),
    ({"num_completions_to_print": 8}, "log_completions=False", {"log_completions": True}),
    ({"log_unique_prompts": True}, "log_completions=False", {"log_completions": True, "report_to": "wandb"}),
    ({"log_unique_prompts": True, "log_completions": True}, "report_to=[] (the completions table is sent to W&B and Trackio only)",
     {"report_to": "trackio"}),
    ({"warmup_ratio": 0.1, "warmup_steps": 5}, "warmup_steps=5", {"warmup_steps": 0}),
    ({"save_steps": 50, "save_strategy": "epoch"}, "save_strategy='epoch'", {"save_strategy": "steps"}),
    ({"eval_steps": 10}, "eval_strategy='no'", {"eval_strategy": "steps"}),
    ({"greater_is_better": False}, "metric_for_best_model=None", {"metric_for_best_model": "eval_reward"}),
]


def caught_warnings(**kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOConfig(**kwargs)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("fields,state,turn_on", INERT, ids=[next(iter(f)) for f, _, _ in INERT])
def test_a_field_its_feature_does_not_read_warns_and_runs(fields, state, turn_on):
    name, value = next(iter(fields.items()))
    messages = [m for m in caught_warnings(**fields) if "no effect" in m]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{name}={value!r} has no effect while {state}"), messages[0]
    assert messages[0].endswith(", or drop it."), messages[0]
    assert not [m for m in caught_warnings(**{**fields, **turn_on}) if "no effect" in m]  # the feature on reads it


def test_every_inert_field_of_a_feature_is_named_in_one_warning():
    (message,) = [m for m in caught_warnings(vllm_mode="server", vllm_server_port=8001, vllm_server_timeout=30.0) if "no effect" in m]
    assert message.startswith("vllm_mode='server', vllm_server_port=8001, vllm_server_timeout=30.0 have no effect while use_vllm=False")
    assert message.endswith("set use_vllm=True to sample with vLLM, or drop them.")


def test_defaults_and_their_own_values_do_not_warn():
    assert not caught_warnings()
    assert not caught_warnings(vllm_server_port=8000, max_num_gen_batches=10, kl_estimator="k3")  # each its default


def test_tf32_is_trainingarguments_refused_without_an_ampere_gpu():
    # TrainingArguments turns TF32 on or off on an Ampere GPU and refuses True elsewhere; it was refused here everywhere.
    from transformers.utils import is_torch_tf32_available

    assert GRPOConfig(output_dir="o", tf32=False).tf32 is False
    if is_torch_tf32_available():
        assert GRPOConfig(output_dir="o", tf32=True).tf32 is True
    else:
        with pytest.raises(ValueError, match=r"tf32=True: TF32 matmuls need an NVIDIA GPU of the Ampere generation or newer"):
            GRPOConfig(output_dir="o", tf32=True)
