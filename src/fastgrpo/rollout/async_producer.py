"""Generation overlapped with training: a producer thread keeps rollouts in flight, at most `max_staleness` weight versions old.

TRL 1.16's `trl.experimental.async_grpo` runs a rollout worker that feeds a queue from a vLLM server while the
trainer drains it; a sample carries the weight version (`model_version`) it was generated under and is dropped
when it lags the trainer's by more than `max_staleness` (`RolloutQueueDataset.__iter__`). Here the unit is
fastgrpo's rollout (one `RolloutAssembly()` call: B prompts × G completions, scored, with Â):

    admission  the producer starts rollout k only when k < requested + max_staleness, requested = the rollouts
               the trainer has asked for (the one it waits on included), and at most `inflight` rollouts are
               outstanding (started, not yet taken). max_staleness = 0: rollout k starts only once the trainer
               asks for it, after the weights it trains with are pushed — the synchronous loop, same draws,
               same sampling seeds, same numbers (tests/test_async_grpo.py);
    tagging    each rollout records the trainer's weight version when its generation started (TRL's tag) and its
               sampler log-probs (`Rollout.sampling_logps`). The push itself runs in this thread, first thing in
               the rollout's sampling (VLLMGenerator `deferred`): the trainer only copies the weights, and a push
               requested meanwhile makes the rollout fresher than its tag, never staler;
    dropping   at hand-over, staleness = version now − the tag; a rollout with staleness > max_staleness is
               dropped, counted (its completions, TRL's `sample/dropped_stale_total`) and replaced. The
               admission rule keeps a run with one push per rollout within the bound, so drops are the guard
               for a trainer whose version runs ahead of its rollouts;
    π_old      not set here: the trainer takes π_old (the proximal policy) from its current weights at first
               use, and TRL's `vllm_importance_sampling_*` weight w = π_old / π_behaviour (algo/
               sampling_correction.py) corrects for both the engine's kernels and the lag.

Checkpoints: `state_dict()` holds the data order as it stood after the last rollout handed to the trainer, so
rollouts in flight or queued at a checkpoint are drawn and sampled again on resume (never trained twice, never
skipped), plus the dropped count. Faults: an error in the producer (a dead server: `EngineError`) is raised in
the trainer at its next hand-over; no progress for `heartbeat_stale_after_s` seconds raises `EngineError`.

Thread safety: the producer thread alone draws prompts, pushes weights, generates and scores; the trainer thread
copies the weights (a lock hands them over) and trains, and evaluates (sampling and scoring) only inside `paused()`,
while the producer makes nothing. One process only (the advantage statistics' all-gather would run in two threads).

Not here: the weight push (trainer `_sync_weights`, generation/vllm/backend.py), the correction's maths (algo/sampling_correction.py).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from ..generation.contract import EngineError
from .record import Rollout

POLL_S = 0.5  # how often a waiting thread looks at the stop flag, the producer's health and the trainer's requests


class Tagged(NamedTuple):
    """One produced rollout and what the hand-over needs to know about it."""

    rollout: Rollout
    extra: dict  # the log_extra columns its reward functions logged
    sums: dict  # the rounds' window sums
    version: int  # weight version in the engine when its generation started
    order_after: dict  # the data order's state after its draw (what a checkpoint keeps, once it is handed over)


class RolloutPipeline:
    """The assembly of a run with its rollouts produced ahead, in a background thread (started at the first call).

    Args:
        assembly: the run's `RolloutAssembly` (called from the producer thread only).
        order: the data order it draws from (`state_dict`/`load_state_dict`: datasets.PromptOrder, dataset_kinds.StreamOrder).
        version: () → the weight version in the engine now (the trainer's count of pushes).
        max_staleness: versions a rollout may lag at hand-over (TRL's field), ≥ 0.
        inflight: rollouts started and not yet handed over, at most (≥ 1; TRL's max_inflight_tasks / rollout size).
        heartbeat_stale_after_s: seconds without progress after which the trainer stops waiting (TRL's field).
        weight_syncs: () → the weight pushes' window sums since the last call (the backend's `VLLMGenerator.pop_syncs`),
            called in the producer thread after each rollout it makes: that rollout's push, and an evaluation's (default: none).
    Call:
        () → (rollout, extra, sums) as `RolloutAssembly()`, sums with the pipeline's window sums: `async_rollouts`,
        `async_staleness` (Σ lag), `async_staleness_max`, `async_dropped` (completions), `async_queue` (Σ completions
        waiting at hand-over), `async_trainer_wait` and `async_sampler_idle` (seconds since the last hand-over), and
        the weight pushes made with the rollout (`weight_syncs`; none for a rollout sampled without a push first).
    Raises (from the call):
        EngineError (or whatever the producer raised), re-raised in the trainer's thread; EngineError after
        `heartbeat_stale_after_s` seconds without a rollout or a sign of life.
    """

    def __init__(self, assembly, order, version: Callable[[], int], *, max_staleness: int, inflight: int, heartbeat_stale_after_s: float,
                 weight_syncs: Callable[[], dict] = dict):
        if max_staleness < 0 or inflight < 1:
            raise ValueError(f"max_staleness={max_staleness}, inflight={inflight}: use max_staleness ≥ 0 and inflight ≥ 1.")
        self.assembly, self.order, self.version, self.weight_syncs = assembly, order, version, weight_syncs
        self.max_staleness, self.inflight, self.heartbeat = max_staleness, inflight, heartbeat_stale_after_s
        self.ready: queue.Queue[Tagged] = queue.Queue()
        self.lock = threading.Condition()
        self.requested = self.started = self.taken = 0  # rollouts asked for, started, handed over or dropped
        self.dropped, self.error, self.thread = 0, None, None
        self.beat, self.sampler_idle, self.stopping, self.paused_by, self.producing = time.monotonic(), 0.0, False, 0, False
        self.handed: dict | None = None  # the order after the last hand-over; None: as it is (nothing produced yet)

    # ------------------------------------------------------------------ trainer side
    def __call__(self) -> tuple[Rollout, dict, dict]:
        if self.thread is None:
            self.handed = self.order.state_dict()
            self.thread = threading.Thread(target=self._produce, name="fastgrpo-rollout-producer", daemon=True)
            self.thread.start()
        waited, dropped, start = 0.0, 0, time.monotonic()
        with self.lock:
            self.requested += 1
            self.lock.notify_all()
        while True:
            tagged = self._take()
            staleness = self.version() - tagged.version
            with self.lock:
                self.taken += 1
                if staleness > self.max_staleness:  # TRL's drop: counted, and a replacement admitted
                    self.requested += 1
                    self.dropped += len(tagged.rollout)
                    dropped += len(tagged.rollout)
                    self.lock.notify_all()
                    continue
                self.handed = tagged.order_after
                idle, self.sampler_idle = self.sampler_idle, 0.0
                self.lock.notify_all()
            waited = time.monotonic() - start
            sums = {**tagged.sums, "async_rollouts": 1, "async_staleness": staleness, "async_staleness_max": staleness,
                    "async_dropped": dropped, "async_queue": self.ready.qsize() * len(tagged.rollout), "async_trainer_wait": waited, "async_sampler_idle": idle}
            return tagged.rollout, tagged.extra, sums

    def _take(self) -> Tagged:
        """The next produced rollout; re-raises the producer's error; EngineError once it has shown no life for too long."""
        while True:
            try:
                return self.ready.get(timeout=POLL_S)
            except queue.Empty:
                pass
            if self.error is not None:
                raise self.error
            silent = time.monotonic() - self.beat
            if silent > self.heartbeat or not self.thread.is_alive():
                raise EngineError(
                    f"the rollout producer made no progress for {silent:.0f} s (heartbeat_stale_after_s={self.heartbeat:g}): check "
                    "the vLLM server, or raise heartbeat_stale_after_s if one rollout's sampling or reward functions (which run "
                    "in the producer) take longer."
                )

    @property
    def handed_order(self) -> dict:
        """The data order's state after the last rollout handed to the trainer (not after the producer's draws ahead)."""
        with self.lock:
            return self.handed if self.handed is not None else self.order.state_dict()

    @contextlib.contextmanager
    def paused(self):
        """No rollout is produced inside this context: it waits for the one being produced (its generation, scores and
        π_behaviour), and the producer starts no other until it ends. For an evaluation between steps, which samples
        and scores through the same assembly, backend and reward hooks in the trainer's thread."""
        with self.lock:
            self.paused_by += 1
            while self.producing and self.error is None and self.thread.is_alive():
                self.lock.wait(timeout=POLL_S)
        try:
            yield
        finally:
            with self.lock:
                self.paused_by -= 1
                self.lock.notify_all()

    def next_pass(self) -> dict:
        """A pass cut short (a callback's `control.should_epoch_stop`; run/epochs.EpochClock.cut_pass): the rollouts made
        ahead are dropped (the synchronous loop never samples them; not counted as stale) and the data order moves to the
        start of the pass after the last rollout handed over, as `InOrder.next_pass` moves it; → that order's state."""
        with self.paused():
            with self.lock:
                ahead = self.started - self.taken
            for _ in range(ahead):  # all made or making: paused waits for the one in production, which may not be queued yet
                self._take()
            with self.lock:  # the replacements are admitted as a stale drop's are: as far ahead as before
                self.taken, self.requested = self.taken + ahead, self.requested + ahead
                self.handed = next_pass(self.order, self.handed if self.handed is not None else self.order.state_dict())
                return self.handed

    def close(self) -> None:
        """Stop the producer: it ends after its current generation request (the thread is a daemon: exit never waits on it)."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=POLL_S * 2)

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the data order after the last rollout handed over, the drop count, the assembly's state."""
        with self.lock:
            order = self.handed if self.handed is not None else self.order.state_dict()
            return {"order": order, "dropped": self.dropped, "assembly": self.assembly.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore `state_dict()` before the first call (a checkpoint of the synchronous loop holds the assembly's state only)."""
        if state is None or "order" not in state:
            self.assembly.load_state_dict(state)
            return
        self.order.load_state_dict(state["order"])
        self.dropped = state["dropped"]
        self.assembly.load_state_dict(state["assembly"])

    # ------------------------------------------------------------------ producer side
    def _admitted(self) -> bool:
        return self.started < self.requested + self.max_staleness and self.started - self.taken < self.inflight

    def _produce(self) -> None:
        try:
            while True:
                idle_from = time.monotonic()
                with self.lock:
                    while not self.stopping and (self.paused_by or not self._admitted()):
                        self.beat = time.monotonic()  # waiting on the trainer is a sign of life
                        self.lock.wait(timeout=POLL_S)
                    if self.stopping:
                        return
                    self.sampler_idle += time.monotonic() - idle_from
                    self.started, self.producing = self.started + 1, True
                version = self.version()  # before the request: a push during it makes the samples fresher, never staler
                self.beat = time.monotonic()
                try:
                    rollout, extra, sums = self.assembly()
                finally:
                    with self.lock:
                        self.producing = False
                        self.lock.notify_all()
                self.beat = time.monotonic()
                self.ready.put(Tagged(rollout, extra, {**sums, **self.weight_syncs()}, version, self.order.state_dict()))
        except BaseException as err:  # noqa: BLE001 — handed to the trainer's thread, raised there
            self.error = err


def next_pass(order, after: dict) -> dict:
    """Load into `order` (datasets.PromptOrder, dataset_kinds.StreamOrder) the start of the pass after the state `after`
    ({"epoch", "position"}), or `after` itself where it stands at a pass's start; → the state loaded."""
    state = {"epoch": after["epoch"] + 1, "position": 0} if after["position"] else dict(after)
    order.load_state_dict(state)
    return state


def inflight_rollouts(max_inflight_tasks: int, max_staleness: int, generation_batch_size: int, queue_maxsize: int) -> int:
    """TRL's max_inflight_tasks and queue_maxsize (completions; each at least one rollout, config/checks.py) as whole rollouts.

    -1 (auto) is TRL's max(max_staleness, 1) optimizer steps' worth; a rollout is the unit sent to the engine,
    so the count is whole rollouts, rounded down, and the queue bound caps it.
    """
    tasks = max(max_staleness, 1) * generation_batch_size if max_inflight_tasks < 0 else max_inflight_tasks
    return min(tasks, queue_maxsize) // generation_batch_size


class InOrder:
    """The synchronous loop's rollouts: each made by the assembly when the trainer asks, in its thread.

    `RolloutPipeline`'s contract (call, `handed_order`, `paused`, `next_pass`, `state_dict`/`load_state_dict`, `close`), so the
    trainer calls either the same way.
    """

    def __init__(self, assembly, order):
        self.assembly, self.order = assembly, order

    def __call__(self) -> tuple[Rollout, dict, dict]:
        return self.assembly()

    @property
    def handed_order(self) -> dict:
        """The data order's state after the last rollout made."""
        return self.order.state_dict()

    def paused(self):
        """Nothing runs beside the trainer: a context that does nothing."""
        return contextlib.nullcontext()

    def next_pass(self) -> dict:
        """A pass cut short (a callback's `control.should_epoch_stop`): the data order moved to the next pass's start,
        unless it stands at a pass's start already; → its state."""
        return next_pass(self.order, self.order.state_dict())

    def state_dict(self):
        """The assembly's state (DAPO's carry-over); the order is the checkpoint's own."""
        return self.assembly.state_dict()

    def load_state_dict(self, state) -> None:
        """Restore `state_dict()`, or the assembly's part of a `RolloutPipeline`'s (a run that overlapped, resumed without;
        the checkpoint's own order is already the one after the last rollout trained)."""
        self.assembly.load_state_dict(state["assembly"] if isinstance(state, dict) and "order" in state else state)

    def close(self) -> None:
        """Nothing to stop."""


def overlapped(args, assembly, order, version: Callable[[], int], backend) -> InOrder | RolloutPipeline:
    """The run's rollouts: `InOrder` (max_staleness None, the synchronous loop), or a `RolloutPipeline` made ahead, whose
    `backend` is the vLLM server's `VLLMGenerator` (config/checks.py refuses another engine for the overlap)."""
    if args.max_staleness is None:
        return InOrder(assembly, order)
    inflight = inflight_rollouts(args.max_inflight_tasks, args.max_staleness, args.generation_batch_size, args.queue_maxsize)
    return RolloutPipeline(assembly, order, version, max_staleness=args.max_staleness, inflight=inflight,
                           heartbeat_stale_after_s=args.heartbeat_stale_after_s, weight_syncs=backend.pop_syncs)
