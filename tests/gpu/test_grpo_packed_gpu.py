"""The GRPO update's packed layout as the GPU check runs it (update_layout: packed, attention: flex_attention,
compile: true) against the shared prefix, on cuda in fp32. Flex attention has no CPU backward: this runs only
there (bench/gpu/check.sh's gpu-tests part selects it by name)."""

import pytest
import torch

from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.completions import (
    RowLayout,
    check_head_reads_decoder,
    completion_batch,
    completion_logprobs,
)
from cascade.stages.train.losses import grpo_loss
from cascade.stages.train.model import build_tiny_model
from cascade.stages.train.packing import check_packing_isolates_rows, compile_layers
from cascade.stages.train.training import backward_micro_batches
from tests.conftest import needs_cuda
from tests.stages.test_training import ragged_rollouts

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


@needs_cuda
def test_packed_flex_compiled_update_gives_the_shared_prefix_logprobs_on_cuda():
    """12 ragged rows at temperature 0.8, top_p 0.95, micro-batches of 4 rows in packed rows of 128 tokens: the
    logprobs, the loss and the gradient equal the eager sdpa shared prefix's, up to flex's and the fused kernels'
    rounding."""
    vocab, pad = 1024, 0
    batch = completion_batch(ragged_rollouts(vocab, prompts=3, group=4, seed=3), pad, 0.8, 0.95).to("cuda")
    adv = torch.linspace(-1.5, 1.5, len(batch), device="cuda")
    num_tokens = int(batch.mask.sum())

    def update(layout: RowLayout, fast: bool):
        model = build_tiny_model(SMALL, vocab, seed=0).cuda()
        if fast:  # as GRPO's prepare_update sets the model up: flex attention, the probes, then the compile
            model.set_attn_implementation("flex_attention")
            check_packing_isolates_rows(model, torch.device("cuda"))
            check_head_reads_decoder(model, torch.device("cuda"))
            compile_layers(model)
        logps = []

        def loss_of(part):
            logp, _ = completion_logprobs(model, batch, part, pad, layout)
            logps.append(logp.detach())
            return grpo_loss(logp, logp.detach(), adv[part], batch.mask[part], num_tokens)

        loss = backward_micro_batches(len(batch), 4, loss_of)
        return torch.cat(logps), loss, [p.grad for p in model.parameters()]

    want_logp, want_loss, want_grads = update(RowLayout(), fast=False)
    logp, loss, grads = update(RowLayout("packed", 128, compiled=True), fast=True)
    torch.testing.assert_close(logp * batch.mask, want_logp * batch.mask, atol=1e-4, rtol=0)
    assert loss == pytest.approx(want_loss, abs=1e-4)
    for g, want in zip(grads, want_grads):
        torch.testing.assert_close(g, want, atol=1e-4, rtol=0)
