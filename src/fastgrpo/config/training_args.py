"""`transformers.TrainingArguments`' methods and properties that TRL scripts call on their config, for `GRPOConfig`.

TRL's example scripts (`trl.scripts.grpo`), open-r1's and the Hugging Face examples call these on the
config before a trainer exists: `with training_args.main_process_first(desc=...): ds = ds.map(...)`,
`logger.setLevel(training_args.get_process_log_level())`, `training_args.device`, `.process_index`, … Each
has transformers 5.19's meaning, read from accelerate's `PartialState` (the process group accelerate sets up,
which the run's `Accelerator` then shares), never from fastgrpo's own distributed code:

- the state is made with `cpu=use_cpu or cpu_only()`, the rule run/setup.py builds the run's `Accelerator`
  with, so the state a script touches first is the one the run trains in;
- one device per process: `n_gpu` is 0 on the CPU and 1 otherwise (transformers' value in any distributed
  run; its single-process `torch.nn.DataParallel` over several GPUs, where n_gpu > 1, is not fastgrpo's);
- `world_size` is GRPOConfig's own field (the launcher's WORLD_SIZE, the number accelerate reads too).

torch, accelerate and transformers are imported inside each method, so building a config stays light.

Not here: the fields (grpo_config.py, trl_fields.py).
"""

from __future__ import annotations

import contextlib
import json


def cpu_only() -> bool:
    """True on a machine without an accelerator device (CUDA, XPU, NPU, MPS, …)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return not (accelerator.is_available() if accelerator is not None else torch.cuda.is_available())


class TrainingArgumentsMethods:
    """TrainingArguments' process, device, logging and serialisation helpers, over accelerate's `PartialState`.

    Mixed into GRPOConfig; reads its `use_cpu`, `per_device_*_batch_size`, `log_on_each_node`,
    `save_on_each_node`, `log_level`, `log_level_replica` and `to_dict()`.
    """

    @property
    def distributed_state(self):
        """accelerate's `PartialState` of this process (made on first use, then shared with the run's `Accelerator`)."""
        from accelerate import PartialState

        return PartialState(cpu=self.use_cpu or cpu_only())

    @property
    def device(self):
        """The `torch.device` this process trains on: cpu with use_cpu=True or without GPUs, else its accelerator device."""
        return self.distributed_state.device

    @property
    def n_gpu(self) -> int:
        """GPUs this process uses: 0 on the CPU, else 1 (transformers' value in a distributed run; no DataParallel here)."""
        return 0 if self.device.type == "cpu" else 1

    @property
    def process_index(self) -> int:
        """This process's rank among all processes (0 in a single-process run)."""
        return self.distributed_state.process_index

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine (0 in a single-process run)."""
        return self.distributed_state.local_process_index

    @property
    def parallel_mode(self):
        """transformers' `ParallelMode`: DISTRIBUTED when several processes run (accelerate's distributed_type), else NOT_PARALLEL."""
        from accelerate.utils import DistributedType
        from transformers.training_args import ParallelMode

        return ParallelMode.DISTRIBUTED if self.distributed_state.distributed_type != DistributedType.NO else ParallelMode.NOT_PARALLEL

    @property
    def train_batch_size(self) -> int:
        """per_device_train_batch_size × max(1, n_gpu), TrainingArguments' rule (completions per micro-batch here)."""
        return self.per_device_train_batch_size * max(1, self.n_gpu)

    @property
    def eval_batch_size(self) -> int:
        """per_device_eval_batch_size × max(1, n_gpu), TrainingArguments' rule."""
        return self.per_device_eval_batch_size * max(1, self.n_gpu)

    @property
    def should_log(self) -> bool:
        """Whether this process logs: the main process of each node with log_on_each_node (TRL's default), else of all."""
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes to disk: the main process (save_on_each_node=True is refused by GRPOConfig)."""
        return (self.local_process_index if self.save_on_each_node else self.process_index) == 0

    def get_process_log_level(self) -> int:
        """The `logging` level for this process, TrainingArguments' rule: log_level on a process that logs
        (`should_log`), log_level_replica elsewhere; "passive" leaves transformers' current verbosity."""
        from transformers.training_args import trainer_log_levels
        from transformers.utils import logging

        level = trainer_log_levels[self.log_level if self.should_log else self.log_level_replica]
        return logging.get_verbosity() if level == -1 else level

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work"):
        """Run the block on the main process first, then on the others (TrainingArguments': e.g. a `datasets.map`
        whose cache the others then read). `local`: the main process of each machine; else of all. `desc` is
        accepted for TrainingArguments' signature (it names the work in its debug logs)."""
        state = self.distributed_state
        with state.local_main_process_first() if local else state.main_process_first():
            yield

    def to_json_string(self) -> str:
        """`to_dict()` as indented JSON, as TrainingArguments.to_json_string (a torch dtype, e.g. in model_init_kwargs, as
        its name: "bfloat16", as transformers writes dtypes)."""
        return json.dumps(self.to_dict(), indent=2, default=lambda v: str(v).removeprefix("torch."))

    def to_sanitized_dict(self) -> dict:
        """`to_dict()` plus train_batch_size and eval_batch_size, every value not a bool, int, float or str as its
        `str()` (TrainingArguments' form for TensorBoard's hparams)."""
        d = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in d.items()}
