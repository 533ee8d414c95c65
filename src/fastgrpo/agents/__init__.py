"""Agent training with TRL 1.16's API: `tools=`, `environment_factory=`, `rollout_func=` (README "Agents: tools and environments").

Modules: tools.py (schemas, calling), environments.py (factories, pool, reset,
get_reward), chat_format.py (the tool chat template, parsing tool calls,
tool-reply tokens), multiturn.py (the loop), cached_turns.py (turns that keep
the KV cache), rollout_func.py (a user's rollout), producers.py (which
producer a trainer uses), calculator.py (the built-in task).
"""
