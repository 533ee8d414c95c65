"""TRL 1.16's `GRPOTrainer` attributes (and transformers.Trainer's) that user code, callbacks and rollout functions read,
on a mixin `GRPOTrainer` inherits (through trl_methods.TRLMethods); and the Trainer methods fastgrpo refuses.

Each attribute has TRL's name, type and meaning (tools, rollout_func, environment_factories, environments,
data_collator, generation_config, generation_kwargs, is_in_train, state, train_dataset, eval_dataset, model, optimizer, reward_funcs,
reward_weights). Where TRL's is a plain attribute whose change
TRL would act on, fastgrpo's is read-only, and setting it raises an AttributeError naming the fix (`read_only`): fastgrpo
reads these once, when the trainer is built, so a change would be silently ignored.

`check_live_args`: the fields of `trainer.args` the trainer reads where it uses them (runs.LIVE_FIELDS), checked at train()'s
start on their values then, as at build, so a notebook's change applies or is refused before a step.

`REFUSED_METHODS`: Trainer's methods that have no meaning in fastgrpo's loop (its per-batch loss and steps); calling one
raises NotImplementedError naming what to use instead, rather than an AttributeError that names nothing.

Not here: TRL's other public methods (trl_methods.py), the dataloaders behind `data_collator` (dataloaders.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from transformers import GenerationConfig

from .callbacks import check_early_stopping
from .dataloaders import identity
from .evaluation import check_best_metric, loss_keys
from .inputs import checked_eval_sets
from ..rollout.agents.environments import Environments


def read_only(name: str, getter: Callable, doc: str, fix: str) -> property:
    """A property with TRL's name whose setter refuses: AttributeError "trainer.<name> = <value>: <fix>"."""
    def refuse(self, value):
        raise AttributeError(f"trainer.{name} = {value!r:.80}: {fix}")

    return property(getter, refuse, doc=doc)


def _built(name: str, argument: str | None = None) -> str:
    """The fix for setting an attribute fastgrpo reads once, when the trainer is built from GRPOTrainer's `argument`."""
    return (f"fastgrpo reads {name} once, when the trainer is built, so setting it here would change nothing; give "
            f"GRPOTrainer({argument or name}=…) to a new trainer.")


# TRL's generate reads trainer.generation_config at each rollout, so setting it there applies; fastgrpo's sampler is built once.
_SAMPLER_BUILT = ("fastgrpo builds its sampler from GRPOConfig's sampling fields and generation_kwargs when the trainer is built, so "
                  "setting it here would change nothing; give GRPOConfig(generation_kwargs={…}) (or temperature, top_p, top_k, min_p, "
                  "repetition_penalty) to a new GRPOTrainer.")


class SamplerSettings(GenerationConfig):
    """The `GenerationConfig` `trainer.generation_config` returns: TRL's values, read-only. TRL's generate reads
    `trainer.generation_config` at each rollout, so `trainer.generation_config.temperature = 0.3` applies there;
    fastgrpo's sampler was built with the trainer, so here the change would be silently ignored.

    Raises:
        AttributeError: on setting any field, or `update(…)`, naming the fix (GRPOConfig's fields, a new trainer).
    Copies (`copy.copy`, `copy.deepcopy`, which transformers' `generate` takes of the config it is given) are plain,
    writable `GenerationConfig`s: `model.generate(…, generation_config=trainer.generation_config, top_k=5)` works.
    """

    def __setattr__(self, name, value):
        raise AttributeError(f"trainer.generation_config.{name} = {value!r:.80}: {_SAMPLER_BUILT}")

    def __copy__(self) -> GenerationConfig:
        plain = GenerationConfig.__new__(GenerationConfig)
        plain.__dict__.update(self.__dict__)
        return plain

    def __deepcopy__(self, memo) -> GenerationConfig:
        plain = GenerationConfig.__new__(GenerationConfig)
        plain.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return plain


def _environments(trainer) -> Environments | None:
    return trainer.agents.environments


class TRLAttributes:
    """TRL's GRPOTrainer attributes; the class using it provides `args`, `agents` (rollout/producers.AgentInputs),
    `events` (callbacks.TrainerEvents), `update` (update/step.OptimizerStep), `tokenizer`, `eos_token_ids`, `reward_names`, `_train_dataset`, `_eval_dataset`
    and `eval_sets` (dataset_kinds.eval_sets of it), `_model`, `_optimizer`, `_reward_funcs` and `_reward_weights`, as GRPOTrainer does."""

    model = read_only("model", lambda self: self._model, "Trainer's `trainer.model`: the policy, as accelerate prepared it.", _built("model"))
    optimizer = read_only(
        "optimizer", lambda self: self._optimizer, "Trainer's `trainer.optimizer`: the run's optimizer, as accelerate prepared it.",
        "fastgrpo builds the optimizer with the trainer (its learning-rate schedule, the optimizer step and checkpoints hold it), so "
        "setting it here would change nothing; give GRPOTrainer(optimizers=(optimizer, None)) to a new trainer.",
    )
    reward_funcs = read_only(
        "reward_funcs", lambda self: self._reward_funcs,
        "TRL's `trainer.reward_funcs`: the reward functions and models (built-in names and \"module:function\" resolved), then "
        "an environment's get_reward.", _built("reward_funcs"),
    )
    reward_weights = read_only(
        "reward_weights", lambda self: self._reward_weights,
        "TRL's `trainer.reward_weights`: a float32 tensor, one weight per reward_funcs entry (args.reward_weights, or ones).",
        "fastgrpo reads reward_weights once, when the trainer is built, so setting it here would change nothing; give "
        "GRPOConfig(reward_weights=[…]) to a new trainer.",
    )

    train_dataset = read_only(
        "train_dataset", lambda self: self._train_dataset,
        "Trainer's `trainer.train_dataset`: the rows given to GRPOTrainer (TRL's placeholder rows when an environment owns the data).",
        "fastgrpo plans the run's data order and length (max_steps) from train_dataset when the trainer is built, so train() would "
        "draw the old order's row numbers from these rows (an IndexError mid-run, or rows left out); give GRPOTrainer(train_dataset=…) "
        "to a new trainer.",
    )

    tools = read_only(
        "tools", lambda self: _environments(self).tools(self.agents.tools) if _environments(self) else list(self.agents.tools),
        "TRL's `trainer.tools`: the tools the model may call: the `tools` given ([] for none) and, with environment_factory, "
        "each environment's public methods (bound to the instance made first), each once, as TRL lists them.", _built("tools"),
    )
    rollout_func = read_only(
        "rollout_func", lambda self: self.agents.rollout_func,
        "TRL's `trainer.rollout_func`: the rollout function given (None without one).", _built("rollout_func"),
    )
    environment_factories = read_only(
        "environment_factories", lambda self: _environments(self).factories if _environments(self) else None,
        "TRL's `trainer.environment_factories`: environment_factory as a dict, {None: factory} for a single one, the "
        "dict given for several (each row's `environment` column picks one); None without one.",
        _built("environment_factories", "environment_factory"),
    )
    environments = read_only(
        "environments", lambda self: _environments(self).latest if _environments(self) else None,
        "TRL's `trainer.environments`: the environment instances of the latest batch drawn (training or evaluation; with "
        "max_staleness, the rollout being made ahead), one per completion, as reward functions receive them; None before "
        "the first batch and without environment_factory.",
        "the trainer sets it to each batch's environments; make them with environment_factory.",
    )
    data_collator = read_only(
        "data_collator", lambda self: identity,
        "TRL's `trainer.data_collator`: `run.dataloaders.identity` (TRL's `identity`): a batch is the list of its rows, "
        "as get_train_dataloader() and get_eval_dataloader() yield them.",
        "fastgrpo's loop draws rows itself and never collates a batch, so setting it would change nothing it trains on.",
    )

    @property
    def generation_kwargs(self) -> dict:
        """TRL's `trainer.generation_kwargs`: the keywords TRL builds its `generation_config` from (without vLLM):
        max_new_tokens (max_completion_length), do_sample, pad, bos and eos token ids (every id that ends a completion,
        sorted), temperature, top_p, top_k, min_p, repetition_penalty, cache_implementation, then `args.generation_kwargs`
        over them (fastgrpo already read those into the fields). A new dict at each read: fastgrpo samples from the
        config's fields, so changing it changes nothing; setting it raises an AttributeError naming the fix (TRL's
        generate reads `generation_config` at each rollout, fastgrpo's sampler was built with the trainer).

        Raises:
            AttributeError: with use_vllm=True, where TRL's GRPOTrainer has none either (vLLM samples with its own
                settings); the message names the fields to read instead.
        """
        a = self.args
        if a.use_vllm:
            raise AttributeError("trainer.generation_kwargs / generation_config: with use_vllm=True TRL's GRPOTrainer has neither "
                                 "(vLLM samples with its own settings), nor does fastgrpo; read the sampling fields from trainer.args "
                                 "(max_completion_length, temperature, top_p, top_k, min_p, repetition_penalty).")
        tok = self.tokenizer
        kwargs = {"max_new_tokens": a.max_completion_length, "do_sample": True, "pad_token_id": tok.pad_token_id,
                  "bos_token_id": tok.bos_token_id, "eos_token_id": list(self.eos_token_ids), "temperature": a.temperature,
                  "top_p": a.top_p, "top_k": a.top_k, "min_p": a.min_p, "repetition_penalty": a.repetition_penalty,
                  "cache_implementation": a.cache_implementation}
        return {**kwargs, **(a.generation_kwargs or {})}

    @generation_kwargs.setter
    def generation_kwargs(self, value) -> None:
        raise AttributeError(f"trainer.generation_kwargs = {value!r:.80}: {_SAMPLER_BUILT}")

    @property
    def generation_config(self) -> GenerationConfig:
        """TRL's `trainer.generation_config`: a transformers `GenerationConfig` of `generation_kwargs`, with
        disable_compile=True, as TRL 1.16 builds it for transformers' generate. Built at each read from the run's config,
        read-only (`SamplerSettings`): changing it would change nothing fastgrpo samples, so it is refused naming the fix
        (GRPOConfig's sampling fields, given to a new trainer); its copies are plain `GenerationConfig`s.

        Raises:
            AttributeError: with use_vllm=True (`generation_kwargs`); on setting it or one of its fields, naming the fix.
        """
        settings = GenerationConfig(**self.generation_kwargs, disable_compile=True)
        settings.__class__ = SamplerSettings  # built writable, then sealed: GenerationConfig's __init__ sets each field
        return settings

    @generation_config.setter
    def generation_config(self, value) -> None:
        raise AttributeError(f"trainer.generation_config = {type(value).__name__}(…): {_SAMPLER_BUILT}")

    @property
    def eval_dataset(self):
        """Trainer's `trainer.eval_dataset`: the rows, or dict of them, that evaluate() and the scheduled evaluations read.
        Settable, as Trainer's: the next evaluation reads the new rows (checked as evaluate(eval_dataset=…) checks them).

        Raises (on setting):
            ValueError: None while eval_strategy or eval_on_start asks for evaluations (transformers' rule at
                construction); rows evaluate() cannot read (dataset_kinds.eval_sets) or the reward functions cannot
                score (inputs.checked_eval_sets); a metric_for_best_model the new sets do not report (evaluation.check_best_metric).
        """
        return self._eval_dataset

    @eval_dataset.setter
    def eval_dataset(self, value) -> None:
        a = self.args
        if value is None and (a.eval_strategy != "no" or a.eval_on_start):  # the scheduled evaluations would be skipped
            raise ValueError(f"trainer.eval_dataset = None with eval_strategy={a.eval_strategy!r}{' and eval_on_start' if a.eval_on_start else ''}: "
                             "the scheduled evaluations would have nothing to read; give rows, or first set trainer.args.eval_strategy = "
                             "'no' and trainer.args.eval_on_start = False (they apply live).")
        sets = checked_eval_sets(value, self.reward_funcs, self.reward_names, self.agents) if value is not None else None  # as at build
        if sets is not None:
            check_best_metric(a.metric_for_best_model, list(sets), self.reward_names, loss_keys(a.loss_type, a.beta))
        self._eval_dataset, self.eval_sets = value, sets

    def check_live_args(self) -> None:
        """train()'s first check after `runs.ArgsAtBuild.check` (run/checkpoints.resume), before anything is written: the
        fields the trainer reads where it uses them (`runs.LIVE_FIELDS`, as Trainer reads them in train(), its
        DefaultFlowCallback and _save_checkpoint) checked on their values now, as GRPOConfig and GRPOTrainer checked them
        at build (`trainer.args.eval_strategy = "steps"` in a notebook applies, or is refused before a step runs). The
        callbacks and the optimizer step then read this `args` (a config put in trainer.args's place included).

        Raises:
            TypeError, ValueError: GRPOConfig.recheck's (a value of the wrong type or out of range, save_strategy="best"
                without metric_for_best_model, load_best_model_at_end with strategies that differ, …); eval_strategy or
                eval_on_start without an eval_dataset (transformers' error at build); a metric_for_best_model the eval
                sets do not report (evaluation.check_best_metric); an EarlyStoppingCallback without metric_for_best_model
                or evaluation (callbacks.check_early_stopping).
        """
        a = self.args
        a.recheck()
        if self.eval_dataset is None and (a.eval_strategy != "no" or a.eval_on_start):  # the scheduled evaluations would be skipped
            raise ValueError(f"args.eval_strategy={a.eval_strategy!r}{' with eval_on_start' if a.eval_on_start else ''}, but this trainer "
                             "has no eval_dataset to evaluate; set trainer.eval_dataset = rows, or set eval_strategy='no' and "
                             "eval_on_start=False.")
        if self.eval_sets is not None:
            check_best_metric(a.metric_for_best_model, list(self.eval_sets), self.reward_names, loss_keys(a.loss_type, a.beta))
        check_early_stopping(self.events.handler.callbacks, a.metric_for_best_model, a.eval_strategy)
        self.events.args = self.update.args = a

    @property
    def state(self):
        """Trainer's `trainer.state`: the run's `transformers.TrainerState` (callbacks.TrainerEvents keeps it), a new one from
        each train()'s start, as Trainer's. Settable, as Trainer's plain attribute (callbacks see the one set)."""
        return self.events.state

    @state.setter
    def state(self, value) -> None:
        self.events.state = value

    @property
    def is_in_train(self) -> bool:
        """transformers.Trainer's `trainer.is_in_train`: True from train()'s start (on_train_begin) until it returns,
        after on_train_end; False before, after, and in an evaluate() or predict() called outside train(). As Trainer's, it
        stays True when train() raised. Settable, as Trainer's plain attribute (fastgrpo reads it nowhere)."""
        return self.events.in_train

    @is_in_train.setter
    def is_in_train(self, value: bool) -> None:
        self.events.in_train = value


REFUSED_METHODS = {  # Trainer's methods with no meaning in fastgrpo's loop → what to use instead
    "compute_loss": "TRL's computes the loss of a batch its _prepare_inputs made; fastgrpo's loop makes no such batch (update/step.py "
                    "computes each micro-batch's loss from a rollout). Change the loss with GRPOConfig's loss fields (loss_type, "
                    "beta, epsilon, …); the logged `loss` is its value",
    "training_step": "fastgrpo's train() runs its own optimizer steps (a rollout, then μ passes over it); act at each step "
                     "with a TrainerCallback (on_step_end), or set max_steps",
    "prediction_step": "evaluate() and predict() sample and score each batch themselves; act at each batch with a "
                       "TrainerCallback's on_prediction_step",
    "evaluation_loop": "call evaluate(eval_dataset) for the eval metrics, or predict(test_dataset) for TRL's PredictionOutput",
    "hyperparameter_search": "it needs a model_init, which TRL's GRPOTrainer does not take (there it fails too); build one "
                             "trainer per trial instead (a loop over GRPOConfigs)",
}


def _refused(name: str, fix: str) -> Callable:
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"trainer.{name}(…) is not available in fastgrpo: {fix}.")

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Refused (transformers.Trainer's `{name}`): raises NotImplementedError: {fix}."
    return method


for _name, _fix in REFUSED_METHODS.items():
    setattr(TRLAttributes, _name, _refused(_name, _fix))
