"""`GRPOConfig`'s checks on TRL's vLLM fields: what the engine and a server's address can be, and what vLLM cannot do here.

Called from `checks.validate` (GRPOConfig.__post_init__), before any model loads. Every refusal is one sentence
naming the value and the fix.

Not here: the engine itself (generation/vllm/), the other fields' rules (checks.py).
"""

from __future__ import annotations

from .structured_outputs import check_fields as check_structured_outputs

VLLM_MODES = ("colocate", "server")  # TRL's vllm_mode values
VLLM_MODEL_IMPLS = ("vllm", "transformers", "auto")  # vLLM's model_impl values


def check_vllm(c) -> None:
    """The vLLM fields (TRL's), checked before any model loads; what vLLM cannot do on a CPU is refused with the reason.

    Raises:
        ValueError: use_vllm=True with generation_backend='transformers'; an unknown vllm_mode or
            vllm_model_impl; a memory share outside (0, 1]; sleep mode (vLLM 0.32's CPU backend has
            none; on CUDA fastgrpo does not drive it yet); vllm_tensor_parallel_size > 1 in colocate mode (one engine per training
            process here, where TRL shards one across them; a bigger engine is a server's flag); use_cpu=True on a
            machine with a GPU (vLLM would sample there while the policy trains on the CPU); vllm_structured_outputs_regex
            without vLLM, or one vLLM refuses (config/structured_outputs.py).
    """
    if c.use_vllm and c.generation_backend != "vllm":
        raise ValueError(f"use_vllm=True and generation_backend={c.generation_backend!r} contradict each other; set one of them.")
    check_structured_outputs(c.vllm_structured_outputs_regex, c.generation_kwargs, c.generation_backend == "vllm")
    if c.generation_backend != "vllm":
        return
    if c.vllm_mode not in VLLM_MODES:
        raise ValueError(f"vllm_mode={c.vllm_mode!r}: use one of {', '.join(VLLM_MODES)}.")
    if c.vllm_model_impl not in VLLM_MODEL_IMPLS:
        raise ValueError(f"vllm_model_impl={c.vllm_model_impl!r}: use one of {', '.join(VLLM_MODEL_IMPLS)}.")
    if not 0 < c.vllm_gpu_memory_utilization <= 1:
        raise ValueError(f"vllm_gpu_memory_utilization={c.vllm_gpu_memory_utilization}: use a share in (0, 1], e.g. 0.3.")
    if c.vllm_server_timeout <= 0:
        raise ValueError(f"vllm_server_timeout={c.vllm_server_timeout}: use a positive number of seconds, e.g. 240.")
    if c.vllm_mode == "server":
        check_server_address(c)
    import torch  # noqa: PLC0415 (the device decides what the engine can do)

    if c.use_cpu and torch.cuda.is_available():
        raise ValueError(
            f"use_cpu=True with vLLM ({c.vllm_mode} mode) on a machine with a GPU: vLLM would sample on the GPU (its CUDA build; "
            "a server takes the weights over NCCL from the GPU) while the policy trains on the CPU; set use_cpu=False to train "
            "on the GPU, or use_vllm=False to sample on the CPU with fastgrpo's own sampler."
        )
    if c.vllm_enable_sleep_mode:
        reason = "vLLM has no sleep mode on CPU (it frees GPU memory only)" if not torch.cuda.is_available() else \
            "fastgrpo does not put its engine to sleep between rollouts yet (not built)"
        raise ValueError(f"vllm_enable_sleep_mode=True: {reason}; set it to False.")
    if c.vllm_mode == "colocate" and c.vllm_tensor_parallel_size < 1:  # not a count of GPUs: no server flag to name
        raise ValueError(f"vllm_tensor_parallel_size={c.vllm_tensor_parallel_size}: a count of GPUs per engine, 1 or more; use 1.")
    if c.vllm_mode == "colocate" and c.vllm_tensor_parallel_size != 1:
        reason = "vLLM's CPU backend runs one engine per process here" if not torch.cuda.is_available() else \
            "fastgrpo runs one whole engine per training process"
        raise ValueError(
            f"vllm_tensor_parallel_size={c.vllm_tensor_parallel_size} in colocate mode: {reason}; use 1, or vllm_mode='server' "
            f"with `fastgrpo vllm-serve --model … --tensor-parallel-size {c.vllm_tensor_parallel_size}` (GPUs)."
        )
    if c.vllm_max_model_length is not None and c.vllm_max_model_length < c.max_completion_length + 1:
        raise ValueError(
            f"vllm_max_model_length={c.vllm_max_model_length} leaves no room for a prompt and max_completion_length="
            f"{c.max_completion_length}; use at least max_prompt_length + max_completion_length, or None."
        )


def check_server_address(c) -> None:
    """The server's address (TRL's `vllm_server_base_url`, else `vllm_server_host`/`_port`), refused when no server can be at it.

    A URL without a scheme (`127.0.0.1:8000`, `localhost:8000`) is read as http, as TRL's client reads one
    (generation/vllm/server.base_url). Without these checks each waited `vllm_server_timeout` (240 s by default) and
    then said no server answered.

    Raises:
        ValueError: a scheme other than http or https; a URL without a host; a port (in the URL, vllm_server_port or
            vllm_group_port) outside 1–65535; each naming the field, the value and a form that works.
    """
    from urllib.parse import urlsplit  # noqa: PLC0415

    ports = [("vllm_group_port", c.vllm_group_port)]
    if c.vllm_server_base_url:
        url = c.vllm_server_base_url if "://" in c.vllm_server_base_url else "http://" + c.vllm_server_base_url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"vllm_server_base_url={c.vllm_server_base_url!r}: give the server's http address, e.g. "
                             "'http://127.0.0.1:8000' (`fastgrpo vllm-serve --host 127.0.0.1 --port 8000`).")
        try:
            ports.append(("vllm_server_base_url's port", parts.port))
        except ValueError:  # urlsplit's own check: not a number, or above 65535
            raise ValueError(f"vllm_server_base_url={c.vllm_server_base_url!r} has no valid port: give one from 1 to 65535, "
                             "e.g. 'http://127.0.0.1:8000'.") from None
    else:
        ports.append(("vllm_server_port", c.vllm_server_port))
    for name, port in ports:
        if port is not None and not 1 <= port <= 65535:
            which = "the NCCL weight-transfer group's; default 51216" if name == "vllm_group_port" else \
                "the one `fastgrpo vllm-serve --port` listens on; default 8000"
            raise ValueError(f"{name}={port}: give a port from 1 to 65535 ({which}).")
