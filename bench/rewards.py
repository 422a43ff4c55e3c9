"""Reward functions the benchmarks train on (`{kind: callable, function: 'bench.rewards:NAME'}`)."""


def vowel_share(prompts, completions, **fields):
    """The share of an answer's characters that are vowels: a random model's answers already differ in it, so
    every group has signal from the first step and a few GRPO steps raise it."""
    return [sum(c in "aeiou" for c in text) / max(1, len(text)) for text in completions]
