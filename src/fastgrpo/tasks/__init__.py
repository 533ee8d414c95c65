"""tasks/: the built-in tasks (reasoning-gym, the calculator agent task) and the built-in rewards.
Imports nothing else of fastgrpo's but tasks/."""
