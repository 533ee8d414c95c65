"""`TrainerState.epoch` and the end of a pass over the training prompts, as Trainer counts them under TRL's GRPO loader.

TRL's data loader yields each generation batch once per optimizer step that trains on it (its `RepeatSampler`
repeats a batch μ × steps_per_generation times), so Trainer's epoch, steps taken over steps per pass, moves by an
equal share of a rollout's prompts at each of the rollout's optimizer steps. fastgrpo draws a rollout's prompts at
once, so the share is worked out from the data order: with `drawn` = passes + position / size of the order's state,

    epoch = drawn before the rollout + (drawn after − drawn before) × done / steps_per_rollout

after `done` of the rollout's steps. A rollout whose reuse target_kl ended early counts whole at its last step;
DAPO's rounds count every prompt they drew. A pass ends at the step that finishes a rollout whose draw reached the
end of the data. Under the overlap the order's state is the one after the rollout handed to the trainer
(`handed_order`), not after the producer's draws ahead.

A stream has no length: Trainer then takes max_steps steps per pass (its `steps_in_epoch` without a
`len(dataloader)`), so epoch = passes finished + steps since the pass began / max_steps.

A callback's `control.should_epoch_stop` cuts the pass short where Trainer leaves its epoch's loop (`cut_pass`): the
rest of the pass's prompts are skipped, the next rollout draws from the next pass and its epoch starts there; the
rollout in hand trains its remaining steps (TRL's buffered generation batch does), their epoch the next pass's start;
under the overlap the rollouts made ahead are dropped (the rollouts' `next_pass`), so the run draws as the synchronous loop.
Trainer's loop then ends after `num_train_epochs` passes, before max_steps (`passes_over`).

Not here: the data order itself (datasets.PromptOrder, dataset_kinds.StreamOrder), the callbacks' events (callbacks.py).
"""

from __future__ import annotations

import math


class EpochClock:
    """The run's epoch at each optimizer step (module docstring: Trainer's count under TRL's loader).

    Args:
        size: prompts in a pass over the training data (`PromptOrder.per_pass`: whole rollouts, as TRL's loader); None for a stream.
        steps_per_rollout: optimizer steps a rollout trains (μ × steps_per_generation / gradient_accumulation_steps).
        max_steps: the run's optimizer steps (a stream's steps per pass).
    """

    def __init__(self, size: int | None, steps_per_rollout: int, max_steps: int):
        self.size, self.steps_per_rollout, self.max_steps = size, steps_per_rollout, max_steps
        self.span = (0.0, 0.0)  # passes drawn before and after the rollout now training
        self.pass_start = 0  # the step the current pass began at (a stream's epoch counts from it)
        self.cut: tuple[float, int] | None = None  # a pass cut short, not yet drawn from: (the next pass, the step it was cut at)
        self.was_cut = False  # some pass was cut short (`passes_over`)

    def drawn(self, order: dict) -> float:
        """Passes drawn by a data order's state ({"epoch", "position"}): whole passes plus the drawn share of the next."""
        return order["epoch"] + (order["position"] / self.size if self.size else 0.0)

    def drew(self, order: dict) -> None:
        """A rollout was taken, the data order then at `order` (its state after the rollout's draw). After a pass cut
        short, the first rollout drawn from the next pass starts at it (the overlap's rollouts made ahead of the cut were
        dropped: this one is drawn from the next pass)."""
        drawn = self.drawn(order)
        if self.cut is not None:
            self.span, self.pass_start, self.cut = (self.cut[0], drawn), self.cut[1], None
        else:
            self.span = (self.span[1], drawn)

    def cut_pass(self, next_pass: dict, step: int) -> bool:
        """A callback set `control.should_epoch_stop` at `step` (not a pass's last), and the rest of the pass was skipped:
        the data order now stands at `next_pass` (the state the rollouts' `next_pass()` moved it to; the overlap's rollouts
        made ahead dropped). Returns True: the epoch's end is now pending (the trainer's `epoch_end_pending`)."""
        self.cut, self.was_cut = (self.drawn(next_pass), step), True
        return True

    def passes_over(self, num_train_epochs: int) -> bool:
        """At an epoch's end: whether the passes drawn reach `num_train_epochs` (state.num_train_epochs) after a pass was
        cut short, where Trainer's epoch loop ends; never without a cut (max_steps ends such a run, DAPO's rounds may
        draw a pass ahead of Trainer's count)."""
        drawn = self.cut[0] if self.cut is not None else self.span[1]
        return self.was_cut and math.floor(drawn) >= num_train_epochs

    def __call__(self, step: int, done: int) -> float:
        """The epoch after `step` optimizer steps, `done` of them on the rollout now training."""
        if self.cut is not None and step > self.cut[1]:  # the rollout in hand, after its pass was cut: at the next pass's start
            return self.cut[0]
        if self.size is None:
            return math.floor(self.span[1]) + (step - self.pass_start) / self.max_steps
        start, end = self.span
        if done >= self.steps_per_rollout:  # exactly `end` (start + (end − start) may round): 1.0 at a pass's end, as eval_delay compares it
            return end
        return start + (end - start) * done / self.steps_per_rollout

    def pass_ended(self, step: int, done: int) -> bool:
        """Whether `step` finished the rollout that reached the end of a pass (Trainer's on_epoch_end comes after it); not
        while a pass cut short is not yet drawn from (its end came at the cut)."""
        ended = done >= self.steps_per_rollout and math.floor(self.span[1]) > math.floor(self.span[0]) and self.cut is None
        if ended:
            self.pass_start = step
        return ended

    def state_dict(self) -> dict:
        return {"span": self.span, "pass_start": self.pass_start, "cut": self.cut, "was_cut": self.was_cut}

    def load_state_dict(self, state: dict | None, order: dict) -> None:
        """Restore `state_dict()`; None (a checkpoint saved before the clock was): the rollout in progress counts whole."""
        if state is None:
            self.span = (self.drawn(order),) * 2
        else:
            self.span, self.pass_start = tuple(state["span"]), state["pass_start"]
            cut = state.get("cut")  # absent from a checkpoint saved before passes could be cut
            self.cut, self.was_cut = tuple(cut) if cut is not None else None, state.get("was_cut", False)
