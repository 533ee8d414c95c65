"""What `GRPOTrainer` builds before it trains: the accelerator, then the policy, its tokenizer and π_ref.

- `build_accelerator`: refuses a broken launch or an unwritable output_dir, picks
  the precision (`bf16`; None: where the hardware multiplies bf16 fast, precision.py,
  with a one-line notice), refuses a tracker that is not installed, sets transformers'
  logging verbosity from `log_level` (as Trainer), checks the world size and seeds each process; on a CPU, freed memory stays in
  glibc's heap from step to step (allocator.py).
- `load_policy`: the tokenizer and model (loaded once on the main process
  first; `check_context_length` then refuses completions the model cannot hold), adapters, dropout off, gradient checkpointing, π_ref, the EOS ids and
  the router's load-balancing loss (model/experts.py);
  under FSDP the sampler's whole copy, then the policy and π_ref sharded (sharding.py).
- `prepare`: the policy and optimizer through `accelerator.prepare` (an FSDP-sharded
  policy is already distributed: only the optimizer goes through it).
- `bf16_working_copy`: the update's and the own sampler's one bf16 copy of the weights, where it applies
  (model/working_copy.py); under gradient checkpointing on a CPU it goes back to the kernel in backward.

Not here: checking the trainer's arguments (inputs.py), how models and
adapters load (model/loading.py), the optimizer's class (model/optimizers.py).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from rich.console import Console
from transformers import PreTrainedTokenizerBase, get_scheduler
from transformers.trainer_utils import enable_full_determinism
from transformers.utils import logging as transformers_logging
from transformers.utils.import_utils import enable_tf32, is_torch_tf32_available

from . import runs, trackers
from .allocator import keep_freed_memory, return_freed_memory
from .datasets import rollouts_per_pass
from ..config import GRPOConfig
from ..config.generation_kwargs import check_bad_words
from ..config.training_args import cpu_only
from ..model.launch import cpu_launch_error
from ..generation.weight_copy import GatheredCopy
from ..model.sharding import broadcast_weights, fsdp_requested, is_sharded, shard
from ..model.checkpointing import enable_gradient_checkpointing
from ..model.adapters import prepare_adapters
from ..model.loading import (decoder_of, disable_dropout, init_kwargs, is_peft_model, load_model, load_tokenizer, prepare_tokenizer,
                             reference_model)
from ..model.experts import RouterAuxLoss
from ..model.optimizers import build_optimizer
from ..model.precision import resolve_bf16
from ..model.working_copy import WorkingCopy, working_copy
from ..rollout.prompts import EMBEDDING_FIX


def build_accelerator(args: GRPOConfig) -> tuple[Accelerator, bool]:
    """The run's `Accelerator` (device, process group) and whether its products run in bf16.

    The device is the CPU with `use_cpu=True` (TRL's field: `Accelerator(cpu=True)`, as TrainingArguments
    sets up its state) or on a machine without GPUs, else the accelerator's; GRPOConfig's `device` and
    `process_index` read the same accelerate state (config/training_args.py).
    bf16 is `precision.resolve_bf16`'s decision for that device, printed as one notice line (main
    process) when `args.bf16` is None; the autocast is fastgrpo's (precision.py).
    On a CPU device it also sets glibc's malloc thresholds for the process (allocator.keep_freed_memory).

    Raises:
        ValueError: `accelerate launch --cpu` started one process of several
            (launch.cpu_launch_error); output_dir is a file or not writable
            (runs.check_output_dir); the config was built for another world size; a tracker in
            report_to that is not installed (trackers.check_available).
    """
    a = args
    cpu = a.use_cpu or cpu_only()
    if (launch_error := cpu_launch_error(cpu)) is not None:
        raise ValueError(launch_error)
    trackers.check_available(a.report_to)  # transformers' availability functions (trackers.py)
    runs.check_output_dir(a.output_dir)
    # cpu=True without GPUs: only then does accelerate join torchrun's processes into one gloo group.
    # mixed_precision="no": the precision is GRPOConfig.bf16's (fastgrpo's own autocast), never a launcher
    # config's (`accelerate launch` with `mixed_precision: bf16` would autocast the prepared model), as Trainer
    # sets it from its arguments.
    # The trackers are transformers' integration callbacks, as Trainer's (run/callbacks.py), not accelerate's.
    acc = Accelerator(cpu=cpu, mixed_precision="no", project_dir=a.output_dir)
    bf16, notice = resolve_bf16(a.bf16, use_cuda=acc.device.type == "cuda")
    transformers_logging.set_verbosity(a.get_process_log_level())  # Trainer's __init__: log_level (log_level_replica), "passive" keeps it
    if acc.num_processes != a.world_size:
        raise ValueError(f"GRPOConfig was built for world_size={a.world_size} but {acc.num_processes} processes run; build the config inside the launched script.")
    if notice is not None and acc.is_main_process:
        Console().print(f"fastgrpo: {notice}", highlight=False, soft_wrap=True)  # one line at any width
    if acc.device.type == "cpu":
        keep_freed_memory()  # no page faults on each step's fresh tensors (allocator.py)
    if a.tf32 is not None and is_torch_tf32_available():  # TrainingArguments' rule: True on, False off, None torch's own
        enable_tf32(a.tf32)
    if a.full_determinism:  # Trainer's: torch's deterministic algorithms (and the CUDA/NPU settings they need)
        enable_full_determinism(a.seed)
    set_seed(a.seed, device_specific=True)  # each process samples its own completions; PromptOrder has its own seed
    return acc, bf16


class Policy(NamedTuple):
    """What `load_policy` returns."""

    tokenizer: PreTrainedTokenizerBase  # left padding, pad = EOS when it has none (models.prepare_tokenizer)
    model: torch.nn.Module  # π_θ: adapters, dropout and gradient checkpointing as configured; not yet prepared
    ref_model: torch.nn.Module | None  # π_ref's frozen copy on the device; None with beta = 0 or adapters (`as_reference`)
    eos_token_ids: list[int]  # sorted: the model's generation_config EOS ids and the tokenizer's
    sampler_copy: GatheredCopy | None  # under FSDP: the whole copy the sampler runs, refreshed per rollout; else None
    router: RouterAuxLoss  # whether a mixture-of-experts policy's load-balancing loss is added, and its weight (TRL's rule)
    vocab_size: int | None  # rows of the policy's input embedding: the token ids it can read (`check_vocabulary`)
    prompt_room: int | None  # the most tokens a prompt may hold beside max_completion_length (`check_context_length`)


def load_policy(
    model, processing_class, peft_config, args: GRPOConfig, accelerator: Accelerator, bf16: bool = False, check_tokenizer=None,
) -> Policy:
    """Load the policy and tokenizer and make them ready to train, as TRL's GRPOTrainer does.

    Args:
        model: a name, folder, .gguf file or hub id (models.load_model), a
            `PreTrainedModel`, or a peft `PeftModel`.
        processing_class: the tokenizer, or None for the model's own.
        peft_config: a `peft.PeftConfig` or None.
        args: model_init_kwargs, trust_remote_code, beta, disable_dropout, gradient_checkpointing(_kwargs) are read.
        accelerator: the main process loads first (a built-in model's first load converts it once).
        bf16: the run's products in bf16 (precision.py): under FSDP the shards compute in bf16 and the sampler's gathered copy is bf16.
        check_tokenizer: called with the tokenizer before the model loads (inputs.TrainerInputs.check_tokenizer:
            the datasets' chat prompts must render with its template); None: nothing checked.
    Warns:
        UserWarning: model_init_kwargs set for an already built model (ignored, as TRL warns).
    Raises:
        ValueError: see models.load_tokenizer, `check_tokenizer`, generation_kwargs.check_bad_words (vLLM's bad_words as it
            tokenizes them), models.resolve_model_path, adapters.prepare_adapters and
            `check_context_length` (a max_completion_length the model's context cannot hold) and
            `check_vocabulary` (a padding id the model has no embedding row for); a
            router_aux_loss_coef for a model without router logits (experts.RouterAuxLoss).
    """
    a = args
    name = model if isinstance(model, str) else model.config._name_or_path
    if not isinstance(model, str) and a.model_init_kwargs is not None:  # TRL warns the same
        warnings.warn("model_init_kwargs is set but the model is already instantiated; model_init_kwargs is ignored.", stacklevel=3)
    with accelerator.main_process_first():  # a built-in model's first load converts it, once
        tokenizer = prepare_tokenizer(check_processing_class(processing_class)) if processing_class is not None else load_tokenizer(name, a.trust_remote_code)
        if check_tokenizer is not None:
            check_tokenizer(tokenizer)
        check_bad_words(a.generation_kwargs, a.generation_backend == "vllm", tokenizer)  # vLLM refuses them at the first request
        policy = load_model(model, init_kwargs(a.model_init_kwargs, a.trust_remote_code))
    prompt_room = check_context_length(decoder_of(policy).config, a.max_prompt_length, a.max_completion_length)
    vocab_size = check_vocabulary(policy, tokenizer)
    # Adapters given (maybe trained) or not starting as a no-op, with beta > 0: π_ref = a frozen copy of them; else adapters disabled.
    policy = prepare_adapters(policy, peft_config, reference=a.beta > 0)
    if a.disable_dropout:  # after the adapters: their dropout too
        disable_dropout(policy)
    if a.gradient_checkpointing:
        enable_gradient_checkpointing(policy, a.gradient_checkpointing_kwargs)
    # π_ref: a frozen copy, or for an adapted policy the same model as its initial self (GRPOTrainer.reference, model/adapters.reference_of).
    ref_model = reference_model(policy).to(accelerator.device) if a.beta > 0 and not is_peft_model(policy) else None
    if ref_model is not None and a.gradient_checkpointing:  # the copy attends as the policy does (KL = 0 exactly where they agree)
        enable_gradient_checkpointing(ref_model, a.gradient_checkpointing_kwargs)
    sampler_copy = None
    if fsdp_requested() and accelerator.num_processes > 1:
        if a.sync_ref_model:
            raise ValueError("sync_ref_model=True under FSDP: π_ref's sharded copy is not saved in checkpoints; train without it, or without FSDP.")
        models = (policy, ref_model) if ref_model is not None else (policy,)
        on_cpu = accelerator.device.type == "cpu"  # use_cpu=True or no GPUs
        if on_cpu:  # accelerate makes no FSDP run on CPUs (it stays MULTI_CPU): shard as its plugin does on GPUs
            for module in models:
                broadcast_weights(module)  # process 0's weights everywhere, as DDP starts
        sampler_copy = GatheredCopy(policy, torch.bfloat16 if bf16 else None)  # before sharding: whole weights
        if on_cpu:
            for module in models:
                shard(module, bf16)
    eos = policy.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    router = RouterAuxLoss.from_config(a.router_aux_loss_coef, policy.config)
    eos |= {tokenizer.eos_token_id} - {None}  # a tokenizer without an EOS token: the model's own end the completions
    return Policy(tokenizer, policy, ref_model, sorted(eos), sampler_copy, router, vocab_size, prompt_room)


def check_processing_class(processing_class):
    """`processing_class` as the policy's tokenizer, checked before the model loads; → it unchanged.

    Raises:
        TypeError: not a transformers tokenizer (a name, a processor), naming the value and the fix.
        ValueError: a tokenizer with neither a pad token nor an EOS token (batches are padded with one of them).
    """
    if not isinstance(processing_class, PreTrainedTokenizerBase):
        processor = " (a processor: pass its .tokenizer; fastgrpo trains text-only models)" if hasattr(processing_class, "tokenizer") else ""
        raise TypeError(f"processing_class is {processing_class!r:.80} ({type(processing_class).__name__}){processor}; give the policy's "
                        "tokenizer (e.g. AutoTokenizer.from_pretrained(name)), or None to load the model's own.")
    if processing_class.pad_token is None and processing_class.eos_token is None:
        raise ValueError("processing_class has neither a pad_token nor an eos_token, and batches are padded with one of them; set "
                         "tokenizer.pad_token (e.g. to the model's end-of-text token) before passing it.")
    return processing_class


def check_context_length(config, max_prompt_length: int | None, max_completion_length: int) -> int | None:
    """Refuse completions longer than the model's context, before any compute; warn when a prompt and its completion may not
    fit; → the most tokens a prompt may hold beside a completion of max_completion_length (None: not known).

    Args:
        config: the model's config; its `max_position_embeddings` (the positions it was trained on) is the
            limit, and a config without one is not checked.
        max_prompt_length, max_completion_length: GRPOConfig's, in tokens (None: prompts are not cut).
    Returns:
        max_position_embeddings − max_completion_length: the rollout refuses a longer prompt (rollout/prompts.py
        `PromptEncoder`), as the vLLM backend refuses one its engine's max_model_len cannot hold with its completion.
    Warns:
        UserWarning: max_prompt_length + max_completion_length exceeds the context: a prompt that long would be refused
            at its rollout (its completion would run past the positions the model was trained on).
    Raises:
        ValueError: max_completion_length alone exceeds the context: the samplers' KV caches are sized by it,
            so it would run out of memory or decode past the trained positions.
    """
    longest = getattr(config, "max_position_embeddings", None)
    if not isinstance(longest, int):
        return None
    if max_completion_length > longest:
        raise ValueError(
            f"max_completion_length={max_completion_length} is longer than the model's context of {longest} tokens "
            f"(config.max_position_embeddings); use at most {longest} minus your longest prompt, e.g. {min(longest // 2, 1024)}."
        )
    if (max_prompt_length is not None and max_prompt_length + max_completion_length > longest) or max_completion_length == longest:
        warnings.warn(
            f"max_prompt_length={max_prompt_length} + max_completion_length={max_completion_length} exceeds the model's context of "
            f"{longest} tokens: a rollout holding a prompt of more than {longest - max_completion_length} tokens will be refused "
            "(its completions would run past the positions the model was trained on).", stacklevel=3,
        )
    return longest - max_completion_length


def check_vocabulary(model: torch.nn.Module, tokenizer) -> int | None:
    """The rows of `model`'s input embedding (None for a model without one), once its tokenizer fits them.

    Every token id the model reads must have a row: prompts are checked as they are encoded
    (rollout/prompts.check_token_ids); the padding id fills every batch, so it is checked here.
    Warns:
        UserWarning: the tokenizer has more tokens than the embedding has rows (tokens added to the
            tokenizer without `model.resize_token_embeddings`): a prompt that uses one is refused.
    Raises:
        ValueError: the tokenizer's pad_token_id is not a row of the embedding, naming both sizes.
    """
    embedding = decoder_of(model).get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    if rows is None:
        return None
    pad = tokenizer.pad_token_id
    if pad is not None and not 0 <= pad < rows:
        raise ValueError(f"the tokenizer's pad_token_id={pad} ({tokenizer.pad_token!r}) is not among the model's {rows} embedding rows; {EMBEDDING_FIX}.")
    if len(tokenizer) > rows:
        warnings.warn(f"the tokenizer has {len(tokenizer)} tokens but the model's input embedding has {rows} rows: a prompt holding one "
                      f"of the last {len(tokenizer) - rows} will be refused; {EMBEDDING_FIX}.", stacklevel=4)
    return rows


def prepare(accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """(model, optimizer, seconds it took) ready to train: `accelerator.prepare` wraps them (DDP, or FSDP on GPUs);
    a policy `load_policy` already sharded is left as it is, since DDP around FSDP shards would be wrong. The seconds,
    rounded to 0.1 ms, are transformers' `model_preparation_time`."""
    started = time.perf_counter()
    model, optimizer = (model, accelerator.prepare(optimizer)) if is_sharded(model) else accelerator.prepare(model, optimizer)
    return model, optimizer, round(time.perf_counter() - started, 4)


def bf16_working_copy(args: GRPOConfig, accelerator: Accelerator, policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      bf16: bool) -> WorkingCopy | None:
    """The policy's one bf16 `WorkingCopy` where it applies (model/working_copy.working_copy), else None.

    Under gradient checkpointing on a CPU, the setting a run chooses for memory, the copy is handed back to the
    kernel in backward (`release`) unless a rollout is made beside the update (max_staleness), and before it is
    recast the heap's free memory goes back too (allocator.return_freed_memory: the gradients `zero_grad` freed).
    """
    memory_first = args.gradient_checkpointing and accelerator.device.type == "cpu" and args.max_staleness is None
    return working_copy(policy, optimizer, bf16=bf16, processes=accelerator.num_processes, release=memory_first,
                        before_recast=return_freed_memory)


def build_optimization(args: GRPOConfig, policy: torch.nn.Module, train_dataset, optimizers=(None, None)) -> tuple[int, torch.optim.Optimizer, object]:
    """The run's length in optimizer steps, its optimizer and its learning-rate schedule, as TRL's Trainer builds them.

    max_steps is `args.max_steps` when > 0, else `num_train_epochs` passes over
    `train_dataset`'s prompts: Trainer's ⌈num_train_epochs × steps per pass⌉, a pass being its whole
    rollouts (the last size mod prompts_per_rollout prompts left out, as TRL's loader drops an
    incomplete batch; a dataset smaller than one rollout counts as one); the optimizer is `optimizers[0]`, else `args.optim`'s
    (model/optimizers.py); the schedule is `optimizers[1]`, else transformers' `get_scheduler` with
    `lr_scheduler_type`, warm-up and `lr_scheduler_kwargs` over the optimizer (Trainer's
    `create_optimizer_and_scheduler`). `optimizers` comes checked (inputs.check_optimizers).
    """
    a = args
    if a.max_steps > 0:
        max_steps = a.max_steps
    else:
        max_steps = math.ceil(a.num_train_epochs * rollouts_per_pass(len(train_dataset), a.prompts_per_rollout) * a.steps_per_rollout)
    optimizer, scheduler = optimizers
    optimizer = optimizer if optimizer is not None else build_optimizer(a, policy)
    scheduler = scheduler if scheduler is not None else get_scheduler(
        a.lr_scheduler_type, optimizer, num_warmup_steps=a.num_warmup_steps(max_steps), num_training_steps=max_steps,
        scheduler_specific_kwargs=a.lr_scheduler_kwargs,
    )
    return max_steps, optimizer, scheduler
