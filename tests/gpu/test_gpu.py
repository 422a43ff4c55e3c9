"""GPU checks: SFT and GRPO steps on cuda in bf16 for smollm2-135m's architecture and a ~0.5B Qwen2 shape (random
weights from their configs), throughput against the GPU's bf16 peak, and the CUDA loss curve against the CPU's.

The step code is bench/bench_gpu.py's, so the test and the benchmark measure one thing, and it runs where only torch
and transformers are installed. Without CUDA the GPU tests skip and say so; the checks of the bench's own
arithmetic and code paths run on the CPU everywhere. bench/RESULTS.md records which GPU runs have happened.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.conftest import needs_cuda

_spec = importlib.util.spec_from_file_location(
    "bench_gpu", Path(__file__).resolve().parents[2] / "bench" / "bench_gpu.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

BF16_CURVE_TOLERANCE = 2e-2  # relative, per step: bf16 keeps 8 mantissa bits; 5 steps of AdamW drift within it


def test_flop_count_of_the_smollm2_architecture_by_hand():
    """Per layer q, o 576^2, k, v 576x192, gate/up/down 576x1536 = 3,538,944; x 30 layers + the 49152x576 head."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(bench.smollm2_config())
    assert bench.matmul_params(model) == 30 * 3_538_944 + 49152 * 576 == 134_479_872
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # SmolLM2-135M's published count
    assert bench.flops_per_token(model, 1024) == 6 * 134_479_872 + 12 * 30 * 576 * 1024


def test_bf16_curve_tolerance_holds_for_cpu_autocast():
    """The same bf16 autocast on the CPU stays within the tolerance the cuda curve is held to (2 layers)."""
    fp32 = bench.loss_curve("smollm2-135m", "cpu", False, 4, num_layers=2)
    bf16 = bench.loss_curve("smollm2-135m", "cpu", True, 4, num_layers=2)
    assert fp32[0] > fp32[1] > fp32[2] > fp32[3]  # the repeated batch is being learned
    assert 1e-5 < bench.max_relative_gap(bf16, fp32) < BF16_CURVE_TOLERANCE


def test_grpo_step_code_runs_on_cpu():
    """The bench's GRPO step (generate, reward, advantages, update) on a 1-layer model: every sampled token counts."""
    model = bench.build_model("smollm2-135m", "cpu", num_layers=1)
    optimizer = bench.make_optimizer(model, 1e-3)
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    prompts = torch.randint(3, 1000, (2, 5), generator=torch.Generator().manual_seed(0))
    row = bench.grpo_step(model, optimizer, prompts, group=3, new_tokens=4, device="cpu", bf16=False)
    assert row["sampled_tokens"] == 2 * 3 * 4 and row["trained_tokens"] == 2 * 3 * (5 + 4)
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)


@needs_cuda
@pytest.mark.parametrize("arch", list(bench.ARCHS))
def test_sft_loss_curve_on_cuda_bf16_matches_the_cpu(arch):
    cuda = bench.loss_curve(arch, "cuda", True, 5)
    cpu = bench.loss_curve(arch, "cpu", False, 5)
    assert cpu[-1] < cpu[0]
    assert bench.max_relative_gap(cuda, cpu) < BF16_CURVE_TOLERANCE, (cuda, cpu)


@needs_cuda
@pytest.mark.parametrize("arch", list(bench.ARCHS))
def test_grpo_gradient_on_cuda_bf16_matches_the_cpu(arch):
    """The same rollouts and advantages: the cuda bf16 gradient points where the CPU fp32 one does."""
    grads = []
    for device, bf16 in (("cuda", True), ("cpu", False)):
        model = bench.build_model(arch, device)
        ids = torch.randint(3, model.config.vocab_size, (4, 48), generator=torch.Generator().manual_seed(1))
        mask = torch.zeros(4, 47)
        mask[:, 16:] = 1.0
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
        bench.grpo_backward(model, ids, mask, advantages, device, bf16)
        grads.append(torch.cat([p.grad.float().flatten().cpu() for p in model.parameters()]))
        del model
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99


@needs_cuda
@pytest.mark.parametrize("arch", list(bench.ARCHS))
def test_sft_and_grpo_steps_on_cuda_report_throughput(arch):
    sft = bench.bench_sft(arch, steps=3, batch=8, seq_len=512)
    assert sft["tokens_per_s"] > 0 and (sft["mfu"] is None or 0 < sft["mfu"] < 1), sft
    grpo = bench.bench_grpo(arch, steps=2, prompts=4, group=4, prompt_len=32, new_tokens=32)
    assert grpo["sampled_tokens_per_s"] > 0 and grpo["update_tokens_per_s"] > 0, grpo


@needs_cuda
def test_flex_attention_gives_the_padded_loss_and_gradients_on_cuda():
    """Our SFT's packed rows under flex_attention (block-sparse, SFTConfig.attention) on cuda, fp32: the loss and
    gradients of the same rows padded under sdpa. (flex has no CPU backward: this runs only here.)"""
    from cascade.stages.kinds.sft.run_sft import model_rows
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.losses import sft_loss, token_logprobs
    from cascade.stages.train.model import Example, build_tiny_model
    from cascade.stages.train.training import backward_micro_batches

    rng = torch.Generator().manual_seed(0)
    lengths = [40, 9, 6, 12, 33, 5, 7, 14, 4, 11]
    rows = [Example(torch.randint(3, 1000, (n,), generator=rng).tolist(), ((n // 2, n),)) for n in lengths]
    small = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)

    def loss_and_grads(attention: str, packing: bool):
        model = build_tiny_model(small, 1024, seed=0).cuda()
        model.set_attn_implementation(attention)
        ids, mask, positions = (t.cuda() for t in model_rows(rows, pad=0, packing=packing, pack_length=64))
        num_tokens = int(mask[:, 1:].sum())

        def loss_of(part):
            logits = model(input_ids=ids[part], position_ids=positions[part], use_cache=False).logits
            return sft_loss(token_logprobs(logits[:, :-1], ids[part, 1:]), mask[part, 1:], num_tokens)

        return backward_micro_batches(len(ids), len(ids), loss_of), [p.grad for p in model.parameters()]

    want_loss, want_grads = loss_and_grads("sdpa", packing=False)
    loss, grads = loss_and_grads("flex_attention", packing=True)
    assert loss == pytest.approx(want_loss, abs=1e-4)
    for g, want in zip(grads, want_grads):
        torch.testing.assert_close(g, want, atol=1e-4, rtol=0)
