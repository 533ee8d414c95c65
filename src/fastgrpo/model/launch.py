"""How this process was launched: the two facts accelerate does not work out for us.

fastgrpo runs under `torchrun` and `accelerate launch` with no code of its own
for distribution (docs/distributed.md). Two launcher details need a look at
the environment before the `Accelerator` is built:

- On a machine without GPUs, accelerate joins torchrun's processes into one
  gloo group only when asked for the CPU; otherwise every process believes it
  is alone. `cpu_only()` (config/training_args.py, where GRPOConfig's `device`
  asks it too) says when to ask.
- `accelerate launch --cpu --num_processes N` starts several CPU processes
  only through mpirun; without it, it runs the script once. `cpu_launch_error()`
  refuses that run, which would otherwise train on one process unnoticed.
- A DeepSpeed config file for a CPU run (no GPUs, or use_cpu=True): accelerate then ignores it
  (the run would be plain DDP); `cpu_launch_error()` refuses it too.

Not here: anything that communicates (accelerate and torch.distributed do).
"""

from __future__ import annotations

import os

from ..config.training_args import cpu_only

# Variables a launcher sets in every process it starts (torchrun, MPI implementations).
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def cpu_launch_error(cpu: bool) -> str | None:
    """A message when `accelerate launch --cpu --num_processes N>1` started this as its only process, or a
    DeepSpeed config launched for a CPU run (`cpu`: use_cpu=True, or a machine without GPUs); else None.

    accelerate marks that request by setting ACCELERATE_USE_CPU and MASTER_ADDR
    for the one process it starts, without any world size.
    """
    env = os.environ
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and cpu:
        return (
            "a DeepSpeed launch for a run on CPUs (use_cpu=True, or no GPUs): accelerate ignores the DeepSpeed config on CPUs (the run "
            "would be plain DDP) and fastgrpo's DeepSpeed path is untested; on CPUs shard with FSDP2 "
            "(accelerate launch --config_file examples/accelerate/fsdp.yaml) or launch without the DeepSpeed file."
        )
    asked_cpu = env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    if not asked_cpu or "MASTER_ADDR" not in env or any(name in env for name in WORLD_SIZE_VARIABLES):
        return None
    return (
        "`accelerate launch --cpu --num_processes N` started only this one process (accelerate starts several CPU "
        "processes only through mpirun); launch with `accelerate launch --multi_gpu --num_processes N` (it runs on "
        "CPUs too: fastgrpo then uses gloo) or `torchrun --nproc_per_node N`, or drop --num_processes for one process."
    )
