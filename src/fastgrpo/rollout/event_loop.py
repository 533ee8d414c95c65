"""One event loop for the user's async code: async reward functions, tools and environment methods.

TRL 1.16's GRPOTrainer awaits them all on one event loop that runs in a daemon thread for the
trainer's life (`trl.trainer.utils.start_event_loop_in_daemon`), so async code may keep state that is
bound to its loop between calls: an `asyncio.Semaphore` limiting concurrent requests, an HTTP client's
connection pool, a session's queue. A fresh loop per call (`asyncio.run`) broke each of them from the
second call on ("… is bound to a different event loop"), which a tool's caller reads as a failed call.

The loop runs in its own thread, so awaiting works from inside a running loop (a notebook) too. It is
made on first use, once per process (a forked child makes its own: the parent's thread is not in it).

Not here: which functions are async and what their results mean (rewards.py, agents/tools.py).
"""

from __future__ import annotations

import asyncio
import os
import threading

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None


def _shared_loop() -> asyncio.AbstractEventLoop:
    """The process's loop, started in a daemon thread on first use."""
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid():
            loop = asyncio.new_event_loop()

            def run():
                asyncio.set_event_loop(loop)
                loop.run_forever()

            threading.Thread(target=run, name="fastgrpo-async", daemon=True).start()
            _loop, _pid = loop, os.getpid()
        return _loop


def gather(awaitables: list) -> list:
    """Await `awaitables` concurrently on the shared loop and wait for all of them.

    Returns:
        Their results, in order; an exception one raised is its result (returned, not raised), as
        `asyncio.gather(..., return_exceptions=True)` gives it, SystemExit and KeyboardInterrupt too: raised out
        of a task they stop the loop's thread, and the caller (TRL's too) waited for the result forever.
    """

    async def settled(awaitable):
        try:
            return await awaitable
        except (SystemExit, KeyboardInterrupt) as err:  # the loop's thread would die with it; the caller decides
            return err

    async def together():
        return await asyncio.gather(*map(settled, awaitables), return_exceptions=True)

    return asyncio.run_coroutine_threadsafe(together(), _shared_loop()).result()
