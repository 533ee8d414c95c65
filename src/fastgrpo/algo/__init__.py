"""algo/: the GRPO maths on tensors only — advantages, objectives, losses, token statistics, the sampler–trainer
correction, the entropy coefficient, how metrics reduce. Imports torch and nothing else of fastgrpo's but algo/."""
