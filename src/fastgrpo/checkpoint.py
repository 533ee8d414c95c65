"""Checkpoints: write-then-rename, prune, find the latest, load.

A checkpoint folder `checkpoint-<step>` holds the model (safetensors, loadable
with `from_pretrained`; for a LoRA policy the adapters alone, loadable with
`peft.PeftModel.from_pretrained`) and tokenizer, `trainer_state.pt` (optimizer,
scheduler, step, data position), and per process `rng_state_<rank>.pt` and
`process_state_<rank>.pt` (that process's own share of the state: the rollout
in use when saved inside a reuse window). It is written under a
temporary name and renamed into place, so a crash mid-save never leaves a
half checkpoint that resume would pick, and the last good one is never touched.

Resume rule (DESIGN.md): a checkpoint saved inside a rollout's reuse window
carries that rollout (tokens, advantages, π_old/π_ref log-probs) and how many
of its optimizer steps were done; resuming continues the same rollout from
the next step. One saved at the end of a window carries none, and resuming
generates a new rollout. A rollout with no step left is never trained on.
"""

from __future__ import annotations

import os
import random
import re
import shutil

import numpy as np
import torch
from safetensors.torch import load_file

from .models import is_peft_model, load_adapters

PREFIX = "checkpoint-"


def rng_state() -> dict:
    """This process's random states (python, numpy, torch CPU and CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    output_dir: str, step: int, accelerator, model, tokenizer, trainer_state: dict, save_total_limit: int | None,
    process_state: dict | None = None,
) -> str:
    """Write `output_dir/checkpoint-<step>` atomically; every process must call it.

    Args:
        trainer_state: what every process shares (optimizer/scheduler state
            dicts, step, data position) — anything `torch.save` takes; the
            main process writes it.
        save_total_limit: keep at most this many checkpoints (oldest pruned), None = all.
        process_state: this process's own entries (its share of the rollout),
            written by each process and merged into the trainer state on load.
    Returns:
        The checkpoint's path.
    """
    final = os.path.join(output_dir, f"{PREFIX}{step}")
    tmp = os.path.join(output_dir, f".tmp-{PREFIX}{step}")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    accelerator.wait_for_everyone()
    torch.save(rng_state(), os.path.join(tmp, f"rng_state_{accelerator.process_index}.pt"))
    torch.save(process_state or {}, os.path.join(tmp, f"process_state_{accelerator.process_index}.pt"))
    state_dict = accelerator.get_state_dict(model)  # gathers shards under FSDP/DeepSpeed
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)  # only when re-saving the same step
        os.replace(tmp, final)
        prune(output_dir, save_total_limit)
    accelerator.wait_for_everyone()
    return final


def checkpoints(output_dir: str) -> list[str]:
    """Complete checkpoint folders in `output_dir`, oldest step first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), name) for name in os.listdir(output_dir) if (m := re.fullmatch(PREFIX + r"(\d+)", name))]
    return [os.path.join(output_dir, name) for _, name in sorted(found)]


def prune(output_dir: str, save_total_limit: int | None) -> None:
    """Delete the oldest checkpoints beyond `save_total_limit`."""
    if save_total_limit is None:
        return
    for path in checkpoints(output_dir)[:-save_total_limit]:
        shutil.rmtree(path, ignore_errors=True)


def resolve_checkpoint(resume_from_checkpoint, output_dir: str) -> str | None:
    """The folder to resume from: None/False → none, True → latest in output_dir, str → that path.

    Raises:
        ValueError: True with no checkpoint in output_dir, or a path that is not a checkpoint.
    """
    if resume_from_checkpoint in (None, False):
        return None
    if resume_from_checkpoint is True:
        found = checkpoints(output_dir)
        if not found:
            raise ValueError(f"resume_from_checkpoint=True but {output_dir!r} holds no checkpoint-<step> folder; train without it first.")
        return found[-1]
    path = str(resume_from_checkpoint)
    if not os.path.isfile(os.path.join(path, "trainer_state.pt")):
        raise ValueError(f"{path!r} is not a fastgrpo checkpoint (no trainer_state.pt); give a checkpoint-<step> folder or True.")
    return path


def load_checkpoint(path: str, accelerator, model) -> dict:
    """Load weights into `model` and this process's RNG state; return the trainer state with this process's entries.

    Resumed on another number of processes than saved it, the per-process
    files no longer fit: every process keeps its freshly seeded RNG and gets
    no process entries (so the trainer generates a new rollout).
    """
    if is_peft_model(accelerator.unwrap_model(model)):  # adapters only: the base weights never change
        load_adapters(accelerator.unwrap_model(model), path)
    else:
        weights = load_file(os.path.join(path, "model.safetensors"))
        missing, unexpected = accelerator.unwrap_model(model).load_state_dict(weights, strict=False)
        tied = set(getattr(accelerator.unwrap_model(model), "_tied_weights_keys", None) or [])
        if unexpected or [k for k in missing if k not in tied]:
            raise ValueError(f"checkpoint {path!r} does not fit this model (missing {missing[:3]}, unexpected {unexpected[:3]}).")
    state = torch.load(os.path.join(path, "trainer_state.pt"), weights_only=False)
    saved_by = len([name for name in os.listdir(path) if re.fullmatch(r"rng_state_\d+\.pt", name)])
    if saved_by == accelerator.num_processes:
        rank = accelerator.process_index
        set_rng_state(torch.load(os.path.join(path, f"rng_state_{rank}.pt"), weights_only=False))
        state.update(torch.load(os.path.join(path, f"process_state_{rank}.pt"), weights_only=False))  # on the device it left
    return state
