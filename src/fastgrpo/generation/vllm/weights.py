"""The policy's weights as a folder vLLM loads: safetensors in shared memory, rewritten once per rollout.

vLLM 0.32's workers reload their weights in place from a folder (`reload_weights(weights_path=…)`, the same
loader that reads a checkpoint). On one machine that folder lives in `/dev/shm`, so a sync is a memory copy
into the page cache and vLLM's load from it, with no disk and no collective; a CUDA server takes the weights
over NCCL instead (server.py). The tensors are `generation.weight_copy.full_weights`: LoRA merged (W + ΔW,
adapters untouched), `modules_to_save` and trainable tokens in place, FSDP shards gathered.

Not here: the full weights (backend.py, from weight_copy.full_weights), what reads the folder (colocate.py, server.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref

import torch
from safetensors import safe_open
from safetensors.torch import save_file


SHARED_MEMORY = "/dev/shm"  # Linux's RAM-backed tmpfs; elsewhere the system's temporary folder
HEAD = "lm_head.weight"  # the output embedding's name in transformers' and vLLM's Llama-family models (untied_folder)

# Tied embeddings: vLLM 0.32's in-place reload leaves a tied head with its old weights ("ParallelLMHead:
# Failed to load weights"; measured: a synced fp32 engine then differs from the policy by 4e-3 in log-prob
# instead of 4e-7). So every engine fastgrpo starts runs the head untied (`tie_word_embeddings` False,
# the head a copy of the embedding), and each sync sends it under its own name (`with_head`).


def tied_names(lm: torch.nn.Module) -> tuple[str, ...]:
    """The names under which `lm` holds its input embedding's weight: (the embedding's, then each tied alias, e.g. the
    head's), or () when nothing is tied. Read from the model (`named_parameters(remove_duplicate=False)`)."""
    embedding = lm.get_input_embeddings().weight  # a LoRA embedding's: its base layer's, named as the plain model names it
    names = tuple(n.replace(".base_layer.", ".") for n, p in lm.named_parameters(remove_duplicate=False) if p is embedding)
    return names if len(names) > 1 else ()


def with_head(weights: dict[str, torch.Tensor], tied: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """`weights` with every tied alias (`tied_names`: the head) given under its own name, the embedding's tensor, for an
    untied engine; `weights` itself when nothing is tied."""
    if not tied:
        return weights
    embed = next(n for n in tied if n in weights)
    return {**weights, **{alias: weights[embed] for alias in tied if alias not in weights}}


UNTIED_FROM = "untied_from.json"  # in an untied copy: the config and files (size, mtime) it was made from


def untied_folder(folder: str, target: str) -> str:
    """`folder` (a safetensors model) as vLLM should serve it: the same when untied, else an untied copy in `target`.

    The copy links every file but `config.json` (tie_word_embeddings False) and adds `lm_head.safetensors`
    (the embedding, as the head), listed in the shards' index when there is one. Written once, and again when `folder`
    changed since (a model saved over it: its config and head were served with the new weights); → the folder to serve.
    Written into a temporary folder beside `target`, then renamed: servers of the same model started at once each write
    their own, the first rename wins and the others remove theirs.
    """
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    if not config.get("tie_word_embeddings", False):
        return folder
    source = json.loads(json.dumps({"config": config, "files": {  # what the copy was made from: a folder saved over since is copied again
        name: [(st := os.stat(os.path.join(folder, name))).st_size, st.st_mtime_ns] for name in sorted(os.listdir(folder))}}))
    if _untied_from(target) == source:
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".untying-", dir=os.path.dirname(target))
    with open(os.path.join(tmp, UNTIED_FROM), "w") as f:
        json.dump(source, f)
    for name in os.listdir(folder):
        if name not in ("config.json", "model.safetensors.index.json"):
            os.symlink(os.path.join(os.path.abspath(folder), name), os.path.join(tmp, name))
    shards = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    for shard in shards:
        with safe_open(os.path.join(folder, shard), "pt") as f:
            embed = next((k for k in f.keys() if k.endswith("embed_tokens.weight")), None)
            if embed is not None:
                save_file({HEAD: f.get_tensor(embed)}, os.path.join(tmp, "lm_head.safetensors"), metadata={"format": "pt"})
                break
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            table = json.load(f)
        table["weight_map"][HEAD] = "lm_head.safetensors"
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump(table, f)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump({**config, "tie_word_embeddings": False}, f)
    if os.path.isdir(target) and _untied_from(target) != source:
        shutil.rmtree(target, ignore_errors=True)  # a copy of another model, or of this folder before it was saved over
    try:
        os.replace(tmp, target)
    except OSError:  # another server of this model renamed its copy first
        shutil.rmtree(tmp)
        if _untied_from(target) != source:
            raise
    return target


def _untied_from(target: str) -> dict | None:
    """The record (UNTIED_FROM) of the finished untied copy in `target`; None when there is none or it is unreadable."""
    try:
        with open(os.path.join(target, UNTIED_FROM)) as f:
            return json.load(f)
    except (OSError, ValueError):  # no copy, or one from before the record was kept
        return None


class WeightsFolder:
    """A folder holding the policy as vLLM loads a model: `config.json`, the tokenizer, `model.safetensors`.

    Args:
        dtype: the engine's dtype (torch.bfloat16 or torch.float32); the weights are cast to it once per write.
        prefix: the folder's name prefix (one folder per process and run).
    Attributes:
        path: the folder, created under /dev/shm (or the temporary folder where there is none); removed by `close`,
            or when the object is collected or the process exits. A `write` after `close` (evaluate() or another
            train() after train()) creates a new one.
        nbytes: the bytes of the last weights written.
    """

    def __init__(self, dtype: torch.dtype, prefix: str = "fastgrpo-vllm-"):
        self.dtype, self.prefix, self.nbytes = dtype, prefix, 0
        self._open()

    def _open(self) -> None:
        """A new, empty folder (removed at collection or exit if nobody closes it: it is RAM, not disk)."""
        self.path = tempfile.mkdtemp(prefix=self.prefix, dir=SHARED_MEMORY if os.path.isdir(SHARED_MEMORY) else None)
        self.remove = weakref.finalize(self, shutil.rmtree, self.path, True)
        self.layout, self.shapes, self.views = None, None, None  # the file's safetensors header, and its tensors mapped

    def write_model(self, config: dict, tokenizer, weights: dict[str, torch.Tensor]) -> str:
        """The whole model folder an engine starts from: `config` (the model's, as a dict; written untied), the tokenizer,
        the weights (`with_head` already applied); → its path."""
        dtype = str(self.dtype).removeprefix("torch.")
        config = {**config, "torch_dtype": dtype, "dtype": dtype, "tie_word_embeddings": False}  # the head untied (above)
        with open(os.path.join(self.path, "config.json"), "w") as f:
            json.dump(config, f)
        tokenizer.save_pretrained(self.path)
        self.write(weights)
        return self.path

    def write(self, weights: dict[str, torch.Tensor]) -> None:
        """Write {name: tensor} (a plain model's names) as `model.safetensors`, cast to `dtype`, on CPU.

        The first write (or one with other names or shapes) saves a new file, to a temporary name renamed
        into place; later writes cast each tensor straight into that file's bytes, mapped in memory (the
        safetensors layout does not change), which halves a sync's cost: no second copy for serialising.
        """
        if not self.remove.alive:  # closed
            self._open()
        shapes = {name: tuple(value.shape) for name, value in weights.items()}
        if self.layout is None or self.shapes != shapes:
            self._save(weights)
            self.shapes = shapes
        else:
            for name, value in weights.items():
                self.views[name].copy_(value.detach())  # the cast to dtype happens in the copy
        self.nbytes = sum(v.numel() * v.element_size() for v in self.views.values())

    def _save(self, weights: dict[str, torch.Tensor]) -> None:
        """A new `model.safetensors` from `weights`, and views of its tensors' bytes in the mapped file."""
        tensors, seen = {}, set()
        for name, value in weights.items():
            tensor = value.detach().to(device="cpu", dtype=self.dtype).contiguous()
            tensors[name] = tensor.clone() if tensor.data_ptr() in seen else tensor  # a tied head: its own copy on disk
            seen.add(tensor.data_ptr())
        path = os.path.join(self.path, "model.safetensors")
        save_file(tensors, path + ".partial", metadata={"format": "pt"})
        os.replace(path + ".partial", path)
        with open(path, "rb") as f:
            header_bytes = int.from_bytes(f.read(8), "little")
            self.layout = json.loads(f.read(header_bytes))
        storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=os.path.getsize(path))
        start, size = 8 + header_bytes, torch.tensor([], dtype=self.dtype).element_size()
        self.views = {
            name: torch.tensor([], dtype=self.dtype).set_(storage, (start + entry["data_offsets"][0]) // size, entry["shape"])
            for name, entry in self.layout.items() if name != "__metadata__"
        }

    def close(self) -> None:
        """Remove the folder and let go of its mapped file, so its memory is freed (done at exit or collection too)."""
        self.remove()
        self.layout, self.shapes, self.views = None, None, None
