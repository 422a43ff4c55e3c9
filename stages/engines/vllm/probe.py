"""The weight-sync probe's reference: after a reload, the server's logprobs of a fixed probe sequence must match the
trainer's own forward pass (stages/engines/vllm/engine.py checks them and raises `WeightSyncError`)."""

from __future__ import annotations

import torch

PROBE_LENGTH = 32


class WeightSyncError(RuntimeError):
    """The server's logprobs after a weight reload disagree with the trainer's forward pass."""


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module, token_ids: list[int]) -> list[float]:
    """log p(token_ids[t] | token_ids[:t]) for t >= 1 from the trainer's own float32 forward (eval mode)."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        ids = torch.tensor([token_ids], device=device)
        logits = model(input_ids=ids).logits[0, :-1].float()
    finally:
        model.train(was_training)
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, ids[0, 1:, None]).squeeze(-1).cpu().tolist()
