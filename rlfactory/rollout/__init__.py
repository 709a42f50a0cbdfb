"""Rollouts: generation engines (HF, vLLM), the multi-turn AgentLoop, Trajectory records, horizon schedules."""
