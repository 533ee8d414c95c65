"""Checkpoints: write-then-rename, prune, find the latest, load.

A checkpoint folder `checkpoint-<step>` holds the model (safetensors, loadable with `from_pretrained`; for a LoRA
policy the adapters alone, loadable with `peft.PeftModel.from_pretrained`) and tokenizer, `trainer_state.pt`
(optimizer, scheduler, step, data position), `training_args.bin` (the GRPOConfig, as Trainer saves it), and per
process `rng_state_<rank>.pt` and `process_state_<rank>.pt` (that process's own share of the state: the rollout in use
when saved inside a reuse window), and last `manifest.json` (step, the run's id, every file's size in bytes and
CRC-32). A sharded (FSDP) policy's checkpoint holds, instead of the model file and the optimizer in
`trainer_state.pt`, the trainable weights' and the optimizer's shards (torch.distributed.checkpoint: `.metadata` and
`__<rank>_0.distcp` per process) and `config.json`; it resumes on any number of processes, sharded or not (the shards
are re-cut on load); `save_model` writes the whole model. A checkpoint is written under a temporary name and renamed
into place (a crash mid-save never leaves a half checkpoint, the last good one is never touched; a failed write removes
it and names the checkpoint). A subclass's `save_model` is also called for each checkpoint, into the temporary folder
`.tmp-checkpoint-N/checkpoint-N` (Trainer._save_checkpoint's call and name; what it writes is in the manifest).
On load the manifest is checked first and every file is read before anything is applied, so a corrupt
checkpoint is refused by name and file, and `resume_from_checkpoint=True` falls back to the newest one that loads.
Pruning (`save_total_limit`) only touches checkpoints of the same run id and follows transformers'
`rotate_checkpoints`: the newest checkpoint and `state.best_model_checkpoint` are never deleted.

Resume rule (docs/design.md): a checkpoint saved inside a rollout's reuse window carries that rollout (tokens,
advantages, π_old/π_ref log-probs) and how many of its optimizer steps were done; resuming continues the same rollout
from the next step. One saved at the end of a window carries none, and resuming generates a new rollout. A rollout
with no step left is never trained on.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import warnings
import zlib

import numpy as np
import torch
from safetensors.torch import load_file

from ..model.adapters import adapter_file, load_adapters
from ..model.loading import is_peft_model
from ..model.sharding import is_sharded, load_sharded, save_sharded

# Classes a checkpoint pickles, by the module path of the code that wrote it → where they live now (issue 27's
# layout moved them; their fields did not change). A checkpoint written before the move still loads.
MOVED_CLASSES = {
    ("fastgrpo.rollout", "Rollout"): ("fastgrpo.rollout.record", "Rollout"),
    ("fastgrpo.metrics", "Window"): ("fastgrpo.run.metrics", "Window"),
    ("fastgrpo.metrics", "CompletionRows"): ("fastgrpo.run.metrics", "CompletionRows"),
}


class _Unpickler(pickle.Unpickler):
    """pickle's Unpickler reading `MOVED_CLASSES` at their new homes."""

    def find_class(self, module: str, name: str):
        return super().find_class(*MOVED_CLASSES.get((module, name), (module, name)))


class _MovedClasses:
    """A `pickle_module` for torch.load: pickle itself, with `_Unpickler`."""

    Unpickler = _Unpickler
    load = staticmethod(pickle.load)
    __name__ = "pickle"

PREFIX = "checkpoint-"
MANIFEST = "manifest.json"
TRAINING_ARGS_NAME = "training_args.bin"  # transformers' name: the run's arguments, torch.save'd beside a saved model
SHARDS_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded checkpoint's files


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions); the temporary folder is gone."""


class CorruptCheckpointError(ValueError):
    """A checkpoint folder that is incomplete or whose files cannot be read."""


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
    output_dir: str, step: int, accelerator, model, tokenizer, args, trainer_state: dict, process_state: dict | None = None, run_id: str = "",
    optimizer=None, write_more=None,
) -> str:
    """Write `output_dir/checkpoint-<step>` atomically; every process must call it.

    Args:
        args: the run's GRPOConfig, written as training_args.bin (Trainer's file; `torch.load(…, weights_only=False)`).
        trainer_state: what every process shares (optimizer/scheduler state dicts, step, data position) — anything
            `torch.save` takes; the main process writes it.
        process_state: this process's own entries (its share of the rollout), written by each process and merged
            into the trainer state on load.
        run_id: the run's id, written to the manifest; `prune` only touches checkpoints with the same id.
        optimizer: for a sharded `model`, the optimizer whose shards are written with the weights' (trainer_state then
            holds no optimizer state).
        write_more: called by every process with the folder after fastgrpo's files and before the manifest (a subclass's
            `save_model`, which Trainer._save_checkpoint calls for each checkpoint); what it writes is in the manifest.
    Returns:
        The checkpoint's path.
    Raises:
        CheckpointWriteError: a write failed (e.g. disk full), naming the checkpoint; its temporary folder is removed.
    """
    final = os.path.join(output_dir, f"{PREFIX}{step}")
    parent = os.path.join(output_dir, f".tmp-{PREFIX}{step}")
    tmp = os.path.join(parent, f"{PREFIX}{step}")  # named as the checkpoint: a subclass's save_model sees Trainer's folder name
    try:
        if accelerator.is_main_process:
            shutil.rmtree(parent, ignore_errors=True)
            os.makedirs(tmp)
        accelerator.wait_for_everyone()
        torch.save(rng_state(), os.path.join(tmp, f"rng_state_{accelerator.process_index}.pt"))
        torch.save(process_state or {}, os.path.join(tmp, f"process_state_{accelerator.process_index}.pt"))
        unwrapped = accelerator.unwrap_model(model)
        if is_sharded(model):  # every process writes its shards: nothing whole is gathered
            save_sharded(tmp, unwrapped, getattr(optimizer, "optimizer", optimizer))
        else:
            state_dict = accelerator.get_state_dict(model)  # gathers shards under DeepSpeed ZeRO-3
        if accelerator.is_main_process:
            if is_sharded(model):
                unwrapped.config.save_pretrained(tmp)
            else:
                unwrapped.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
            torch.save(args, os.path.join(tmp, TRAINING_ARGS_NAME))
        if write_more is not None:
            write_more(tmp)
        if accelerator.is_main_process:
            make_readable(tmp)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            write_manifest(tmp, step, run_id)  # last: its presence says every file above was written
            shutil.rmtree(final, ignore_errors=True)  # only when re-saving the same step
            os.replace(tmp, final)
            os.rmdir(parent)
    except OSError as err:
        shutil.rmtree(parent, ignore_errors=True)
        last = checkpoints(output_dir)
        raise CheckpointWriteError(
            f"could not write checkpoint {final!r} ({err.strerror or err}); its temporary folder was removed and "
            f"{repr(last[-1]) + ' is untouched' if last else 'there is no earlier checkpoint'}. Free space, then resume with "
            "resume_from_checkpoint=True (fastgrpo train --resume)."
        ) from err
    except BaseException:  # a subclass's save_model that raised, an unpicklable value, Ctrl-C: no half folder left behind
        shutil.rmtree(parent, ignore_errors=True)
        raise
    return final


def make_readable(folder: str) -> None:
    """Give the files in `folder` the permissions of every other file the run writes (0666 less the umask).

    safetensors writes model.safetensors owner-only (0600) whatever the umask;
    saved models are meant to be read by others like the logs beside them.
    """
    umask = os.umask(0)
    os.umask(umask)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            os.chmod(path, 0o666 & ~umask)


def write_manifest(folder: str, step: int, run_id: str) -> None:
    """`manifest.json`: the step, the run id, and the size in bytes and CRC-32 of every other file in `folder`, those in
    its subfolders by relative path (never a folder's own size, which differs between file systems)."""
    files = {}
    for file in sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names):  # subfolders too
        if (relative := os.path.relpath(file, folder)) != MANIFEST and os.path.isfile(file):
            files[relative] = {"bytes": os.path.getsize(file), "crc32": file_crc32(file)}
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump({"step": step, "run_id": run_id, "files": files}, f, indent=1)


def file_crc32(path: str) -> str:
    """The file's CRC-32 (zlib's, as `crc32` tools print it: 8 hex digits), read in 16 MiB chunks (≈ 4 GB/s)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def read_manifest(path: str) -> dict:
    """The checkpoint's manifest, after checking every listed file is there with its size and its CRC-32.

    A manifest written before CRC-32s were recorded (a size per file) is checked by size alone.
    Raises:
        CorruptCheckpointError: no or unreadable manifest, or a missing, truncated or
            changed file (its CRC-32 differs: e.g. overwritten with other bytes of the same size),
            naming the checkpoint and the file.
    """
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise CorruptCheckpointError(f"checkpoint {path!r} is incomplete: {MANIFEST} cannot be read ({err}).") from None
    listed = {name: entry if isinstance(entry, dict) else {"bytes": entry} for name, entry in manifest["files"].items()}
    for name, entry in listed.items():  # sizes first: cheap, and a missing file is named before any is read
        file = os.path.join(path, name)
        if not os.path.exists(file):
            raise CorruptCheckpointError(f"checkpoint {path!r} is incomplete: {name} is missing.")
        if not os.path.isdir(file) and os.path.getsize(file) != entry["bytes"]:  # an older manifest's folder size: not checked
            raise CorruptCheckpointError(f"checkpoint {path!r} is corrupt: {name} holds {os.path.getsize(file)} bytes, the manifest says {entry['bytes']}.")
    for name, entry in listed.items():
        if "crc32" in entry and (crc := file_crc32(os.path.join(path, name))) != entry["crc32"]:
            raise CorruptCheckpointError(
                f"checkpoint {path!r} is corrupt: {name} has CRC-32 {crc}, the manifest says {entry['crc32']} (the file changed after it was saved)."
            )
    return manifest


def checkpoints(output_dir: str, run_id: str | None = None) -> list[str]:
    """Checkpoint folders in `output_dir`, oldest step first; with `run_id`, only that run's (by manifest)."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), name) for name in os.listdir(output_dir) if (m := re.fullmatch(PREFIX + r"(\d+)", name))]
    paths = [os.path.join(output_dir, name) for _, name in sorted(found)]
    return paths if run_id is None else [p for p in paths if _run_id(p) == run_id]


def later_checkpoints(output_dir: str, step: int) -> list[str]:
    """Checkpoint folders in `output_dir` of a step above `step`, oldest first (after a resume from an older one: the branch it left)."""
    return [p for p in checkpoints(output_dir) if int(os.path.basename(p)[len(PREFIX):]) > step]


def written_by_fastgrpo(path: str) -> bool:
    """Whether `path` is a checkpoint folder fastgrpo wrote (it has a manifest naming its run): only those are ever removed."""
    return os.path.isdir(path) and _run_id(path) is not None


def _run_id(path: str) -> str | None:
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            return json.load(f).get("run_id")
    except (OSError, ValueError):
        return None


def prune(output_dir: str, save_total_limit: int | None, run_id: str, best: str | None = None, at_end: bool = False,
          latest: str | None = None) -> None:
    """Delete this run's oldest checkpoints beyond `save_total_limit`, as transformers' `rotate_checkpoints` does.

    The newest checkpoint (for resuming) and `best` (`state.best_model_checkpoint`)
    are never deleted, so with a limit of 1 and a best that is not the newest two
    remain; `at_end` (after training) then keeps the best alone, as `Trainer.train`
    does with `save_total_limit=1`. Other runs' folders are never touched.

    Args:
        save_total_limit: checkpoints to keep; None or ≤ 0 keeps all (transformers' rule).
        run_id: the run whose checkpoints may be deleted (by manifest).
        best: the best checkpoint's path, or None.
        at_end: training has ended.
        latest: the checkpoint just saved, kept too: after a resume from an older checkpoint, the same run's
            higher steps (the branch it left) would otherwise rank newer and push it out.
    """
    found = [os.path.normpath(p) for p in checkpoints(output_dir, run_id)]
    if save_total_limit is None or save_total_limit <= 0 or not found:
        return
    best = os.path.normpath(best) if best is not None and os.path.normpath(best) in found else None
    protected = {found[-1], best, latest and os.path.normpath(latest)} - {None}
    if at_end and save_total_limit == 1 and best is not None:
        protected = {best}
    for path in [p for p in found if p not in protected][: max(len(found) - max(save_total_limit, len(protected)), 0)]:
        shutil.rmtree(path, ignore_errors=True)


def check_resume_target(resume_from_checkpoint, output_dir: str) -> None:
    """What `load_checkpoint` checks before it reads a file, cheap enough to run before the model loads (cli.train).

    Raises:
        ValueError: True with no checkpoint-<step> folder in output_dir; a path that is not a fastgrpo checkpoint.
    """
    if resume_from_checkpoint in (None, False):
        return
    if resume_from_checkpoint is True:
        if not checkpoints(output_dir):
            raise ValueError(f"resume_from_checkpoint=True but {output_dir!r} holds no checkpoint-<step> folder; train without it first.")
        return
    path = str(resume_from_checkpoint)
    if not os.path.isfile(os.path.join(path, "trainer_state.pt")) and not os.path.isfile(os.path.join(path, MANIFEST)):
        raise ValueError(f"{path!r} is not a fastgrpo checkpoint (no trainer_state.pt); give a checkpoint-<step> folder or True.")


def load_checkpoint(resume_from_checkpoint, output_dir: str, accelerator, model, optimizer=None) -> tuple[str | None, dict | None]:
    """Resolve and load a checkpoint: None/False → (None, None); True → the newest in output_dir that loads; str → that folder.

    Loads the weights into `model` (and for a sharded checkpoint the optimizer state
    into `optimizer`; its trainer state's "optimizer" is then None) and this
    process's RNG state, and returns (path, trainer state with this process's
    entries and the manifest's `run_id`). Resumed on another number of processes than saved it, the
    per-process files no longer fit: every process keeps its freshly seeded
    RNG and gets no process entries (so the trainer generates a new rollout).

    Raises:
        ValueError: True with no checkpoint in output_dir; a path that is not a
            checkpoint; a checkpoint that does not fit the model; a whole-model
            checkpoint for a sharded policy (resume it without FSDP).
        CorruptCheckpointError: the given checkpoint, or with True every
            checkpoint, is incomplete or unreadable (naming checkpoint and file);
            with True each skipped one is a warning.
    """
    if resume_from_checkpoint in (None, False):
        return None, None
    unwrapped = accelerator.unwrap_model(model)
    adapters = is_peft_model(unwrapped)
    check_resume_target(resume_from_checkpoint, output_dir)
    if resume_from_checkpoint is True:
        found = checkpoints(output_dir)
        for path in reversed(found):
            try:
                parts = _read(path, accelerator, model, adapters)
                break
            except CorruptCheckpointError as err:
                if path == found[0]:
                    raise
                warnings.warn(f"{err} Falling back to the checkpoint before it.", stacklevel=2)
    else:
        path = str(resume_from_checkpoint)
        parts = _read(path, accelerator, model, adapters)
    apply_weights(path, unwrapped, parts["weights"], optimizer)
    if parts["rng"] is not None:
        set_rng_state(parts["rng"])
    return path, {**parts["state"], **parts["process"], "run_id": parts["run_id"]}


def apply_weights(path: str, model, weights: dict | None, optimizer=None) -> None:
    """Load checkpoint `path`'s weights into the unwrapped `model`: `weights` (its weights file, read) into the whole
    model or, for a peft model, its adapters (the base never changes); None: its FSDP shards (with `optimizer`'s when
    given; every process calls it).

    Raises:
        ValueError: weights that do not fit the model, naming the checkpoint and the first differences.
    """
    if weights is None:
        try:
            load_sharded(path, model, getattr(optimizer, "optimizer", optimizer))
        except ValueError as err:
            raise ValueError(f"checkpoint {path!r} does not fit this model: {err}") from None
    elif is_peft_model(model):
        load_adapters(model, path, weights)
    else:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or [])
        if unexpected or [k for k in missing if k not in tied]:
            raise ValueError(f"checkpoint {path!r} does not fit this model (missing {missing[:3]}, unexpected {unexpected[:3]}).")


def _read(path: str, accelerator, model, adapters: bool) -> dict:
    """Every file this process needs from checkpoint `path`, read into memory; nothing applied yet.

    Raises:
        ValueError: `adapters` (a LoRA policy) but the checkpoint holds full weights, or the reverse.
    """
    manifest = read_manifest(path)
    sharded = SHARDS_METADATA in manifest["files"]
    if is_sharded(accelerator.unwrap_model(model)) and not sharded:
        raise ValueError(f"{path!r} holds the whole model (saved without FSDP); resume it without FSDP (e.g. torchrun, or examples/accelerate/ddp.yaml).")
    weights_file = adapter_file(accelerator.unwrap_model(model)) if adapters else "model.safetensors"
    if not sharded and weights_file not in manifest["files"]:
        if adapters:
            raise ValueError(f"{path!r} holds no adapters (no {weights_file}): it was saved by a run without peft_config; resume it without peft_config.")
        raise ValueError(f"{path!r} holds adapters, not model.safetensors: it was saved by a run with peft_config; resume it with the same peft_config.")
    saved_by = len([name for name in manifest["files"] if re.fullmatch(r"rng_state_\d+\.pt", name)])
    fits = saved_by == accelerator.num_processes
    rank = accelerator.process_index

    def read(name: str, loader):
        try:
            return loader(os.path.join(path, name))
        except Exception as err:  # safetensors, zip and unpickling errors all mean "this file is damaged"
            raise CorruptCheckpointError(f"checkpoint {path!r}: {name} cannot be read ({type(err).__name__}: {err}).") from None

    torch_load = lambda file: torch.load(file, weights_only=False, pickle_module=_MovedClasses)  # noqa: E731
    return {
        "weights": None if sharded else read(weights_file, load_file),  # shards: read straight into the model
        "sharded": sharded,
        "state": read("trainer_state.pt", torch_load),
        "rng": read(f"rng_state_{rank}.pt", torch_load) if fits else None,
        "process": read(f"process_state_{rank}.pt", torch_load) if fits else {},  # on the device it left
        "run_id": manifest["run_id"],
    }
