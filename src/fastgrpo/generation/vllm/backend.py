"""vLLM behind the generation contract: token-id prompts in, G completions each, the sampled tokens' log-probs kept.

The same `SamplingSettings` as the own sampler become vLLM's `SamplingParams` (temperature, top_p, top_k,
min_p, repetition_penalty; EOS, with `generation_kwargs`' stop_token_ids, as `stop_token_ids` with vLLM's own EOS rule
off, so exactly the configured ids end a completion; `generation_kwargs`' stop strings as `stop` and its other vLLM keys
as given). A row a stop string ended keeps the token completing it (vLLM's `token_ids`) and is finished (`stop_lengths`). The engine starts with `generation_config="vllm"`: a model's
`generation_config.json` never changes what is sampled.

Log-probs: vLLM returns the sampled token's log-prob after its logits processing (`processed_logprobs`,
as TRL's server). With no truncation (top_p = 1, top_k = 0, no min_p) and no repetition penalty that is
log softmax(logits / T) — the distribution the trainer takes π_old over — so they are the sampler's
log-probs of the contract (`Samples.logps`), TRL's `vllm_importance_sampling_*` corrects for the engine's
own weights (bf16, another kernel), and π_old needs no pass where it is free (μ = 1). Under truncation vLLM
renormalises over the kept tokens (trl#6789): log p_kept = log p − log Σ_kept p ≥ log p, which would bias
every ratio below 1. fastgrpo then drops them: `owns_weights` is False, the correction is off, and π_old is
the trainer's own (one start-up notice says so).

Prefill: vLLM splits a request with n = G into G requests scheduled together, and its prefix cache only
serves blocks written by an earlier step, so each of the G would prefill the whole prompt again (measured on
SmolLM2, 2 prompts of 200 tokens, G = 8, CPU: 0.89 s for one token each). `sample` therefore first sends
each prompt once for a single token, and the G completions then find it cached (0.14 s with 32-token blocks,
the CPU engines' block size here: vLLM's default of 128 leaves up to 127 tokens per completion uncached).

Weights: `update_weights` takes the policy's full weights (weight_copy.full_weights: LoRA merged, FSDP
shards gathered — on every process, the gather is collective) and the engine that owns them pushes them;
a server shared by several training processes receives them once, from the main process, and the others
wait at a barrier before sampling. Deferred (the overlap, one process): `update_weights` only copies them and
the next `sample` pushes them first, so the push runs in the producer's thread between two rollouts; each push's
seconds, with its copy's, are kept for `pop_syncs` (TRL AsyncGRPOTrainer's `perf/weight_sync_*`).

Not here: the engines (colocate.py, server.py), the weights folder (weights.py), choosing this backend (generation/build.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from ...config.generation_kwargs import VLLM_MASK_KEYS, VLLM_PENALTY_KEYS
from ..contract import EngineError, Samples, SamplingSettings
from ..reprefill import Reprefill
from ..weight_copy import full_weights
from .engines import Completion, Engine
from .weights import with_head


SEED_STRIDE = 1 << 16  # seeds between two requests: room for their n completions' seed + 0 … n − 1
SYNC_PARTS = ("weight_sync_s", "weight_sync_pause_s", "weight_sync_barrier_s", "weight_sync_transfer_s")  # `pop_syncs`' sums


class Pending(NamedTuple):
    """Weights copied by `update_weights` (deferred) for the next `sample` to push, and what the copy took."""

    weights: dict[str, torch.Tensor]
    copy_s: float  # seconds to gather and copy them (full_weights: LoRA merged, shards gathered; then cloned)
    wait_s: float  # seconds the copying thread then waited on the lock, for a push still running


def is_exact(sampling: SamplingSettings) -> bool:
    """vLLM's processed log-probs are log softmax(logits / T) (no truncation, no penalty, no min_tokens, no mask, no grammar):
    usable as the sampler's. A grammar (structured outputs) and `generation_kwargs`' masks (`bad_words`, `logit_bias`,
    `allowed_token_ids`, applied in vLLM's `Sampler.apply_logits_processors` before the processed log-probs are taken) change
    the logits before sampling, so vLLM's log-probs are renormalised over what they leave (a forced token's is 0; measured on
    vLLM 0.32's CPU build)."""
    penalised = any(sampling.vllm_params.get(key) for key in (*VLLM_PENALTY_KEYS, *VLLM_MASK_KEYS))
    return (sampling.top_p >= 1.0 and sampling.top_k == 0 and not sampling.min_p and sampling.repetition_penalty == 1.0 and not penalised
            and sampling.structured_outputs is None)


def sampling_params(sampling: SamplingSettings, n: int, max_tokens: int) -> dict:
    """vLLM `SamplingParams` fields for `sampling`: n completions of at most `max_tokens`, the sampled token's log-prob;
    the stop strings as `stop`, `generation_kwargs`' other vLLM keys as given (config/generation_kwargs.py) and structured
    outputs as a dict (a server's JSON field; the colocated engine makes vLLM's `StructuredOutputsParams` of it)."""
    return {**sampling.vllm_params, **({"stop": list(sampling.stop_strings)} if sampling.stop_strings else {}),
        **({"structured_outputs": sampling.structured_outputs} if sampling.structured_outputs else {}),
        "n": n, "max_tokens": max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
        "top_k": sampling.top_k, "min_p": sampling.min_p or 0.0, "repetition_penalty": sampling.repetition_penalty,
        "logprobs": 0,  # the sampled token's own
        "stop_token_ids": list(sampling.eos_token_ids), "ignore_eos": True,  # exactly the configured EOS ids end a row
    }


class VLLMGenerator:
    """The `GenerationBackend` that samples with a vLLM engine (colocated or a server).

    Args:
        engine: the engine (engines.Engine: colocate.ColocateEngine or server.ServerEngine).
        sampling: the `SamplingSettings` every backend samples with.
        tied: the names the policy's tied embedding weight goes by (`weights.tied_names`; the engine runs them untied).
        deferred: pushes wait for the next `sample` (the overlap, rollout/async_producer.py: its producer thread samples,
            so the push runs there, between two rollouts, and the trainer only copies the weights); one process only.
        vocab_size: the policy's embedding rows: every token id an engine returns must be below it (`check_rows`).
        reopen: starts the colocated engine again from the policy's weights as they are then (generation/build.py): after
            `close` (train()'s end), the next `update_weights` or `sample` (an `evaluate()`, another `train()`) calls it, as
            TRL's engine, never stopped, serves them; None (a server, which `close` leaves running): never needed.
        sync_steps: the run's weight_sync_steps (optimizer steps between pushes; the trainer decides when), for `notices`.
        seed: None, or the base of each request's vLLM `seed`: seed + d·SEED_STRIDE, d drawn from torch's global generator
            (vLLM gives its n completions seed + 0 … n − 1). Each request then samples the same whatever else the engine
            runs beside it: a server shared by runs, and whenever it is sent (the overlap's max_staleness=0 equals the
            synchronous loop); and since the trainer seeds that generator and its checkpoints hold it, as for the own
            sampler, a run is sampled the same when run again or resumed (an unseeded colocated engine sampled another
            rollout each time: its batch's rows took its one random stream in an order that varied from run to run).
    Attributes:
        owns_weights: True where vLLM's log-probs are of the distribution π_old is taken over (`is_exact`):
            `Samples.logps` are given and corrected for; False under truncation, a penalty, a mask or structured outputs.
        sync_bytes: the bytes of the last weights pushed (0 in a process that does not push).
        syncs: the deferred pushes' window sums since the last `pop_syncs` (under `lock`).
    """

    def __init__(self, engine: Engine, sampling: SamplingSettings, *, vocab_size: int, tied: tuple[str, ...] = (), seed: int | None = None,
                 deferred: bool = False, reopen: Callable[[], Engine] | None = None, sync_steps: int = 1):
        self.engine, self.sampling, self.vocab_size, self.tied, self.seed = engine, sampling, vocab_size, tied, seed
        self.sync_steps = sync_steps
        self.reopen, self.closed = reopen, False  # a colocated engine stopped by `close` starts again at its next use
        self.deferred, self.pending, self.lock = deferred, None, threading.Lock()  # pending: the weights the next sample pushes first
        self.owns_weights = is_exact(sampling)
        self.sync_bytes, self.syncs = 0, {}

    def update_weights(self, policy: torch.nn.Module) -> None:
        """The policy's full weights into the engine (the pushing process), then every process waits for it. A colocated
        engine that `close` stopped starts again instead, from the policy's weights (`reopen`)."""
        if self._reopened():
            return
        started = time.perf_counter()
        weights = with_head(full_weights(policy), self.tied)  # every process: an FSDP gather is collective
        if self.deferred:  # a copy: the optimizer steps on while the producer thread pushes it
            weights = {name: t.detach().clone() for name, t in weights.items()}
            copied = time.perf_counter()
            with self.lock:  # a copy not pushed yet is replaced: the engine needs only the latest
                self.pending = Pending(weights, copied - started, time.perf_counter() - copied)
            return
        if self.engine.pushes_weights:
            self.engine.push(weights)
            self.sync_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # nobody samples from a shared server before its weights are in

    @torch.no_grad()
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, max_new_tokens: int | None = None) -> Samples:
        """(B, P) left-padded prompts → `Samples` of B·G rows (prompt i's G completions together), ≤ T_max columns.

        Returns:
            completion ids (B·G, T') right-padded with pad_token_id after the stop token, T' the longest
            completion; logps (B·G, T') float32 (0 after the stop token) when `owns_weights`, else None; with stop
            strings, stop_lengths (B·G,): vLLM keeps the token completing one in `token_ids` (its text is cut there).
        Raises:
            EngineError: a prompt whose length + T exceeds the engine's max_model_len (vLLM would cut its completions
                short to fit, silently, or refuse it), before anything is sent; the engine returned another number of
                completions than B·G, or completions `check_rows` refuses.
        """
        self._reopened()  # stopped by `close`: started again from the policy's weights
        T = max_new_tokens or self.sampling.max_completion_length
        prompts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
        self.check_lengths(prompts, T)
        with self.lock:  # deferred: the latest weights in before this rollout's requests
            pending, self.pending = self.pending, None
            if pending is not None:
                pushed = self.engine.push(pending.weights)
                self.sync_bytes = sum(t.numel() * t.element_size() for t in pending.weights.values())
                parts = (pending.copy_s + pending.wait_s + pushed.transfer + pushed.pause, pushed.pause, 0.0, pending.copy_s + pushed.transfer)
                self.syncs = {"weight_syncs": self.syncs.get("weight_syncs", 0) + 1,
                              **{key: self.syncs.get(key, 0.0) + value for key, value in zip(SYNC_PARTS, parts)}}
        if num_generations > 1:  # each prompt into the prefix cache once, so its G completions share it (below)
            self.engine.generate(prompts, {**sampling_params(self.sampling, 1, 1), "logprobs": None, "min_tokens": 0})
        params = sampling_params(self.sampling, num_generations, T)
        if self.seed is not None:
            params["seed"] = self.seed + SEED_STRIDE * int(torch.randint(1 << 30, ()))  # the trainer's generator (checkpointed)
        rows = [c for group in self.engine.generate(prompts, params) for c in group]
        if len(rows) != len(prompts) * num_generations:
            raise EngineError(f"{self.engine.description} returned {len(rows)} completions for {len(prompts)} prompts × G={num_generations}.")
        self.check_rows(rows, T)
        width = max(1, max(len(r.tokens) for r in rows))
        ids = torch.full((len(rows), width), self.sampling.pad_token_id, dtype=prompt_ids.dtype)
        logps = torch.zeros(len(rows), width)
        for i, row in enumerate(rows):
            ids[i, : len(row.tokens)] = torch.tensor(row.tokens[:T], dtype=prompt_ids.dtype)
            logps[i, : len(row.logps)] = torch.tensor(row.logps[:T])
        stops = torch.tensor([min(len(r.tokens), T) if r.stop_string else 0 for r in rows]) if self.sampling.stop_strings else None
        device = prompt_ids.device
        return Samples(ids.to(device), logps.to(device) if self.owns_weights else None, None if stops is None else stops.to(device))

    def pop_syncs(self) -> dict[str, float]:
        """The deferred pushes since the last call as window sums (then reset; {} when none): `weight_syncs` (their
        count) and per TRL 1.16 AsyncGRPOTrainer's `_sync_weight` phase, summed over them, in seconds:

        - `weight_sync_transfer_s`: the weights gathered and copied (`update_weights`, the trainer's thread) and sent
          into the server (folder written and reloaded, or NCCL) — TRL's transfer gathers and sends;
        - `weight_sync_pause_s`: the server's prefix cache dropped, running requests preempted — TRL's pause freezes
          them and clears the caches (here after the reload, since no request of the run runs during a push: the
          producer pushes before its next requests, and an evaluation samples only while it is paused);
        - `weight_sync_barrier_s`: 0.0 — TRL's wait for the other training processes; the overlap runs in one;
        - `weight_sync_s`: the whole sync, the parts and the copying thread's wait for a push still running (as TRL's
          total holds its closing barrier and resume beside its parts), so it is at least their sum.

        A copy replaced before it was pushed (the trainer copied again first) is no sync: its seconds are in
        `seconds/weight_sync` only."""
        with self.lock:
            out, self.syncs = self.syncs, {}
        return out

    def check_rows(self, rows: list[Completion], max_tokens: int) -> None:
        """Refuse completions a wrong server returns before they reach the trainer: an empty one, a token id outside the
        policy's vocabulary (a server serving another tokenizer's model under this model's name), and, where its log-probs are
        used (`owns_weights`), fewer log-probs than tokens or one that is not a number (a JSON null, NaN).

        Raises:
            EngineError: naming the engine, the completion, the value and the fix.
        """
        for i, row in enumerate(rows):
            tokens = row.tokens[:max_tokens]
            if not tokens:  # vLLM's token_ids hold the stop token too: at least one for max_tokens ≥ 1
                raise EngineError(f"{self.engine.description} returned completion {i} with no tokens, which vLLM never does (its "
                                  "token ids hold the stop token too); serve the model with `fastgrpo vllm-serve`.")
            bad = next((t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise EngineError(
                    f"{self.engine.description} returned token id {bad!r} in completion {i}, outside the policy's vocabulary of "
                    f"{self.vocab_size} ids: it serves a model with another tokenizer. Serve the model being trained (`fastgrpo vllm-serve --model …`)."
                )
            logps = row.logps[:max_tokens]
            wrong = [x for x in logps if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x]  # null, text, NaN
            if self.owns_weights and (wrong or len(logps) < len(tokens)):
                what = f"the log-prob {wrong[0]!r}" if wrong else f"{len(logps)} log-probs"
                raise EngineError(
                    f"{self.engine.description} returned {what} for completion {i} of {len(tokens)} tokens: fastgrpo takes the "
                    "sampler's log-prob of every token (π_old, the sampler–trainer correction). Serve the model with "
                    "`fastgrpo vllm-serve`, which returns them."
                )

    def check_lengths(self, prompts: list[list[int]], max_tokens: int) -> None:
        """Refuse prompts that leave fewer than `max_tokens` completion tokens in the engine's max_model_len.

        vLLM does not refuse these: its server shortens the request's max_tokens to the room left and the colocated
        engine stops at max_model_len, so the run would train on completions cut short (the server refuses a prompt
        longer than max_model_len itself, with HTTP 400).

        Raises:
            EngineError: naming the longest prompt, max_tokens, the engine's max_model_len and the fixes.
        """
        limit = self.engine.max_model_len  # None: a server whose /server_info does not say
        longest = max((len(p) for p in prompts), default=0)
        if isinstance(limit, int) and longest + max_tokens > limit:
            raise EngineError(
                f"a prompt of {longest} tokens and {max_tokens} completion tokens do not fit in max_model_len={limit} of "
                f"{self.engine.description}: vLLM would cut its completions short. Give the engine a longer context (server: "
                f"`fastgrpo vllm-serve … --max_model_len {longest + max_tokens}` or more; colocate: vllm_max_model_length), or lower "
                "max_prompt_length (prompts keep their last tokens) or max_completion_length."
            )

    def turns(self) -> Reprefill:
        """Turns that send each continuing row's whole sequence again (vLLM's prefix cache makes the prefix cheap; TRL's way)."""
        return Reprefill(self, self.sampling.pad_token_id, self.sampling.eos_token_ids)

    def notices(self) -> list[str]:
        """Where the engine runs, and that its log-probs are not used under truncation, a penalty, a mask or a grammar."""
        when = ("once per rollout after the optimizer step" if self.sync_steps == 1 else
                f"at the first rollout after each weight_sync_steps={self.sync_steps} optimizer steps")
        if self.deferred:
            when += ", pushed by the rollout producer before the next rollout it samples"
        notes = [f"sampling with {self.engine.description}; its weights are synced {when}."]
        if not self.owns_weights:
            notes.append(
                "top_p/top_k/min_p/repetition_penalty/presence_penalty/frequency_penalty/min_tokens/bad_words/logit_bias/allowed_token_ids/structured outputs: "
                "vLLM's log-probs are of the truncated (or masked), renormalised distribution (trl#6789), not the one π_old is taken over; they are not used, so the sampler–trainer correction "
                "(vllm_importance_sampling_correction) is off and π_old comes from the trainer."
            )
        return notes

    def close(self) -> None:
        """Stop the colocated engine (a server keeps running); its next use starts it again (`reopen`)."""
        if not self.closed:
            self.engine.close()
            self.closed = self.reopen is not None

    def _reopened(self) -> bool:
        """Start the colocated engine again if `close` stopped it (→ True: it holds the policy's weights as they are now)."""
        if not self.closed:
            return False
        self.engine, self.closed = self.reopen(), False
        return True
