"""`GRPOConfig`: every knob of a fastgrpo run, its default and its validation.

Field names and defaults are TRL's (`trl.GRPOConfig`), so a TRL script runs with
only its import changed; the defaults that differ (disable_dropout,
gradient_checkpointing, num_completions_to_print, output_dir) are listed with
their reasons in the README's "Differences from TRL". Counts are completions,
not prompts (docs/design.md, "Batch semantics"). Every inconsistent combination is refused in
`__post_init__` (the rules: config/checks.py), with one sentence naming the value and the
fix, before any model is loaded.

The rest of TRL's fields (the `transformers.TrainingArguments` it inherits,
vLLM settings, variants fastgrpo lacks) are in trl_fields.py: a value that
matches what fastgrpo does is accepted, any other is refused with the fix. A
name in neither raises a `TypeError` naming the closest field.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import math
import os
import typing
import warnings
from dataclasses import dataclass, field

from .generation_kwargs import check as check_generation_kwargs
from .checks import DICT_FIELDS, check_types, validate, warn_like_trl
from .report_to import resolve as resolve_report_to
from .unread_fields import warn_inert
from .trl_fields import TRL_FIELDS, TrlFields, check_trl_field
from .training_args import TrainingArgumentsMethods



def _each_key_once(name: str, pairs: list) -> dict:
    """json.loads' object_pairs_hook for a dict field's JSON text: its dict, refusing a key given twice at any depth
    (`{"top_k": 5, "top_k": 50}`), whose first value json.loads, as TRL's HfArgumentParser, drops silently."""
    keys = [key for key, _ in pairs]
    if twice := [key for i, key in enumerate(keys) if key in keys[:i]]:
        raise ValueError(f"{name}: the JSON gives {twice[0]!r} twice (only the last value would be kept); give each key once.")
    return dict(pairs)


def names_unknown_fields(cls):
    """Class decorator over @dataclass: an unknown keyword raises a `TypeError` naming the closest field.

    The generated __init__ would say only "unexpected keyword argument"; the wrapper has to sit around it, so
    a decorator does that where each config class is declared (GRPOConfig, AsyncGRPOConfig).
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    dataclass_init = cls.__init__

    @functools.wraps(dataclass_init)
    def __init__(self, *args, **kwargs):
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            name = unknown[0]
            close = difflib.get_close_matches(name, sorted(fields), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise TypeError(
                f"{cls.__name__} has no field {name!r}; {hint}fastgrpo takes TRL's GRPOConfig fields (README, \"Configuration\")."
            )
        dataclass_init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


@names_unknown_fields
@dataclass
class GRPOConfig(TrainingArgumentsMethods, TrlFields):
    """Configuration of a GRPO run (TRL `GRPOConfig` names and defaults).

    Batch sizes count completions: a rollout holds `generation_batch_size`
    completions, i.e. `generation_batch_size / num_generations` prompts, split
    into micro-batches of `per_device_train_batch_size`; every
    `gradient_accumulation_steps` micro-batches make one optimizer step, and
    the rollout is passed over `num_iterations` (μ) times.

    TRL's other fields (trl_fields.py, the base class) are keyword-only fields checked here too; the
    TrainingArguments methods and properties scripts call are in training_args.py.

    Raises:
        TypeError: an unknown field (the message names the closest known one).
        ValueError: a value or combination that cannot work, with the fix.
    """

    # --- where and how long -------------------------------------------------
    output_dir: str | None = "grpo-output"  # like TRL (trainer_output), under the cwd; None: this default
    overwrite_output_dir: bool = False  # a new run in a folder holding another run's checkpoints/logs: False refuses, True removes them
    seed: int = 42
    data_seed: int | None = None  # seeds the prompt order; None: seed (transformers' meaning)
    full_determinism: bool = False  # Trainer's enable_full_determinism: torch's deterministic algorithms for the whole process
    max_steps: int = -1  # optimizer steps; -1: num_train_epochs over the dataset
    num_train_epochs: float = 3.0  # only read when max_steps == -1
    shuffle_dataset: bool = True

    # --- optimizer and schedule (TRL/transformers defaults) -------------------
    learning_rate: float = 1e-6  # TRL's default; small because RL gradients are noisy
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict | str | None = None  # extra arguments of the scheduler (transformers' get_scheduler)
    optim: str = "adamw_torch_fused"  # a transformers optimizer name (OptimizerNames); transformers' default from torch 2.8 (CPU kernel since 2.4)
    optim_args: str | None = None  # "key=value,…" for the optimizer (transformers' meaning)
    warmup_ratio: float = 0.0  # older scripts' spelling of a fractional warmup_steps
    warmup_steps: float = 0  # ≥ 1: optimizer steps; below 1: a fraction of them (TRL 1.16); wins when > 0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0

    # --- batch semantics (completions, not prompts) ---------------------------
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    num_generations: int = 8  # G: completions per prompt
    num_generations_eval: int | None = None  # completions per eval prompt (TRL's); None: num_generations
    generation_batch_size: int | None = None  # completions per rollout, all processes
    steps_per_generation: int | None = None  # micro-batches per rollout per process
    num_iterations: int = 1  # μ: passes over each rollout
    update_token_budget: int | None = None  # packed tokens per forward/backward: a step's micro-batches run merged while they fit; None: a full-length micro-batch's (four under gradient_checkpointing); 0: one pass each (update/step.py)

    # --- generation ------------------------------------------------------------
    max_prompt_length: int | None = None  # tokens; longer prompts lose their left part; None: no limit (TRL 1.16 has no such field and cuts nothing)
    max_completion_length: int = 512  # tokens
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float | None = None
    repetition_penalty: float = 1.0
    generation_kwargs: dict | str | None = None  # the engine's keys (TRL): sampling keys, stop strings and ids, penalties, masks (generation_kwargs.py); others refused
    chat_template_kwargs: dict | str | None = None  # passed to apply_chat_template, e.g. {"enable_thinking": False}
    generation_backend: str = "fastgrpo"  # "fastgrpo" (own sampler), "transformers" (generate) or "vllm" (use_vllm=True sets it)
    max_tool_calling_iterations: int | None = None  # rounds of tool calls per completion (agents); None: until max_completion_length ends them

    # --- vLLM as the generation engine (TRL's fields and defaults; generation/vllm/) --------
    use_vllm: bool = False  # sample with vLLM (generation_backend="vllm")
    vllm_mode: str = "colocate"  # "colocate": one engine per training process; "server": `fastgrpo vllm-serve` started by the user
    vllm_model_impl: str = "vllm"  # vLLM's model_impl: "vllm" or "transformers"
    vllm_enable_sleep_mode: bool = False  # colocate: the engine frees its memory while the policy trains (CUDA only)
    vllm_server_base_url: str | None = None  # server: e.g. "http://localhost:8000"; None: http://{host}:{port}
    vllm_server_host: str = "0.0.0.0"
    vllm_server_port: int = 8000
    vllm_server_timeout: float = 240.0  # seconds to wait for the server to answer at start-up, and for each request
    vllm_group_port: int = 51216  # server on CUDA: the NCCL weight-transfer group's port
    vllm_gpu_memory_utilization: float = 0.3  # colocate: the engine's share of GPU memory (of RAM on CPU: its KV cache)
    vllm_max_model_length: int | None = None  # colocate: the engine's context; None: max_prompt_length + max_completion_length
    vllm_tensor_parallel_size: int = 1  # colocate: 1 (a bigger engine runs in server mode)
    vllm_structured_outputs_regex: str | None = None  # completions match it (vLLM's grammar mask; config/structured_outputs.py)
    # --- generation overlapped with training (TRL's AsyncGRPOConfig fields; rollout/async_producer.py) ------
    max_staleness: int | None = None  # None: the synchronous loop; k ≥ 0: rollouts produced ahead, ≤ k weight versions old (AsyncGRPOConfig: 4)
    weight_sync_steps: int = 1  # optimizer steps between weight pushes to the engine (made when a rollout is taken)
    max_inflight_tasks: int = -1  # completions started and not yet trained, at most; -1: max(max_staleness, 1) rollouts (TRL's auto)
    queue_maxsize: int = 1024  # completions produced and waiting, at most
    heartbeat_stale_after_s: float = 300.0  # seconds without a rollout or a sign of life from the producer before the run stops

    # --- objective (see losses.py for each variant's paper) -------------------
    loss_type: str = "dapo"
    epsilon: float = 0.2  # ε: lower clip 1 − ε
    epsilon_high: float | None = None  # upper clip 1 + ε_high; None: ε (cispo: the weight's bound itself, as TRL; None: 5.0)
    delta: float | None = None  # two-sided clip: ratio ≤ δ for negative Â too
    importance_sampling_level: str = "token"  # or "sequence" (GSPO)
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0  # VESPO kernel φ(w) = w^k e^{λ(1−w)} for Â ≥ 0: k down-weights w < 1
    vespo_lambda_pos: float = 3.0  # … λ down-weights w > 1
    vespo_k_neg: float = 3.0  # the same for Â < 0
    vespo_lambda_neg: float = 2.0
    beta: float = 0.0  # β: KL(π_θ‖π_ref) weight; π_ref is loaded only when > 0
    use_bias_correction_kl: bool = True  # KL term × ρ (TRL 1.16's default; DeepSeek-V3.2)
    kl_estimator: str = "k3"  # "k3" (Schulman) or "full" (exact, over the vocabulary)
    sync_ref_model: bool = False  # TR-DPO: π_ref ← α·π_θ + (1−α)·π_ref
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512
    top_entropy_quantile: float = 1.0  # ρ: keep the top-ρ tokens by entropy
    mask_truncated_completions: bool = False
    target_kl: float | None = None  # stop reusing a rollout once KL(π_θ‖π_old) exceeds it
    entropy_coef: float = 0.0  # c: loss − c·mean H over the policy tokens; 0 off (adaptive: the initial c)
    use_adaptive_entropy: bool = False  # Skywork-OR1: c += δ while H ≤ entropy_target, else c −= δ; applied only then
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005  # δ per optimizer step
    entropy_target: float = 0.2  # nats; LMs sit at 2–10, so set it near the entropy logged early in training
    router_aux_loss_coef: float | None = None  # MoE load-balancing loss weight; None: the model config's (TRL; model/experts.py)
    # The sampler–trainer mismatch (TRL's names; algo/sampling_correction.py). The correction applies where the
    # sampler samples from its own weight copy (bf16): there its log-probs play vLLM's.
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"  # or token_mask, token_truncate, sequence_truncate
    vllm_importance_sampling_clip_max: float | None = 3.0  # C_max
    vllm_importance_sampling_clip_min: float | None = None  # C_min
    vllm_importance_sampling_cap: float | None = None  # deprecated spelling of clip_max (TRL)
    off_policy_mask_threshold: float | None = None  # δ: DeepSeek-V3.2's off-policy sequence mask; None: off

    # --- rewards and advantages -------------------------------------------------
    reward_weights: list[float] | None = None
    scale_rewards: str = "group"  # TRL also accepts True/False
    multi_objective_aggregation: str = "sum_then_normalize"

    # --- dynamic sampling (DAPO §3.2; verl's algorithm.filter_groups names, TRL has none; rollout/group_filter.py) ---
    filter_groups: bool = False  # train only on groups whose rewards differ (Â ≠ 0), sampling more prompts to fill the rollout
    filter_groups_metric: str | None = None  # spread in: None, what Â is computed from; a reward function's name; or "module:function"
    max_num_gen_batches: int = 10  # sampling rounds per rollout at most (the first included; verl's DAPO recipe); then train on what there is
    filter_groups_max_age: int = 1  # rollouts a surplus informative group may wait to be trained on; 0: surplus dropped (verl)

    # --- model -------------------------------------------------------------------
    disable_dropout: bool = True  # dropout would make π_old irreproducible
    bf16: bool | None = None  # None: on where the hardware multiplies bf16 fast (AMX/AVX512-BF16 CPU, CUDA; precision.py)
    tf32: bool | None = None  # TrainingArguments': fp32 matmuls in TF32 on an Ampere or newer GPU (True), or not (False); None: torch's
    gradient_checkpointing: bool = False
    gradient_checkpointing_kwargs: dict | str | None = None  # passed to gradient_checkpointing_enable
    # transformers 5.25's names for the two above (TrainingArguments): when set they win, then both pairs read alike
    activation_checkpointing: bool | None = field(default=None, metadata={"nargs": "?", "const": True})  # a bare flag means True
    activation_checkpointing_kwargs: dict | str | None = None
    model_init_kwargs: dict | str | None = None
    trust_remote_code: bool = False  # run a model's own code (its folder's auto_map): policy, tokenizer and reward models, as TRL

    # --- logging and saving --------------------------------------------------------
    logging_strategy: str = "steps"  # "steps": every logging_steps; "epoch": at each pass's end; "no": train()'s summary alone
    logging_steps: float = 10
    logging_first_step: bool = False  # also log after the first optimizer step (whatever logging_strategy, as transformers)
    log_completions: bool = False
    num_completions_to_print: int | None = 4
    log_unique_prompts: bool = False  # the completions table sent to W&B / Trackio keeps each prompt's first row (TRL's)
    report_to: None | str | list[str] = "none"  # TRL's annotation: HfArgumentParser reads it as text, default "none"
    save_strategy: str = "steps"  # "steps": every save_steps and at the end; "epoch": after each pass; "best": at a new best evaluation; "no"
    save_steps: float = 500
    save_total_limit: int | None = None
    eval_strategy: str = "no"  # "steps": every eval_steps (default logging_steps); "epoch"; "no"
    eval_steps: float | None = None
    eval_on_start: bool = False  # evaluate once before the first step
    eval_delay: float = 0  # no scheduled evaluation before this step ("steps") or epoch ("epoch"), as transformers
    per_device_eval_batch_size: int = 8
    metric_for_best_model: str | None = None  # a logged or eval metric; tracked in trainer.state.best_metric
    greater_is_better: bool | None = None  # None: True unless the metric's name ends in "loss" (transformers)
    load_best_model_at_end: bool = False  # after training, the best checkpoint's weights back into the policy (run/checkpoints.load_best)
    disable_tqdm: bool | None = False  # None: False
    use_cpu: bool = False  # train on the CPU even where a GPU is: accelerate's Accelerator(cpu=True) (run/setup.py)

    # Filled in by __post_init__ (world size read from the launcher's environment).
    world_size: int = field(default=-1, repr=False, metadata={"help": argparse.SUPPRESS})

    def __post_init__(self) -> None:
        if self.world_size == -1:
            self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        check_types(self, typing.get_type_hints(type(self)))
        for name in TRL_FIELDS:
            check_trl_field(name, getattr(self, name))
        self._apply_trl_spellings()
        if isinstance(self.scale_rewards, bool):  # TRL's older spelling
            self.scale_rewards = "group" if self.scale_rewards else "none"
        if self.epsilon_high is None:
            self.epsilon_high = 5.0 if self.loss_type == "cispo" else self.epsilon
        if self.report_to is None:  # transformers 5: None reports to no tracker, as "none"
            self.report_to = "none"
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        if self.report_to in (["none"], [""]):  # transformers' rule: "none" or ["none"] is no tracker
            self.report_to = []
        self._resolve_batches()
        validate(self)
        self.report_to = resolve_report_to(self.report_to)  # TrainingArguments' reading: "all" → the installed trackers
        warn_like_trl(self)
        warn_inert(self)

    def recheck(self) -> None:
        """`__post_init__`'s checks again, on values set since (`trainer.args.eval_strategy = "steps"` in a notebook):
        the fields derived from others filled where still None, as there, then every type, value and combination.
        GRPOTrainer.train() calls it on the fields it reads where it uses them (run/trainer_attributes.TRLAttributes.check_live_args), before any step.

        Raises:
            TypeError, ValueError: as `__post_init__` (config/checks.py's check_types and validate).
        """
        self._fill_derived()
        check_types(self, typing.get_type_hints(type(self)))
        validate(self)

    def _apply_trl_spellings(self) -> None:
        """TRL's None defaults and generation_kwargs, turned into the fields that hold them here."""
        if self.output_dir is None:
            self.output_dir = "grpo-output"
        if isinstance(self.output_dir, (str, os.PathLike)):  # TrainingArguments': "~/runs" is under $HOME, not a folder named "~"
            self.output_dir = os.path.expanduser(self.output_dir)
        if self.vllm_importance_sampling_cap is not None:  # TRL's deprecation, word for word
            warnings.warn("The `vllm_importance_sampling_cap` argument is deprecated and will be removed in v2.0.0. "
                          "Use `vllm_importance_sampling_clip_max` instead.", FutureWarning, stacklevel=5)
            self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
        if self.disable_tqdm is None:
            self.disable_tqdm = False
        self.debug = []  # every accepted value ("", None, []) means no debug option: TrainingArguments' [] for them
        if self.include_num_input_tokens_seen is False:  # TrainingArguments' spelling of False
            self.include_num_input_tokens_seen = "no"
        for name in DICT_FIELDS:
            text = getattr(self, name)
            if isinstance(text, str):
                try:
                    setattr(self, name, json.loads(text, object_pairs_hook=functools.partial(_each_key_once, name)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{name}={text!r} is not JSON ({err}); give a dict, e.g. '{{\"key\": 1}}'.") from err
            if not isinstance(getattr(self, name), (dict, type(None))):
                raise ValueError(f"{name}={getattr(self, name)!r}: give a dict (or its JSON text), or None.")
        for old, new in (("gradient_checkpointing", "activation_checkpointing"), ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
            if getattr(self, new) is not None:  # transformers 5.25's rule: the new name, when set, over the old one
                setattr(self, old, getattr(self, new))
            setattr(self, new, getattr(self, old))
        if self.use_vllm and self.generation_backend == "fastgrpo":  # TRL's switch, the default backend otherwise
            self.generation_backend = "vllm"
        for key, value in check_generation_kwargs(self.generation_kwargs or {}, self.generation_backend == "vllm",
                                             self.max_completion_length).items():
            setattr(self, key, value)  # TRL lets generation_kwargs override the sampling fields
        if self.generation_kwargs:  # the fields it set, checked as if given directly
            try:
                check_types(self, typing.get_type_hints(type(self)))
            except (TypeError, ValueError) as err:
                raise ValueError(f"generation_kwargs: {err}") from None
        self._fill_derived()

    def _fill_derived(self) -> None:
        """The fields whose None means a value derived from others (TrainingArguments' defaults)."""
        if self.load_best_model_at_end and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"  # transformers' default: eval_loss, lower is better
        if self.metric_for_best_model is not None and self.greater_is_better is None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        if self.eval_strategy == "steps" and self.eval_steps is None:
            self.eval_steps = self.logging_steps  # transformers' default

    def _resolve_batches(self) -> None:
        # Checked before the arithmetic below, which would divide by zero or
        # read steps_per_generation=0 as "not set".
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size", "steps_per_generation", "generation_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}: use 1 or more.")
        per_step = self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size
        user_set_steps = self.steps_per_generation is not None
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError(
                f"generation_batch_size={self.generation_batch_size} and steps_per_generation="
                f"{self.steps_per_generation} are both set; set only one of them."
            )
        if self.generation_batch_size is None:
            steps = self.steps_per_generation if user_set_steps else self.gradient_accumulation_steps
            self.generation_batch_size = self.per_device_train_batch_size * steps * self.world_size
        per_micro = self.per_device_train_batch_size * self.world_size
        if self.generation_batch_size % per_micro:
            raise ValueError(
                f"generation_batch_size={self.generation_batch_size} is not a whole number of micro-batches "
                f"(per_device_train_batch_size × world_size = {per_micro}); use a multiple of {per_micro}."
            )
        self.steps_per_generation = self.generation_batch_size // per_micro
        if self.steps_per_generation % self.gradient_accumulation_steps:
            fix = (
                f"steps_per_generation that is a multiple of {self.gradient_accumulation_steps}"
                if user_set_steps
                else f"generation_batch_size that is a multiple of {per_step}"
            )
            raise ValueError(
                f"a rollout of {self.generation_batch_size} completions makes {self.steps_per_generation} "
                f"micro-batches per process, not a whole number of optimizer steps of "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}; use a {fix}."
            )

    # --- derived counts ------------------------------------------------------------
    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps fed by one rollout: μ × steps_per_generation / gradient_accumulation_steps."""
        return self.num_iterations * self.steps_per_generation // self.gradient_accumulation_steps

    @property
    def prompts_per_rollout(self) -> int:
        """Prompts in one rollout, all processes (B = generation_batch_size / G)."""
        return self.generation_batch_size // self.num_generations

    def num_warmup_steps(self, max_steps: int) -> int:
        """Warm-up optimizer steps, transformers' `get_warmup_steps` rule.

        warmup_steps ≥ 1 is a count; 0 < warmup_steps < 1 is a fraction of
        `max_steps` (rounded up); warmup_steps = 0 falls back to warmup_ratio
        (the field older transformers/TRL scripts use), also a fraction.
        """
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        fraction = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        return math.ceil(fraction * max_steps)

    def to_dict(self) -> dict:
        """The fields as a plain dict (for YAML, checkpoints, logs and trackers), TRL's other fields included.

        As TrainingArguments.to_dict: a field named `*_token` (hub_token) is written as "<HUB_TOKEN>", never its value.
        """
        d = dataclasses.asdict(self)
        return {k: f"<{k.upper()}>" if k.endswith("_token") else v for k, v in d.items()}


_FIELDS = {f.name for f in dataclasses.fields(GRPOConfig)}  # the dataclass fields (the CLI and its tests read them)
