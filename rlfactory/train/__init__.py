"""Training: GRPO glue over verl's core_algos, the local engine loop, SFT warm-up, checkpoints, the verl engine."""
