"""TRL 1.16's `trl.experimental.async_grpo` API on fastgrpo: a TRL async script runs with only its import changed.

    from fastgrpo.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    AsyncGRPOTrainer(model="smollm2-135m-instruct", reward_funcs=fn, train_dataset=ds,
                     args=AsyncGRPOConfig(vllm_server_base_url="http://127.0.0.1:8000", max_staleness=2)).train()

`AsyncGRPOConfig` is `GRPOConfig` with TRL's `AsyncGRPOConfig` defaults (max_staleness=4, the vLLM server at
http://localhost:8000, logging_steps=1, lr_scheduler_type="constant", max_completion_length=2048,
gradient_checkpointing=True, num_completions_to_print=None) and its own fields, each honoured, mapped or refused:

- `max_staleness`, `weight_sync_steps`, `max_inflight_tasks`, `queue_maxsize`, `heartbeat_stale_after_s`: honoured
  (rollout/async_producer.py; the units are TRL's: completions, seconds, optimizer steps);
- `dtype`: as TRL's, the dtype a model given by name loads in (`model_init_kwargs`' own `dtype` wins; a torch dtype, which
  TRL's loader takes too, is kept as its name: torch.bfloat16 → "bfloat16"); "float32", TRL's default, keeps fp32 master weights that fastgrpo multiplies in bf16 where `bf16` says;
- `token_budget`: None or ≤ 0 (TRL's fixed-count packing): fastgrpo packs `per_device_train_batch_size`
  completions per micro-batch, so a positive budget is refused;
- `fork_threshold_tokens`: any value: fastgrpo's multi-turn rollouts keep each turn's token ids and never
  re-tokenize a conversation, so there is no fork to decide;
- `request_timeout`, `weight_sync_timeout`: any value: fastgrpo's server requests and pushes time out after
  `vllm_server_timeout` (the dead-server error names the URL), and a timeout changes no result;
- `trust_remote_code`, `router_aux_loss_coef`, `model_init_kwargs`, `chat_template_kwargs`, `log_completions`: as GRPOConfig's.

`AsyncGRPOTrainer` is `GRPOTrainer` with TRL's async constructor; `optimizers` is GRPOTrainer's; its
`rollout_worker` and `weight_transfer` hooks are refused (the producer is fastgrpo's, the weights go through the
server's reload). The loss is fastgrpo's GRPO loss with π_old the trainer's
weights at a rollout's first use and TRL's `vllm_importance_sampling_*` weight π_old / π_behaviour for the lag
(TRL's async trainer puts π_behaviour in the ratio itself and applies no further weight: docs/design.md says why).

Not here: the pipeline (rollout/async_producer.py), the loop (trainer.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from ..config import GRPOConfig
from ..config.grpo_config import names_unknown_fields
from ..run.inputs import default_output_dir
from ..trainer import GRPOTrainer


DTYPES = ("auto", "bfloat16", "float16", "float32")  # TRL AsyncGRPOConfig.dtype's choices


@names_unknown_fields
@dataclass
class AsyncGRPOConfig(GRPOConfig):
    """`GRPOConfig` with TRL 1.16 `AsyncGRPOConfig`'s defaults and fields (module docstring: what each becomes).

    Raises:
        ValueError: a dtype other than TRL's choices (DTYPES), a positive token_budget, max_staleness=None (use GRPOConfig), and every
            GRPOConfig check (the overlap needs the vLLM server, one process, no filter_groups).
    """

    # TRL AsyncGRPOConfig's defaults where GRPOConfig's differ
    max_staleness: int | None = 4
    logging_steps: float = 1
    lr_scheduler_type: str = "constant"
    max_completion_length: int = 2048
    gradient_checkpointing: bool = True
    num_completions_to_print: int | None = None
    use_vllm: bool = True
    vllm_mode: str = "server"
    vllm_server_base_url: str | None = "http://localhost:8000"
    disable_tqdm: bool | None = None  # TrainingArguments' (TRL's AsyncGRPOConfig is not a GRPOConfig): None is False here
    ignore_data_skip: bool = field(default=True, kw_only=True)  # TRL's: no skip-and-replay (fastgrpo saves the prompt order)
    remove_unused_columns: bool | None = field(default=True, kw_only=True)  # TrainingArguments'; fastgrpo passes every column to rewards
    # TRL AsyncGRPOConfig's own fields
    dtype: str = "float32"
    token_budget: int | None = None
    fork_threshold_tokens: int = 1024
    request_timeout: int = 600
    weight_sync_timeout: int = 1800

    def __post_init__(self) -> None:
        if isinstance(self.dtype, torch.dtype):  # torch.bfloat16: TRL's loader takes it too
            self.dtype = str(self.dtype).removeprefix("torch.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: use one of {', '.join(DTYPES)} (the dtype the model loads in; float32, the "
                             "default, keeps float32 master weights and multiplies in bf16 where bf16=True says).")
        if self.token_budget is not None and self.token_budget > 0:
            raise ValueError(f"token_budget={self.token_budget}: fastgrpo packs per_device_train_batch_size completions per "
                             "micro-batch (TRL's token_budget <= 0); set per_device_train_batch_size instead and remove token_budget.")
        if self.max_staleness is None:
            raise ValueError("max_staleness=None is the synchronous loop: use fastgrpo.GRPOConfig and GRPOTrainer for it, "
                             "or max_staleness=0 (no lookahead) and up.")
        super().__post_init__()


class AsyncGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` taking TRL 1.16 `AsyncGRPOTrainer`'s arguments; generation overlaps training (rollout/async_producer.py).

    Args:
        model, reward_funcs, train_dataset, processing_class, callbacks, optimizers, peft_config, tools, environment_factory:
            as `GRPOTrainer`'s (TRL's meanings).
        args: an `AsyncGRPOConfig` (a `GRPOConfig` with max_staleness set works too); default
            `AsyncGRPOConfig("<model name>-AsyncGRPO")`, as TRL.
        rollout_worker, weight_transfer: TRL's hooks; only their defaults (fastgrpo's own) are accepted.

    As TRL's, it writes what it decides back into `args`: `model_init_kwargs["dtype"]` from `args.dtype` for a model
    given by name (the kwargs' own dtype wins), `max_inflight_tasks` = max(max_staleness, 1) rollouts' completions for
    -1 (auto), `ignore_data_skip` = True.

    Warns:
        UserWarning: args.ignore_data_skip=False, which is set to True (TRL's: there is no skip-and-replay to run;
            fastgrpo's resume restores the saved prompt order either way); a dtype other than "float32" with a model
            already built (it is not cast; TRL takes only names).
    Raises:
        ValueError: a custom rollout worker or weight transfer; args whose max_staleness is None; an eval_strategy other than
            "no" or eval_on_start (no eval_dataset to evaluate, as TRL's; `GRPOTrainer` with max_staleness takes one);
            everything `GRPOTrainer` raises.
    """

    def __init__(
        self, model, reward_funcs=None, args: GRPOConfig | None = None, train_dataset=None, processing_class=None, callbacks=None,
        optimizers=(None, None), peft_config=None, tools=None, environment_factory=None, rollout_worker=None, weight_transfer=None,
    ):
        refused = {"rollout_worker": (rollout_worker is not None, "fastgrpo's producer samples from the vLLM server; remove it"),
                   "weight_transfer": (weight_transfer is not None, "weights go to the server as its reload; remove it")}
        for name, (given, fix) in refused.items():
            if given:
                raise ValueError(f"AsyncGRPOTrainer({name}=…) is not supported: {fix}.")
        if args is None:
            args = AsyncGRPOConfig(default_output_dir(model, "AsyncGRPO"))
        if isinstance(args, GRPOConfig) and args.max_staleness is None:
            raise ValueError("args.max_staleness=None is the synchronous loop: use GRPOTrainer, or set max_staleness (TRL's default 4).")
        if isinstance(args, GRPOConfig) and (args.eval_strategy != "no" or args.eval_on_start):  # GRPOTrainer would say "pass an eval_dataset"
            raise ValueError(f"eval_strategy={args.eval_strategy!r}{' with eval_on_start' if args.eval_on_start else ''}: AsyncGRPOTrainer takes no "
                             "eval_dataset (as TRL's), so nothing would be evaluated (load_best_model_at_end and save_strategy='best' read "
                             "evaluations); set eval_strategy='no' and eval_on_start=False, or train with fastgrpo.GRPOTrainer(model, "
                             "reward_funcs, args=args, train_dataset=…, eval_dataset=…): the same overlap (max_staleness), with evaluation.")
        if not args.ignore_data_skip:  # TRL AsyncGRPOTrainer forces it, with this warning
            warnings.warn("`ignore_data_skip` is forced to `True` for AsyncGRPO because the base Trainer's skip-and-replay loop "
                          "does not apply to a live rollout queue.", stacklevel=2)
            args.ignore_data_skip = True
        if isinstance(args, AsyncGRPOConfig) and isinstance(model, str):  # TRL: model_init_kwargs.setdefault("dtype", args.dtype)
            args.model_init_kwargs = {"dtype": args.dtype, **(args.model_init_kwargs or {})}
        elif isinstance(args, AsyncGRPOConfig) and args.dtype != "float32":
            warnings.warn(f"dtype={args.dtype!r} applies to a model loaded by name; the model given is already built and is not "
                          "cast: pass its name, or cast it before.", stacklevel=2)
        if args.max_inflight_tasks < 0:  # TRL writes its auto value back (rollout/async_producer.inflight_rollouts' count)
            args.max_inflight_tasks = max(args.max_staleness, 1) * args.generation_batch_size
        super().__init__(model, reward_funcs, args=args, train_dataset=train_dataset, processing_class=processing_class,
                         callbacks=callbacks, optimizers=optimizers, peft_config=peft_config, tools=tools, environment_factory=environment_factory)
