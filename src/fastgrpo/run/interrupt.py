"""Ctrl-C during training: finish the optimizer step, save a checkpoint, stop with a resume hint.

`StopOnInterrupt` is a context manager around the training loop. The first
SIGINT only sets a flag (and says so); the loop checks `requested(accelerator)`
after each optimizer step, so the checkpoint holds a whole step. A second
SIGINT restores Python's handler and raises `KeyboardInterrupt` at once.
Outside the main thread (where signal handlers cannot be set) it does nothing.

Not here: what a checkpoint holds (run/checkpoint_files.py).
"""

from __future__ import annotations

import signal
import sys
import threading

import torch


class TrainingInterrupted(KeyboardInterrupt):
    """Raised by `train()` after the checkpoint of an interrupted run is saved; the message says how to resume."""


class StopOnInterrupt:
    """Turn the first Ctrl-C into a request to stop after the current optimizer step."""

    def __init__(self):
        self.flag = False
        self.previous = None

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None

    def _handle(self, signum, frame) -> None:
        if self.flag:  # the second Ctrl-C: abort now
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
            raise KeyboardInterrupt
        self.flag = True
        print("\nfastgrpo: stopping after this optimizer step and saving a checkpoint (Ctrl-C again to abort now).", file=sys.stderr)

    def requested(self, accelerator) -> bool:
        """Whether any process was interrupted; every process gets the same answer (one all-reduce when several run)."""
        if accelerator.num_processes == 1:
            return self.flag
        flag = torch.tensor([float(self.flag)], device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="max") > 0)
