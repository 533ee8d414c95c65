"""TRL's `trl.experimental` trainers that fastgrpo runs: `async_grpo` (generation overlapped with training)."""
