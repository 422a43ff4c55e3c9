"""The rewards an RL stage asks for: the sources a recipe's `reward:` may name (reward_sources), what they score
(rewards) and an LLM judge behind an endpoint (judge)."""
