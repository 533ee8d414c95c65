"""An error that ends train() says what output_dir holds to go on from, which only the trainer knows.

`name_the_resume` is a context manager around the training loop. Whatever ends the run early, this run's last
checkpoint and how to resume from it (or that none was saved yet) reach the user beside the error:
- an `EngineError` (a vLLM server or engine that died, hung or went silent mid-run) in its message, which the CLI
  prints as one line; the engine's own part says what happened and the engine's fix;
- any other exception (a reward function, an environment, a callback raising; a second Ctrl-C, which aborts at once)
  as a note under its traceback (PEP 678), its message and type untouched.
Ctrl-C's own stop (`TrainingInterrupted`) names the checkpoint it saved already.

Not here: what a checkpoint holds and where they are (run/checkpoint_files.py), Ctrl-C (run/interrupt.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from . import checkpoint_files as ckpt
from .interrupt import TrainingInterrupted
from ..generation.contract import EngineError


def what_to_resume(args: Any, run_id: str, step: int, max_steps: int) -> str:
    """The sentence naming this run's last checkpoint in `args.output_dir` and how to resume from it, or saying that
    none was saved yet (with the save setting, so the next run can save sooner)."""
    kept = ckpt.checkpoints(args.output_dir, run_id)
    if kept:
        return (f"The last checkpoint, {kept[-1]}, is kept: resume with trainer.train(resume_from_checkpoint=True), or the "
                "same fastgrpo train command plus --resume.")
    every = f"save_strategy={args.save_strategy!r}" + (f", save_steps={args.save_steps:g}" if args.save_strategy == "steps" else "")
    return f"No checkpoint of this run was saved yet (step {step}/{max_steps}, {every}), so there is nothing to resume: start the run again."


@contextmanager
def name_the_resume(trainer: Any) -> Iterator[None]:
    """Around train()'s loop (`trainer`: its args, run_id, step, max_steps): see the module's docstring.

    Raises:
        EngineError: the one raised inside, its message completed (the same exception, with its traceback).
        BaseException: any other raised inside but `TrainingInterrupted`, with the note added.
    """
    try:
        yield
    except TrainingInterrupted:
        raise
    except EngineError as err:
        err.args = (f"{err} {what_to_resume(trainer.args, trainer.run_id, trainer.step, trainer.max_steps)}",)
        raise
    except (Exception, KeyboardInterrupt) as err:
        err.add_note(f"fastgrpo: {what_to_resume(trainer.args, trainer.run_id, trainer.step, trainer.max_steps)}")
        raise
