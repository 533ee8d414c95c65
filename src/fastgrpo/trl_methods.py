"""TRL's public `GRPOTrainer` methods besides `train`, on a mixin: callbacks, evaluate, predict, save_model, the
dataloaders, and the helpers tests and users call directly.

`GRPOTrainer` inherits `TRLMethods`, so `GRPOTrainer.get_high_entropy_mask(trainer, …)`
works as in TRL (TRL's own tests call it on a `Mock(spec=GRPOTrainer)` that has
only an `accelerator`). Each method keeps TRL's signature and meaning; the maths
lives in algo/losses.py, evaluation in run/evaluation.py, saving in run/checkpoints.py, the dataloaders in
run/dataloaders.py.

Not here: the training loop (trainer.py), the loss terms (algo/losses.py), TRL's attributes read by user code and the
Trainer methods fastgrpo refuses (run/trainer_attributes.py, the base of `TRLMethods`).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch
from huggingface_hub import ModelCard, ModelCardData, create_repo, upload_folder
from transformers.trainer_utils import PredictionOutput
from transformers.trainer_pt_utils import (get_learning_rates, get_num_trainable_parameters, get_optimizer_group, log_metrics,
                                           metrics_format, save_metrics, save_state)

from .algo.advantages import rollout_advantages
from .algo.losses import entropy_threshold, high_entropy_mask
from .algo.sampling_correction import off_policy_mask
from .run import checkpoints
from .run.completion_tables import gathered
from .run.dataloaders import eval_dataloader, train_dataloader
from .run.dataset_kinds import eval_sets, named_eval_set
from .run.evaluation import mean_rewards
from .run.inputs import checked_eval_sets
from .run.metrics import CompletionRows
from .run.trainer_attributes import TRLAttributes, read_only


class TRLMethods(TRLAttributes):
    """TRL 1.16 `GRPOTrainer` methods; the class using it provides `accelerator` (and, for the others, GRPOTrainer's state: `entropy_control` for `entropy_coef`, `router` for the aux-loss attributes)."""

    get_off_policy_mask = staticmethod(off_policy_mask)  # TRL's static method, same signature (algo/sampling_correction.py)
    # transformers.Trainer's helpers for scripts (train_results.json, all_results.json, trainer_state.json, the printed
    # table), transformers' own functions as Trainer binds them; they read args, state, model, optimizer, is_world_process_zero.
    log_metrics, metrics_format, save_metrics, save_state = log_metrics, metrics_format, save_metrics, save_state
    get_learning_rates, get_num_trainable_parameters, get_optimizer_group = get_learning_rates, get_num_trainable_parameters, get_optimizer_group

    @property
    def processing_class(self):
        """TRL's `trainer.processing_class`: the tokenizer completions are encoded and decoded with (for tools, the one that parses them)."""
        return self.tokenizer

    @property
    def lr_scheduler(self):
        """Trainer's `trainer.lr_scheduler`: the learning-rate schedule the optimizer steps follow."""
        return self.scheduler

    @property
    def model_wrapped(self):
        """Trainer's `trainer.model_wrapped`: the policy as accelerate prepared it (DDP-wrapped on several processes)."""
        return self.model

    @property
    def callback_handler(self):
        """Trainer's `trainer.callback_handler` (a transformers `CallbackHandler`)."""
        return self.events.handler

    @property
    def control(self):
        """Trainer's `trainer.control`: the `TrainerControl` callbacks set (should_training_stop, should_save, …)."""
        return self.events.control

    @property
    def num_generations_eval(self) -> int:
        """TRL's `trainer.num_generations_eval`: completions per prompt in evaluation (args', else G)."""
        return self.args.num_generations_eval or self.args.num_generations

    @property
    def reward_func_names(self) -> list[str]:
        """TRL's `trainer.reward_func_names`: each reward's name, in reward_funcs' order, as logged under rewards/<name>/
        (a function's __name__, a reward model's folder or repository name, an environment class that owns its reward)."""
        return self.reward_names

    @property
    def epsilon_low(self) -> float:
        """TRL's `trainer.epsilon_low`: ε, the clip's lower bound (1 − ε)."""
        return self.args.epsilon

    def is_world_process_zero(self) -> bool:
        """Trainer's: whether this is the main process of all machines (the one that writes files)."""
        return self.accelerator.is_main_process

    def is_local_process_zero(self) -> bool:
        """Trainer's: whether this is the main process of this machine."""
        return self.accelerator.is_local_main_process

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer's `log`: a record of the caller's values at the current step, to state.log_history (with epoch and
        step), the callbacks' on_log and, once `train()` has begun, metrics.jsonl and the trackers (before that the
        folder is not yet this run's: a first write would make `train()` take it for another run's).
        A "step" key is the current step, as Trainer sets it; a 0-d tensor or numpy number is logged as its Python
        value. `start_time` is accepted and unused: Trainer adds throughput keys with it.

        As in TRL, the trainer logs through it (each logged step's record, each evaluation's metrics, the run's
        summary), so a subclass overriding `log` sees and may change every record. The summary (`train_runtime`, …)
        goes to the callbacks only: its steps' metrics are already in metrics.jsonl. With `log_completions`, each call
        then does what TRL's `log()` does with its completions (the latest generation batch, an evaluation's rows
        included): prints a sample, writes completions/completions_<step>.parquet, sends it to W&B and Trackio."""
        logs = {k: v.item() if hasattr(v, "item") and getattr(v, "ndim", 1) == 0 else v for k, v in logs.items() if k != "step"}
        if self.metrics_log is not None and self.events.started and "train_runtime" not in logs:
            self.metrics_log.write({"step": self.step, **logs})
        self.events.log(logs)
        if self.completion_tables is not None and self.events.started:  # then, as TRL's log(), its completions buffer
            self.completion_tables.at_log(self.step, self.args.num_completions_to_print)  # printed, written, sent (completion_tables.py)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags: str | list[str] | None = None) -> None:
        """TRL's `create_model_card`: write README.md, a model card, into output_dir (main process): the base model (its
        hub id; none for a model loaded from a local folder, fastgrpo's built-in ones among them, as TRL), the dataset, tags ("fastgrpo", "grpo" and yours), the run's G, μ, β, learning rate and steps, and GRPO's
        paper (Shao et al. 2024, arXiv 2402.03300). huggingface_hub renders its metadata.

        Raises:
            TypeError: tags that are neither a str nor a list of them.
        """
        if not self.is_world_process_zero():
            return
        a, base = self.args, self.accelerator.unwrap_model(self.model).config._name_or_path or None
        base = None if base and os.path.isdir(base) else base  # TRL's rule: a local folder is no hub model (the hub refuses it)
        if tags is not None and not isinstance(tags, (str, list, tuple)):
            raise TypeError(f"tags={tags!r}: give a tag (str) or a list of them.")
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        data = ModelCardData(base_model=base, datasets=[dataset_name] if dataset_name else None, library_name="transformers",
                             model_name=model_name, tags=["fastgrpo", "grpo", *tags])
        name = model_name or os.path.basename(os.path.abspath(a.output_dir))
        body = (f"# {name}\n\nFine-tuned{f' from {base}' if base else ''}{f' on {dataset_name}' if dataset_name else ''} with GRPO "
                f"([Shao et al. 2024](https://arxiv.org/abs/2402.03300)) by fastgrpo: G = {a.num_generations} completions per prompt, "
                f"μ = {a.num_iterations}, β = {a.beta}, learning rate {a.learning_rate}, {self.state.global_step} optimizer steps.\n")
        os.makedirs(a.output_dir, exist_ok=True)
        ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}").save(os.path.join(a.output_dir, "README.md"))

    def push_to_hub(self, commit_message: str = "End of training", blocking: bool = True, token: str | None = None,
                    revision: str | None = None, **kwargs):
        """Trainer's `push_to_hub`: save the model and a model card to output_dir, then upload the folder (checkpoints
        left out) to the hub repo `args.hub_model_id` (default: output_dir's name), created if missing, with
        huggingface_hub. `kwargs` go to `create_model_card`. Returns the commit's info (a future with blocking=False;
        None on other processes).

        Raises:
            huggingface_hub's errors, e.g. `OfflineModeIsEnabled` with HF_HUB_OFFLINE=1, or an authentication error without
            a token (`hf auth login`, or token=…): the model is saved in output_dir before any of them.
        """
        a = self.args
        self.save_model()
        if not self.is_world_process_zero():
            return None
        self.create_model_card(**kwargs)
        token = token or a.hub_token
        repo = create_repo(a.hub_model_id or os.path.basename(os.path.abspath(a.output_dir)), token=token,
                           private=a.hub_private_repo, exist_ok=True).repo_id
        return upload_folder(repo_id=repo, folder_path=a.output_dir, commit_message=commit_message, token=token, revision=revision,
                             run_as_future=not blocking, ignore_patterns=["_*", "checkpoint-*/**"])

    def end(self) -> None:
        """Trainer's `end` (transformers ≥ 5.18; TRL's scripts call it last): finish the trackers and end the process
        group. Call it once, after everything that needs the other processes (train, evaluate, save_model)."""
        self.accelerator.end_training()

    @property
    def entropy_coef(self) -> float:
        """TRL's `trainer.entropy_coef`: the entropy bonus's current coefficient c (adaptive: as it has moved); 0.0 when off."""
        control = self.entropy_control  # None: no bonus
        return control.coef if control is not None else 0.0

    @property
    def aux_loss_enabled(self) -> bool:
        """TRL's `trainer.aux_loss_enabled`: a mixture-of-experts policy whose load-balancing loss is added (model/experts.py)."""
        return self.router.enabled

    @property
    def router_aux_loss_coef(self) -> float:
        """TRL's `trainer.router_aux_loss_coef`: the aux loss's weight (GRPOConfig's, else the model config's, else 0.0)."""
        return self.router.coef

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """TRL's method: (B, T) bool, active tokens whose entropy is ≥ the `threshold` quantile (in [0, 1]) of the
        active tokens of this micro-batch on all processes, as if one process held them all.

        Args:
            entropies: (B, T) float, per-token entropy of the policy (nats).
            mask: (B, T) 0/1, the tokens that count.
            threshold: the quantile, 1 − top_entropy_quantile (TRL's argument).
        Source: Wang et al. 2025, "Beyond the 80/20 rule" (arXiv 2506.01939); TRL's `get_high_entropy_mask`.
        """
        acc = self.accelerator
        active = entropies[mask.bool()].float()
        if acc.num_processes > 1:  # -1: padding sentinel, entropies are ≥ 0
            active = acc.gather(acc.pad_across_processes(active, dim=0, pad_index=-1.0))
            active = active[active >= 0]
        return high_entropy_mask(entropies, mask, entropy_threshold(active, 1 - threshold)).bool()

    def add_callback(self, callback) -> None:
        """Add a `transformers.TrainerCallback` (instance or class), as `Trainer.add_callback`."""
        self.events.add(callback)

    def pop_callback(self, callback):
        """Remove and return a callback (instance or class), as `Trainer.pop_callback`."""
        return self.events.handler.pop_callback(callback)

    def remove_callback(self, callback) -> None:
        """Remove a callback (instance or class), as `Trainer.remove_callback`."""
        self.events.handler.remove_callback(callback)

    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> dict:
        """Mean reward of num_generations_eval (default G) sampled completions per eval prompt (each process scores its share).

        Args (Trainer's, in its order):
            eval_dataset: rows; a dict / DatasetDict of them (as Trainer's: one record and on_evaluate per set, prefixed
                `<prefix>_<name>_`; all returned); the name of one of the trainer's (alone, `<prefix>_`); default: the trainer's.
            ignore_keys: accepted and unused, as `predict`'s (no model outputs are gathered).
            metric_key_prefix: "eval" gives eval_reward and eval_rewards/<fn>/mean (TRL's naming).
        Returns:
            TRL's eval keys (run/evaluation.mean_rewards): "<prefix>_loss" (TRL's eval-mode loss, ρ = 1;
            OptimizerStep.eval_loss), "<prefix>_reward", "_reward_std", "_rewards/<fn>/mean" and "/std",
            "_completions/*", "_entropy", "_clip_ratio/*", "_runtime", "_samples_per_second", …,
            "_model_preparation_time" (transformers': seconds accelerate's prepare took, here when the trainer was built), and "epoch".
        The record goes to state.log_history and the callbacks, and to metrics.jsonl once `train()` has begun (an
        evaluation before it is not written there, as `log`'s: output_dir is not yet this run's, and a first write made
        `train()` refuse the folder as another run's, or landed in a previous run's log).

        Raises:
            ValueError, TypeError: no eval dataset here or in the trainer (a callback's `control.should_evaluate` too, as Trainer),
                one evaluation cannot read or the rewards cannot score (`inputs.checked_eval_sets`), before anything is sampled.
            KeyError: a name the trainer's eval_dataset does not have.
        """
        eval_dataset = named_eval_set(self.eval_sets, eval_dataset) if isinstance(eval_dataset, str) else eval_dataset
        sets = checked_eval_sets(eval_dataset, self.reward_funcs, self.reward_names, self.agents) if eval_dataset is not None else self.eval_sets
        if sets is None:
            raise ValueError("evaluation requires an eval_dataset (a callback's control.should_evaluate in train() too, as in transformers' "
                             "Trainer): pass one to evaluate(), to GRPOTrainer, or set trainer.eval_dataset = rows.")
        if list(sets) != ["eval"]:  # a dict: Trainer's evaluate calls itself per set (by name for its own sets), each logged alone
            metrics = {}
            for name, rows in ((set_name[len("eval_"):], rows) for set_name, rows in sets.items()):
                metrics.update(self.evaluate(rows if eval_dataset is not None else name, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        metrics = self._sampled_metrics(sets, metric_key_prefix)
        metrics[f"{metric_key_prefix}_num_tokens"] = float(self.state.num_input_tokens_seen)  # TRL's: the training count (eval adds none)
        metrics[f"{metric_key_prefix}_model_preparation_time"] = self.model_preparation_time  # the model was prepared when the trainer was built
        metrics["epoch"] = self.state.epoch  # Trainer's evaluate returns it (its log() adds it to the same dict)
        self.log(metrics)  # Trainer's evaluate logs through log() (metrics.jsonl once train() has made output_dir this run's)
        self.events.evaluate(metrics)
        return metrics

    @torch.no_grad()
    def predict(self, test_dataset, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test") -> PredictionOutput:
        """Trainer's `predict` as TRL's GRPOTrainer runs it: its evaluation over `test_dataset`, returned as a
        `PredictionOutput` with predictions=None and label_ids=None (TRL's prediction_step returns the loss alone) and
        the metrics prefixed `metric_key_prefix`; nothing is logged, and the callbacks get on_prediction_step per batch
        and on_predict, as in Trainer.

        The metrics are TRL's: "<prefix>_loss", "_model_preparation_time", "_runtime", "_samples_per_second" and
        "_steps_per_second", with evaluate()'s GRPO metrics (reward, rewards/<fn>/*, completions/*, …) under the same
        prefix, which TRL computes too but holds back (they surface in its next log() record, as eval_*).
        `ignore_keys` is accepted and unused (no model outputs are gathered).

        Raises:
            ValueError, TypeError: a dataset of a kind evaluation cannot read, or the reward functions cannot score (`evaluate`'s).
        """
        sets = checked_eval_sets(test_dataset, self.reward_funcs, self.reward_names, self.agents)  # as the trainer's eval sets at build
        metrics = self._sampled_metrics(sets, metric_key_prefix)
        for set_name in sets:
            metrics[f"{metric_key_prefix}{set_name[len('eval'):]}_model_preparation_time"] = self.model_preparation_time
        self.events.predict(metrics)
        return PredictionOutput(predictions=None, label_ids=None, metrics=metrics)

    def _sampled_metrics(self, sets: dict, metric_key_prefix: str) -> dict:
        """evaluate()'s and predict()'s metrics for `sets` (dataset_kinds.eval_sets), from the current weights."""
        G, batches = self.num_generations_eval, []

        def sample(rows, timer):  # with log_completions its completions kept, for TRL's completions buffer
            rollout, extra = self._eval_batch(rows, G, timer)
            batches.extend([CompletionRows.of(rollout, extra)] if self.args.log_completions else [])
            return rollout, extra

        with self.rollouts.paused():  # the overlap's producer samples and scores through the same parts: not meanwhile
            self._sync_weights()
            metrics = mean_rewards(sets, metric_key_prefix, sample, reward_names=self.reward_names, reward_weights=self.reward_weights,
                                   num_generations=G, batch_size=self.args.per_device_eval_batch_size, accelerator=self.accelerator,
                                   on_batch=self.events.prediction_step, loss=self.update.eval_loss, into=self.reward_hooks.into,
                                   on_set=lambda rows: self.events.eval_loader(eval_dataloader(  # the callbacks' eval_dataloader: get_eval_dataloader's
                                       rows, self.args.per_device_eval_batch_size, G, self.accelerator.process_index, self.accelerator.num_processes, self.data_collator)))
        rows = gathered(batches, self.accelerator) if self.args.log_completions else []  # collective: every process
        if self.completion_tables is not None:  # TRL appends an evaluation's completions to its buffer too
            self.completion_tables.add(rows)
        return metrics

    def get_train_dataloader(self):
        """TRL's `get_train_dataloader`: a `torch.utils.data.DataLoader` of the training batches, in TRL's layout (its
        `RepeatSampler`'s): this process's share of each rollout's prompts, each row num_generations times in a row, each
        batch yielded num_iterations × steps_per_generation times; one pass over the data per iteration (`len()`: its
        batches; a stream's has none). fastgrpo's loop draws its rows itself and never iterates a DataLoader, so this one
        replays the trainer's own draw order from the run's start (run/dataloaders.py): the same prompts, in the order
        and batches train() samples them (DAPO's filter_groups draws further prompts to refill a round). In the first
        pass that is TRL's order for the same seed; later passes are fastgrpo's (each pass its own seeded permutation).
        """
        return train_dataloader(self.train_dataset, self.args, self.accelerator.process_index, self.accelerator.num_processes, self.data_collator)

    def get_eval_dataloader(self, eval_dataset=None):
        """TRL's `get_eval_dataloader`: a DataLoader of the batches `evaluate()` samples from an eval set: this process's
        rows (every processes-th, in the set's order, where TRL's shuffles: the metrics are the same means), each
        num_generations_eval times in a row, per_device_eval_batch_size // G prompts a batch (run/dataloaders.py).

        Args:
            eval_dataset: rows, or (TRL's) the name of one set of the trainer's dict eval_dataset; default the trainer's.
        Raises:
            ValueError: no eval dataset, or several (a dict) without the name of one; a dataset evaluation cannot read.
            KeyError: a name the trainer's eval_dataset does not have.
        """
        return self.get_test_dataloader(named_eval_set(self.eval_sets, eval_dataset) if isinstance(eval_dataset, str) else eval_dataset)

    def get_test_dataloader(self, test_dataset):
        """Trainer's `get_test_dataloader`: the batches `predict(test_dataset)` samples, as `get_eval_dataloader`'s.

        Raises:
            ValueError: no dataset (None without the trainer's eval_dataset), several (a dict), or one evaluation cannot read.
        """
        sets = eval_sets(test_dataset) if test_dataset is not None else self.eval_sets
        if sets is None or list(sets) != ["eval"]:
            raise ValueError("a dataloader needs one eval dataset: " + ("pass one, or give GRPOTrainer an eval_dataset." if sets is None else
                             f"this is a dict of {len(sets)} sets; pass one of them, or its name: get_eval_dataloader('name')."))
        return eval_dataloader(sets["eval"], self.args.per_device_eval_batch_size, self.num_generations_eval,
                               self.accelerator.process_index, self.accelerator.num_processes, self.data_collator)

    def create_optimizer(self, model=None):
        """Trainer's `create_optimizer`: the trainer's optimizer. fastgrpo builds it when the trainer is built (yours from
        `optimizers`, else args.optim's), and Trainer's returns the optimizer it already has."""
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """Trainer's `create_scheduler`: the trainer's learning-rate schedule (`lr_scheduler`), built with the trainer;
        Trainer's returns the one it already has."""
        return self.scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """Trainer's `create_optimizer_and_scheduler`: both exist from the trainer's build, so nothing is made (Trainer's
        returns None, as here)."""

    def _eval_batch(self, rows: list[dict], G: int, timer):
        """An eval batch as TRL's `_prepare_inputs` makes it in eval mode: sampled, scored, its Â over its own groups
        of G (scale_rewards "batch": over this process's batch), π_ref's log-probs for the k3 KL."""
        a = self.args
        rollout, extra = self.assembly.score_rows(rows, G, timer)
        advantages = rollout_advantages(rollout.rewards.to(self.reward_weights.device), self.reward_weights, G, a.scale_rewards,
                                        a.multi_objective_aggregation, gather=lambda values: values)
        rollout = dataclasses.replace(rollout, advantages=advantages)
        return dataclasses.replace(rollout, ref_logps=self.passes.ref(rollout, [slice(0, len(rollout))])), extra  # one pass, as eval_loss's

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False, *, merge_adapters: bool = False) -> None:
        """Save the policy (safetensors), tokenizer and args (training_args.bin, as Trainer saves them) to `output_dir`
        (default args.output_dir); the main process writes. As Trainer's, collective only under FSDP (every process
        joins the gather); without it an override may call it on the main process alone. Trainer's signature: a subclass's
        override is also called for each checkpoint, with the checkpoint's folder and `_internal_call=True`, as
        Trainer._save_checkpoint calls it (fastgrpo's own checkpoint files are written first).

        With adapters it writes them alone (`adapter_model.safetensors`, loadable with
        `peft.PeftModel.from_pretrained`), or with `merge_adapters=True` the base
        weights with the adapters merged in (loadable with `from_pretrained`).

        Raises:
            ValueError: merge_adapters=True for a policy without adapters; an `output_dir` that is a file or not writable.
        """
        checkpoints.save_model(self.accelerator, self.model, self.tokenizer, self.args, output_dir or self.args.output_dir, merge_adapters)


TRL_ARGS_ATTRIBUTES = (  # attributes TRL 1.16's GRPOTrainer copies from its args in __init__ (user code and rollout_funcs read them)
    "max_completion_length", "num_generations", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "pad_to_multiple_of", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size",
    "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "loss_type", "multi_objective_aggregation", "scale_rewards", "importance_sampling_level",
    "off_policy_mask_threshold", "mask_truncated_completions", "top_entropy_quantile", "use_adaptive_entropy", "shuffle_dataset",
    "num_iterations", "beta", "log_completions", "num_completions_to_print", "log_unique_prompts",
    "epsilon_high",  # GRPOConfig fills it in as TRL does: ε, or 5.0 for cispo
    "log_multimodal", "use_transformers_continuous_batching",  # accepted TRL fields (config/trl_fields.py): the values given
)
# the ones TRL fills in when args leave them None: what TRL's __init__ sets (a rollout_func's range(…) or **kwargs works)
TRL_ARGS_FILLED = {
    "max_tool_calling_iterations": lambda value: sys.maxsize if value is None else value,  # None: no limit
    "chat_template_kwargs": lambda value: value or {},
}


def _args_attribute(name: str, filled=lambda value: value) -> property:
    return read_only(name, lambda self: filled(getattr(self.args, name)), f"TRL's `trainer.{name}`: the run's `args.{name}` (read-only).",
                     f"fastgrpo reads {name} from the run's config once, when the trainer is built, so setting it here would change "
                     f"nothing; give GRPOConfig({name}=…) to a new trainer.")


for _name in TRL_ARGS_ATTRIBUTES:
    setattr(TRLMethods, _name, _args_attribute(_name))
for _name, _filled in TRL_ARGS_FILLED.items():
    setattr(TRLMethods, _name, _args_attribute(_name, _filled))
