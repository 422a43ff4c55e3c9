"""A policy's scores and what they decide: the eval (evaluate), benchmarks beside the domains (benchmarks), the
in-run gate (gate) and regression evals against a baseline (regression)."""
