"""LoRA (Hu et al. 2021, arXiv 2106.09685) through peft, for every training stage (`lora:` in its config).

Each targeted linear layer computes

    h = W x + (alpha / r) * B A x,    A: [r, in] (random init), B: [out, r] (zeros: training starts at W)

and only A and B train, with a stage's freshly made heads (the reward model's `score`) trained whole beside them.
peft injects its layers into the HF module in place, so the model keeps its class, its forward and every stage's
code path; the optimizer holds the trainable tensors only.

A checkpoint stays a plain HF model: `merged_state_dict` folds W + (alpha / r) B A into each layer's weight
(what `transformers` loads, what the next stage starts from and what an engine samples from), and the adapter is
saved beside it in peft's own format (`adapter/`, read by `PeftModel.from_pretrained` on the stage's start
model). A step checkpoint's train state holds the unmerged W, A, B and the optimizer's moments, so a resume
continues exactly where it stopped.

Deviations from peft's own routines, and why: merging computes each layer's delta instead of calling
`merge_and_unload()`, which rewrites the training module (and merge-then-unmerge leaves W off by a rounding each
step); the engines sample from a plain copy of the model holding the merged weights (`MergedCopy`), because the
lean decoder reads each projection's `weight`, which under peft is W alone; under torchrun the merge reads the
weights gathered from FSDP2's shards (`merged_state_dict(model, state)`), since the module holds shards of W, A
and B.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cascade.stages.recipe.config_base import LoraConfig

ADAPTER_DIR = "adapter"  # beside model/ in a stage checkpoint
BASE_MODEL_DIR = "base_model"  # beside them: the model an adapter adapts, where no other place holds it
ADAPTER = "default"  # peft's name for the one adapter a stage trains


def add_lora(model: torch.nn.Module, cfg: LoraConfig, seed: int, heads: tuple[str, ...] = ()) -> torch.nn.Module:
    """`model` with adapters injected (in place) and everything else frozen but `heads`, trained whole. A is drawn
    from its own generator seeded by `seed`, so the adapter's start is one function of the recipe's seed."""
    import peft
    from peft.tuners.lora import LoraLayer

    config = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules,
        modules_to_save=list(heads) or None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    if getattr(model.config, "tie_word_embeddings", False) and isinstance(model.get_output_embeddings(), LoraLayer):
        raise ValueError(
            "lora.target_modules adapts the output head, which shares its weight with the input embedding "
            "(tie_word_embeddings): a merged checkpoint cannot hold both; leave the head out"
        )
    return model


def unknown_targets(model: torch.nn.Module, targets: list[str]) -> tuple[list[str], list[str]]:
    """(the targets that match no layer of `model` an adapter can take, the names that would): peft takes a target
    to mean every module whose name is it or ends in `.<target>`, and adapts linear and embedding layers; a
    target that matches nothing is refused only when the stage starts, and one of several is dropped silently."""
    layers = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
    unknown = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in layers)]
    return unknown, sorted({n.rpartition(".")[2] for n in layers})


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The plain model's state dict: each adapted layer's weight W + (alpha / r) B A under the layer's own name,
    each trained head under its own name, nothing of peft's. state: the model's whole state dict gathered from
    its FSDP2 shards (stages.scale.distributed); None: the module's own. The module is not changed."""
    from peft.tuners.lora import LoraLayer

    state = model.state_dict(keep_vars=False) if state is None else state
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if ".lora_" in key or ".original_module." in key:
            continue
        key = key.replace(f".modules_to_save.{ADAPTER}.", ".")
        owner, _, leaf = key.rpartition(".")
        if owner.endswith(".base_layer"):
            owner = owner.removesuffix(".base_layer")
            key = f"{owner}.{leaf}"
            if leaf == "weight":
                tensor = tensor + lora_delta(layers[owner], owner, state).to(tensor.dtype)
        merged[key] = tensor
    return merged


def lora_delta(layer: torch.nn.Module, name: str, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """(alpha / r) B A of the adapted layer `name`, read from `state`: peft's get_delta_weight reads the module's
    own A and B, which under FSDP2 are shards."""
    from peft.tuners.lora import Embedding

    if isinstance(layer, Embedding):  # A: [r, vocab], B: [dim, r]; the embedding's weight is [vocab, dim]
        a, b = state[f"{name}.lora_embedding_A.{ADAPTER}"], state[f"{name}.lora_embedding_B.{ADAPTER}"]
        transposed = True
    else:
        a, b = state[f"{name}.lora_A.{ADAPTER}.weight"], state[f"{name}.lora_B.{ADAPTER}.weight"]
        transposed = layer.fan_in_fan_out
    delta = b @ a
    return (delta.T if transposed else delta) * layer.scaling[ADAPTER]


def save_adapter(
    model: torch.nn.Module, out_dir: Path, base: str, state: dict[str, torch.Tensor] | None = None
) -> None:
    """The adapter (A, B and the trained heads) in peft's format: adapter_config.json and adapter_model.safetensors
    under the `base_model.model.` prefix that `PeftModel.from_pretrained` expects. base: where the model it adapts
    is (its config's base_model_name_or_path); state: as for merged_state_dict."""
    import peft
    from safetensors.torch import save_file

    model.peft_config[ADAPTER].base_model_name_or_path = base
    out_dir.mkdir(parents=True, exist_ok=True)
    state = peft.get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER)
    save_file(
        {f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in state.items()},
        str(out_dir / "adapter_model.safetensors"),
    )
    model.peft_config[ADAPTER].save_pretrained(str(out_dir))


class MergedCopy:
    """A plain module of the policy's architecture that holds its merged weights: what an engine samples from
    while the policy trains through adapters (or in another dtype: `dtype`, None for the weights' own).
    `refresh` copies the current weights in (after each update)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None):
        from transformers import AutoModelForCausalLM

        weights = merged_state_dict(model)
        first = next(iter(weights.values()))
        self.module = AutoModelForCausalLM.from_config(model.config).to(device=first.device, dtype=dtype or first.dtype)
        self.module.load_state_dict(weights)
        self.module.eval().requires_grad_(False)
        self.source = model

    def refresh(self) -> torch.nn.Module:
        self.module.load_state_dict(merged_state_dict(self.source))
        return self.module
