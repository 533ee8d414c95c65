"""rollout/: the rollout records, prompts, producers (single turn, agents/, rollout_func), rewards and reward
models, the group filter (DAPO), and the assembly of one rollout with its Â. Imports config/, algo/, model/,
generation/, tasks/."""
