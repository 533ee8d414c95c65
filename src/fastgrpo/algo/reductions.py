"""How each logged metric reduces over micro-batches, processes and a logging window: the declared table.

`EXTREMES` names every metric kept as a minimum, a maximum or its last value (one the same on every process);
every other metric is a sum (means are sums divided by counts when the window is written). A new min/max metric is
one entry here.

Not here: computing the metrics (losses.py, sampling_correction.py, run/metrics.py), the window (run/metrics.py).
"""

from __future__ import annotations

import torch

# metric key → how it reduces: min, max or last (anything not listed is summed)
EXTREMES: dict[str, str] = {
    "grad_norm": "last",  # Trainer logs the last step's norm (global: the same on every process), not the window's mean
    "completion_length_min": "min",
    "completion_length_max": "max",
    "terminated_length_min": "min",
    "terminated_length_max": "max",
    "clip_low_min": "min",
    "clip_high_max": "max",
    "logp_diff_max": "max",
    "is_ratio_min": "min",
    "is_ratio_max": "max",
    "async_staleness_max": "max",  # weight versions a trained rollout lagged (rollout/async_producer.py)
}


def accumulate(sums: dict, values: dict) -> None:
    """Fold one micro-batch's metric `values` (tensors) into `sums`, in place: `EXTREMES`' min or max, else a sum."""
    for key, value in values.items():
        if key in sums and key in EXTREMES:
            value = torch.minimum(sums[key], value) if EXTREMES[key] == "min" else torch.maximum(sums[key], value)
        elif key in sums:
            value = sums[key] + value
        sums[key] = value
