"""update/: the log-prob passes (packed, chunked), π_old and π_ref, and one optimizer step.
Imports config/, algo/, model/, rollout/ (its records)."""
