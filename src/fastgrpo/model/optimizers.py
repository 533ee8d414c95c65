"""The optimizer named by `optim`, built by transformers' own optimizer factory.

`GRPOConfig.optim` takes transformers' optimizer names (`adamw_torch`,
`adamw_torch_fused`, `sgd`, `adafactor`, `adamw_8bit` with bitsandbytes, …) and
`optim_args`, exactly as `transformers.Trainer` reads them
(`Trainer.get_optimizer_cls_and_kwargs`). Weight decay applies to every
trainable parameter (fastgrpo's rule, unlike Trainer's exclusion of norms and
biases; the default weight_decay is 0).

Not here: the learning-rate schedule (trainer.py, transformers' get_scheduler).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch


def check_optimizer_name(optim: str) -> None:
    """Raise ValueError, before any model loads, for a name transformers does not know.

    Raises:
        ValueError: `optim` is not a `transformers.training_args.OptimizerNames` value.
    """
    from transformers.training_args import OptimizerNames

    names = [o.value for o in OptimizerNames]
    if optim not in names:
        raise ValueError(f"optim={optim!r} is not a transformers optimizer name; use e.g. 'adamw_torch', 'adamw_torch_fused' or 'sgd' (all: {', '.join(names)}).")


def check_scheduler(args) -> None:
    """Build `lr_scheduler_type` with `lr_scheduler_kwargs` once over a throwaway optimizer, before any model loads.

    A name transformers does not know, a keyword its scheduler does not take, or one it needs (cosine_with_min_lr's
    `min_lr`) is named now, not after the model has loaded (setup.prepare builds the real one the same way).

    Raises:
        ValueError: the schedule cannot be built, naming both fields and transformers' reason;
            reduce_lr_on_plateau, which steps on a metric the loop does not have at each optimizer step.
    """
    if args.lr_scheduler_type == "reduce_lr_on_plateau":
        raise ValueError("lr_scheduler_type='reduce_lr_on_plateau' steps on a metric the GRPO loop does not have at each optimizer step; "
                         "use e.g. 'linear', 'cosine' or 'constant', or pass your own scheduler in optimizers=.")
    from transformers import get_scheduler

    steps = args.max_steps if args.max_steps > 0 else 10  # the count only sizes the schedule
    try:
        get_scheduler(args.lr_scheduler_type, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate),
                      num_warmup_steps=args.num_warmup_steps(steps), num_training_steps=steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"lr_scheduler_type={args.lr_scheduler_type!r} with lr_scheduler_kwargs={args.lr_scheduler_kwargs!r}: transformers' "
                         f"get_scheduler refuses it ({err}); use one of its names and the keywords that scheduler takes.") from None


def build_optimizer(args, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer over `model`'s trainable parameters, from `args.optim` and `args.optim_args`.

    Args:
        args: a GRPOConfig (optim, optim_args, optim_target_modules, learning_rate,
            adam_beta1, adam_beta2, adam_epsilon, weight_decay).
        model: the policy.
    Returns:
        A torch optimizer (transformers' choice of class and arguments for the name).
    Raises:
        ValueError: an optimizer whose package is missing or that does not run here; the message names `optim`.
    """
    cls, kwargs = optimizer_factory(args, model)
    return cls([p for p in model.parameters() if p.requires_grad], weight_decay=args.weight_decay, **kwargs)


def optimizer_factory(args, model: torch.nn.Module | None) -> tuple[type, dict]:
    """transformers' class and keyword arguments for `args.optim` and `args.optim_args` (Trainer.get_optimizer_cls_and_kwargs).

    `model` is read only by optimizers that target modules (`optim_target_modules`); None checks the rest
    before any model loads (inputs.check_trainer_inputs): a missing package, `optim_args` that do not parse.

    Raises:
        ValueError: the optimizer cannot be built here, naming `optim`, `optim_args` and transformers' reason.
    """
    from transformers import Trainer

    view = SimpleNamespace(  # only the TrainingArguments fields transformers' factory reads
        optim=args.optim, optim_args=args.optim_args, optim_target_modules=args.optim_target_modules,
        learning_rate=args.learning_rate, adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2,
        adam_epsilon=args.adam_epsilon, weight_decay=args.weight_decay, parallel_mode=None,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
    )
    try:
        return Trainer.get_optimizer_cls_and_kwargs(view, model)
    except (ImportError, ValueError, NotImplementedError) as err:
        fix = "give optim_args as key=value pairs, comma-separated" if args.optim_args else "use optim='adamw_torch'"
        raise ValueError(f"optim={args.optim!r} with optim_args={args.optim_args!r} cannot be built here ({err}); {fix}.") from err
