"""Agent training with TRL 1.16's API: `tools=`, `environment_factory=`, `rollout_func=` (README "Agents: tools and environments").

Modules: tools.py (schemas, calling), environments.py (factories, pool, reset,
get_reward), chat_format.py (the tool chat template, parsing tool calls,
tool-reply tokens), multiturn.py (the loop), rollout_func.py (a user's rollout).
Elsewhere: the turns that keep the KV cache (generation/cached_turns.py), which
producer a trainer uses (rollout/producers.py), the built-in calculator task
(tasks/calculator.py).
"""
