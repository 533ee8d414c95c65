from fastgrpo import GRPOConfig, GRPOTrainer      # was: from trl import GRPOConfig, GRPOTrainer
from fastgrpo.data import reasoning_gym_dataset
from fastgrpo.rewards import reasoning_gym_reward

# "Calculate 5 - -4." with the system prompt "Reply with only the final answer, nothing else."
dataset = reasoning_gym_dataset(["basic_arithmetic"], size=400,
                                task_kwargs={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})

def reward_short(completions, **kwargs):        # TRL's protocol; chat prompts → message completions
    texts = [c[0]["content"].strip() for c in completions]
    return [max(0.0, 1 - len(t) / 100) if t else 0.0 for t in texts]

args = GRPOConfig(output_dir="smollm2-grpo", learning_rate=3e-5, lr_scheduler_type="constant",
                  num_generations=8, per_device_train_batch_size=8, steps_per_generation=2,
                  max_prompt_length=128, max_completion_length=32, max_steps=48, logging_steps=8,
                  log_completions=True, num_completions_to_print=2)
trainer = GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=[reasoning_gym_reward, reward_short],
                      args=args, train_dataset=dataset)
trainer.train()                      # trainer.train(resume_from_checkpoint=True) continues the latest checkpoint
trainer.save_model("smollm2-grpo/final")
