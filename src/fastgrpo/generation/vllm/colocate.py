"""vLLM colocated with the trainer (TRL's vllm_mode="colocate"): one engine per training process, on its device.

vLLM's `LLM` lives in the training process; its engine core runs in a child process (vLLM's default
multiprocessing), and on CPU its worker in a second one (vLLM's CPU platform always uses its multiprocessing
executor, for its OpenMP thread binding; each child is a spawned interpreter that imports vLLM, ≈ 8 s apiece on
the EPYC here), so vLLM's own set-up (thread binding, its process group, its seeds) stays out of the trainer.
TRL runs the engine inside the process instead (`external_launcher`); measured here (round 4), that resets
torch's threads and seeds and opens a gloo group inside the trainer.

Ctrl-C: a terminal sends SIGINT to its whole foreground process group, and vLLM's engine core and worker exit on
it (their own handlers); the trainer's first Ctrl-C finishes the optimizer step and saves (run/interrupt.py), but
the sampling it was in then waited for ever on the dead engine (vLLM 0.32's client is never told: a hang, no
checkpoint). The engine's processes therefore start in a session of their own (`own_session`), out of the
terminal's reach; they stop when the trainer closes the engine or exits (vLLM's own exit handling).

An engine that dies (killed for memory, most often): vLLM 0.32's client raises `EngineDeadError` when its worker
dies, but waits for ever when the engine core process itself does (its monitor shuts the client down, and the
request waiting for an answer is never told). Each call therefore runs in a thread of its own while the caller
watches the engine core's process (`ColocateEngine.watched`), and either death is an `EngineError` naming the
exit and the fixes; the checkpoints already saved are untouched.

Weights: the engine starts from the policy's own weights (weights.WeightsFolder), and each sync reloads them
from that folder in place (`reload_weights`, vLLM 0.32), then drops the prefix cache.

Not here: the sampling settings and the `Samples` built from the output (backend.py), the server (server.py).
"""

from __future__ import annotations

import ast
import json
import math
import multiprocessing
import multiprocessing.spawn
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

import torch

from ..contract import EngineError
from .engines import LOGPROBS_MODE, Completion, PushSeconds
from .weights import WeightsFolder

# How often a caller waiting on the engine looks at its processes (seconds): the longest a dead engine goes unnoticed.
WATCH_SECONDS = 1.0

# KV-cache block on CPU (tokens): the smallest vLLM's CPU attention takes (a multiple of 32); its default of 128
# leaves up to 127 prompt tokens per completion outside the prefix cache (backend.py, "Prefill").
CPU_BLOCK_SIZE = 32


def check_cpu_head_size(folder: WeightsFolder) -> None:
    """Refuse, before vLLM starts, a model whose attention head size vLLM's CPU attention does not take.

    vLLM 0.32 starts such an engine (≈ 20 s) and its worker dies at the first request ("Unsupported CPU attention
    configuration: head_dim=16"), which reaches the trainer as `EngineDeadError` after a page of the engine's log.
    The sizes are vLLM's own (`CPUAttentionBackend.supports_head_size`).

    Raises:
        EngineError: naming the head size, the sizes vLLM takes and the fixes.
    """
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # noqa: PLC0415 (vLLM is being started anyway)
    except ImportError:  # another vLLM layout than 0.32's (the CPU build fastgrpo pins): the engine's own error applies
        return

    with open(os.path.join(folder.path, "config.json")) as f:
        config = json.load(f)
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_size = config.get("head_dim") or (hidden // heads if isinstance(heads, int) and isinstance(hidden, int) and heads else None)
    if isinstance(head_size, int) and not CPUAttentionBackend.supports_head_size(head_size):
        folder.close()
        sizes = ", ".join(map(str, CPUAttentionBackend.get_supported_head_sizes()))
        raise EngineError(
            f"vLLM's CPU attention cannot run this model: its attention heads have {head_size} dimensions, and vLLM takes "
            f"{sizes}. Sample with fastgrpo's own sampler instead (use_vllm=False), or run vLLM on a GPU."
        )


def check_cpu_memory(folder: WeightsFolder, memory_utilization: float) -> None:
    """Refuse, before vLLM starts, a CPU engine whose memory vLLM's CPU worker is certain to refuse.

    vLLM 0.32's CPU worker (`vllm.v1.worker.cpu_worker.CPUWorker`) reserves `memory_utilization` × its NUMA node's RAM, or,
    with `VLLM_CPU_KVCACHE_SPACE=<GiB>`, that much for its KV cache, and raises when it exceeds the node's available
    memory: after ≈ 20 s of spawning and importing, as "Engine core initialization failed" under a page of log.
    The node's available memory only shrinks from now until then (the engine's own processes take theirs first), so
    the same reading now (vLLM's `get_memory_node_info`, cgroup limits included) refuses only what would fail.

    Raises:
        EngineError: naming the GiB asked and available, the setting that asked for them and the fixes; or a
            `VLLM_CPU_KVCACHE_SPACE` that is not a whole number of GiB (vLLM's `int()` of it would raise).
    """
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info  # noqa: PLC0415 (vLLM is being started anyway)
    except ImportError:  # another vLLM layout than 0.32's (the CPU build fastgrpo pins): the engine's own error applies
        return

    node = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
    kv_space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if kv_space:
        try:
            asked = int(kv_space) * 2**30
        except ValueError:
            folder.close()
            raise EngineError(f"VLLM_CPU_KVCACHE_SPACE={kv_space!r}: vLLM reads it as whole GiB for the KV cache; give a whole "
                              "number (e.g. 4), or unset it for a share of RAM (vllm_gpu_memory_utilization).") from None
        setting = f"VLLM_CPU_KVCACHE_SPACE={kv_space} asks for {asked / 2**30:.1f} GiB of KV cache"
        fixes = "lower VLLM_CPU_KVCACHE_SPACE"
    else:
        asked = math.ceil(node.total_memory * memory_utilization)
        setting = (f"vllm_gpu_memory_utilization={memory_utilization:g} of this machine's RAM (vLLM's CPU reading of it) asks "
                   f"for {asked / 2**30:.1f} of its {node.total_memory / 2**30:.1f} GiB")
        fixes = (f"lower vllm_gpu_memory_utilization ({node.available_memory / node.total_memory:.2f} of the RAM is free now), or set "
                 "VLLM_CPU_KVCACHE_SPACE=<GiB> for its KV cache")
    if asked > node.available_memory:
        folder.close()
        raise EngineError(f"vLLM could not start its engine: {setting}, and {node.available_memory / 2**30:.1f} GiB is available. "
                          f"vLLM's CPU worker would refuse it after ≈ 20 s of starting, so it was not started: {fixes}, or free memory.")


# `multiprocessing`'s spawn executable while vLLM starts its engine: a new session (no controlling terminal, so no
# Ctrl-C or hang-up from it), SIGKILL when the trainer dies (Linux's PR_SET_PDEATHSIG = 1, kept across exec: out of
# the terminal's reach, the engine would outlive a trainer killed or closed with its terminal), then the real
# interpreter with the arguments multiprocessing gave.
SESSION_SHIM = """#!/bin/sh
exec {python} -c 'import ctypes, os, signal, sys; os.setsid(); ctypes.CDLL(None).prctl(1, signal.SIGKILL); os.execv(sys.executable, [sys.executable] + sys.argv[1:])' "$@"
"""


@contextmanager
def own_session():
    """The processes `multiprocessing` spawns meanwhile (vLLM's engine core, and the worker it spawns in turn) start in
    a new session: a terminal's Ctrl-C, sent to every process of its foreground group, reaches the trainer alone.
    Only the main thread (where Ctrl-C is handled, run/interrupt.py) changes the spawn executable, and only where the
    temporary folder may hold a program (not a noexec mount); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread() or os.statvfs(tempfile.gettempdir()).f_flag & os.ST_NOEXEC:
        yield
        return
    previous = multiprocessing.spawn.get_executable()
    with tempfile.TemporaryDirectory(prefix="fastgrpo-spawn-") as folder:
        shim = os.path.join(folder, "python")
        with open(shim, "w") as f:
            f.write(SESSION_SHIM.format(python=shlex.quote(os.fsdecode(previous))))
        os.chmod(shim, 0o700)
        multiprocessing.set_executable(shim)
        try:
            yield
        finally:
            multiprocessing.set_executable(previous)


def unguarded_main_script() -> bool:
    """Whether the program is a script file with no `if __name__ == "__main__":` line: a spawned process imports it again
    (as `__mp_main__`), so one that trains at its top level starts a second engine inside vLLM's engine core, which
    Python refuses (vLLM's CPU platform always spawns; TRL's colocate mode runs vLLM in-process and never does)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not os.path.isfile(path):  # a script without .py is imported again too (multiprocessing's run_path)
        return False
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())  # the code, not its comments and strings; `in ("__main__",)` and `match` are guards too
    except (SyntaxError, ValueError):  # not Python source (a zip application): not ours to judge
        return False
    return not any(_tests_main(node.test if isinstance(node, ast.If) else node) for node in ast.walk(tree) if isinstance(node, (ast.If, ast.Match)))


def _tests_main(node: ast.AST) -> bool:
    """Whether an `if` test (or a `match` statement) reads `__name__` and names "__main__" (`!=` trains in a spawned process)."""
    inner = list(ast.walk(node))
    return (any(isinstance(n, ast.Name) and n.id == "__name__" for n in inner) and not any(isinstance(n, (ast.NotEq, ast.NotIn)) for n in inner)
            and any(isinstance(n, ast.Constant) and n.value == "__main__" for n in inner))


def unguarded_main_message(cause: str) -> str:
    """The error for `unguarded_main_script()`: `cause`, then why a spawned process fails on such a script, and the fix."""
    return (f"{cause}, and each imports the script {sys.modules['__main__'].__file__!r} again, which trains at its top level "
            "and so starts another engine in it (Python's \"freeze_support\" error). Put the training under "
            "`if __name__ == \"__main__\":`.")


def exit_reason(code: int) -> str:
    """A process's exit code in words: -N is signal N (SIGKILL named as Linux's out-of-memory killer's)."""
    if code >= 0:
        return f"exit code {code}"
    name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    return f"{name}, which on Linux is most often the out-of-memory killer" if -code == signal.SIGKILL else name


class ColocateEngine:
    """vLLM's `LLM` started from a model folder, in this process (engine core, and on CPU its worker, in child processes).

    Args:
        folder: the model folder it starts from (`WeightsFolder.write_model`: config, tokenizer, weights),
            rewritten by each `push`; its dtype is the engine's.
        max_model_len: the longest prompt + completion, tokens.
        memory_utilization: vLLM's gpu_memory_utilization (on CPU: the share of RAM the engine may reserve;
            vLLM's `VLLM_CPU_KVCACHE_SPACE`, in GiB, sets the KV cache instead).
        model_impl: vLLM's model_impl ("vllm", "transformers", "auto").
        seed: the engine's sampling seed.
    Attributes:
        processes: the `multiprocessing` processes vLLM started for it (the engine core), watched by each call.
    Raises:
        EngineError: vLLM could not start (memory, most often: the message names the knobs; on CPU a share of RAM or a KV
            cache larger than is available is refused before it starts, `check_cpu_memory`), or its spawned processes
            failed on a script that trains at its top level (`unguarded_main_script`; on CPU the trainer refuses such a
            script before any model loads, `build.open_engine`).
    """

    pushes_weights = True
    description = "vLLM in this process"

    def __init__(self, folder: WeightsFolder, *, max_model_len: int, memory_utilization: float, model_impl: str, seed: int):
        from vllm import LLM, SamplingParams  # noqa: PLC0415 (an optional dependency, imported when the backend is chosen)
        from vllm.sampling_params import StructuredOutputsParams  # noqa: PLC0415

        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            check_cpu_head_size(folder)
            check_cpu_memory(folder, memory_utilization)
        before = set(multiprocessing.active_children())
        try:
            with own_session():  # the engine's processes out of the terminal's Ctrl-C (module docstring)
                self.llm = LLM(
                    model=folder.path, dtype=str(folder.dtype).removeprefix("torch."), max_model_len=max_model_len,
                    gpu_memory_utilization=memory_utilization, model_impl=model_impl, seed=seed, enable_prefix_caching=True,
                    logprobs_mode=LOGPROBS_MODE,
                    generation_config="vllm",  # vLLM's neutral defaults: the model's generation_config.json never changes sampling
                    enforce_eager=on_cpu,  # no graph capture or compilation on CPU (minutes at start-up for nothing)
                    **({"block_size": CPU_BLOCK_SIZE} if on_cpu else {}),
                )
        except RuntimeError as err:  # vLLM logs the cause above its own message ("Engine core initialization failed")
            folder.close()
            if unguarded_main_script():
                raise EngineError(unguarded_main_message(f"vLLM could not start its engine ({err}): its processes are spawned")) from None
            share = f"{memory_utilization:g} of this machine's RAM (vLLM's CPU reading of it)" if on_cpu else f"{memory_utilization:g} of the GPU"
            raise EngineError(
                f"vLLM could not start its engine ({err}; its log above says why). It reserves vllm_gpu_memory_utilization="
                f"{share}: lower it, or on CPU set VLLM_CPU_KVCACHE_SPACE=<GiB> for its KV cache, or free memory."
            ) from None
        self.sampling_params, self.folder, self.max_model_len = SamplingParams, folder, max_model_len
        self.structured_outputs = StructuredOutputsParams  # a request's dict of them becomes one (TRL's colocated rule)
        # the processes vLLM started for it: the engine core (on CPU its worker is the core's own child, which vLLM watches)
        self.processes = [p for p in multiprocessing.active_children() if p not in before]

    def watched(self, call, what: str):
        """`call()`'s result, `call` running in a thread of its own while this one watches the engine's processes.

        Raises:
            EngineError: the engine core process exited meanwhile (vLLM's client would wait for ever), or vLLM raised
                `EngineDeadError` (its worker died); naming the exit, what was running and the fixes. Whatever else
                `call` raised is raised as it is.
        """
        from vllm.v1.engine.exceptions import EngineDeadError  # noqa: PLC0415 (vLLM is loaded: this engine runs on it)

        outcome = {}

        def run():
            try:
                outcome["value"] = call()
            except BaseException as err:  # noqa: BLE001 (handed to the caller's thread, raised there)
                outcome["error"] = err

        thread = threading.Thread(target=run, name=f"fastgrpo-vllm-{what}", daemon=True)  # left waiting if the engine died
        thread.start()
        while thread.is_alive():
            thread.join(WATCH_SECONDS)
            if thread.is_alive() and self.core_exit() is not None:
                raise EngineError(self.died(what)) from None
        if isinstance(outcome.get("error"), EngineDeadError):  # its worker died, or the core before this call began
            raise EngineError(self.died(what)) from None
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def core_exit(self) -> int | None:
        """The exit code of an engine process that has exited (the engine core), or None while all run."""
        return next((p.exitcode for p in self.processes if p.exitcode is not None), None)

    def died(self, what: str) -> str:
        """The message for an engine that stopped during `what`: its core's exit, or else its worker's death."""
        code = self.core_exit()
        how = f"its engine core process exited ({exit_reason(code)})" if code is not None else "its worker process died (vLLM's log above says how)"
        return (f"{self.description} stopped during {what}: {how}. Free memory, or lower vllm_gpu_memory_utilization "
                "(on CPU: VLLM_CPU_KVCACHE_SPACE=<GiB>).")

    def generate(self, prompts: list[list[int]], params: dict) -> list[list[Completion]]:
        """`LLM.generate` on token-id prompts (no tokenising; detokenised only for stop strings, which vLLM reads in the text);
        → per prompt, its n completions with their log-probs and whether a stop string ended each. A `structured_outputs`
        dict in `params` becomes vLLM's `StructuredOutputsParams`, as TRL's colocated engine makes it.

        Raises:
            EngineError: the engine died meanwhile (`watched`).
        """
        if params.get("structured_outputs") is not None:
            params = {**params, "structured_outputs": self.structured_outputs(**params["structured_outputs"])}
        outputs = self.watched(
            lambda: self.llm.generate([{"prompt_token_ids": p} for p in prompts], self.sampling_params(**params, detokenize=bool(params.get("stop"))), use_tqdm=False),
            "sampling",
        )
        return [
            [Completion(list(c.token_ids), [step[token].logprob for step, token in zip(c.logprobs or [], c.token_ids)], isinstance(c.stop_reason, str))
             for c in out.outputs]
            for out in outputs
        ]

    def push(self, weights: dict[str, torch.Tensor]) -> PushSeconds:
        """Write `weights` into the folder, reload them in place (every worker), reset the prefix cache; → the seconds of each.

        Raises:
            EngineError: the engine died meanwhile (`watched`).
        """
        started = time.perf_counter()
        self.folder.write(weights)

        def reload() -> PushSeconds:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self.folder.path})
            transferred = time.perf_counter()
            self.llm.reset_prefix_cache()
            return PushSeconds(transfer=transferred - started, pause=time.perf_counter() - transferred)

        return self.watched(reload, "the weight sync")

    def close(self) -> None:
        """Stop the engine core process (it would otherwise live until this process exits) and remove the folder."""
        self.llm.llm_engine.engine_core.shutdown()
        self.folder.close()
