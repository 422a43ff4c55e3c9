"""No code of ours asks an object of ours what it has: a capability is a method or field of a declared protocol or
base class (a Domain's `grade_details` and `builds_pairs`, an engine's `last_sync`, a metric sink's `restore`, a
stage config's `compute_override()`, `named_domains()` and `step_count()`), read with a plain call or attribute.

getattr and hasattr remain for objects that are not ours (transformers models, configs and outputs; urllib, boto
and Ray errors; yaml errors; ast nodes; `sys`) and for dynamic imports (a name looked up in a module imported by
its name). Each such call in flows/, tasks/, stages/, artifacts/, infra/ and sandbox/ is listed below with its
reason, keyed by (file, the object's source text, the attribute: its string, or the source text of the expression
that names it at run time). A call that is not listed fails the test: declare the capability instead, or list the
call with why it must probe.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "stages", "artifacts", "infra", "sandbox")
PROBES = ("getattr", "hasattr")

HF_MODEL = "a transformers model: its attributes vary by architecture and version"
HF_CONFIG = "a transformers config: its keys vary by architecture and version"
URL_ERROR = "urllib's URLError has `reason`; http.client's and OS errors do not"
DYNAMIC_IMPORT = "a dynamic import: a name looked up in a module imported by its name"

ALLOWED: dict[tuple[str, str, str], str] = {
    # transformers models, their configs and outputs
    ("stages/engines/__init__.py", "model", "generation_config"): HF_MODEL + " (none on a bare module)",
    ("stages/engines/continuous.py", "config", "head_dim"): HF_CONFIG + " (absent where hidden / heads gives it)",
    ("stages/engines/continuous.py", "config", "num_key_value_heads"): HF_CONFIG + " (absent without GQA)",
    ("stages/engines/hf.py", "model", "generation_config"): HF_MODEL + " (none on a bare module)",
    ("stages/engines/hf.py", "model.config", "model_type"): HF_CONFIG,
    ("stages/engines/decode.py", "model", "config"): HF_MODEL + " (a bare torch module has no config)",
    ("stages/engines/decode.py", "model", "lm_head"): HF_MODEL + " (a causal LM has an lm_head, other heads not)",
    ("stages/engines/decode.py", "config", "model_type"): HF_CONFIG,
    ("stages/engines/decode.py", "config", "layer_types"): HF_CONFIG + " (per-layer attention, newer models only)",
    ("stages/engines/decode.py", "config", "use_sliding_window"): HF_CONFIG + " (Qwen2-style configs only)",
    ("stages/engines/decode.py", "model.model.rotary_emb", "rope_type"): "a transformers rotary embedding module",
    ("stages/engines/vllm/engine.py", "model", "_orig_mod"): "torch.compile's wrapper module",
    ("stages/engines/vllm/engine.py", "module", "module"): "torch's DDP/FSDP wrapper module",
    ("stages/engines/vllm/engine.py", "module", "save_pretrained"): HF_MODEL + " (a PreTrainedModel saves itself)",
    ("stages/engines/vllm/engine.py", "model", "config"): HF_MODEL + " (a bare torch module has no config)",
    ("stages/engines/vllm/engine.py", "getattr(model, 'config', None)", "vocab_size"): HF_CONFIG,
    ("stages/products.py", "model.config", "problem_type"): HF_CONFIG + " (set once a head is trained)",
    ("stages/scale/distributed.py", "model", "_no_split_modules"): HF_MODEL + " (its decoder layer classes)",
    ("stages/train/completions.py", "model", "is_activation_checkpointing"): HF_MODEL + " (PreTrainedModel's)",
    (
        "stages/train/completions.py",
        "model.get_decoder()(input_ids=ids, use_cache=False)",
        "last_hidden_state",
    ): "a transformers ModelOutput",
    ("stages/train/lora.py", "model.config", "tie_word_embeddings"): HF_CONFIG,
    ("stages/train/model.py", "config", "rope_parameters"): HF_CONFIG + " (transformers 5's rope keys)",
    ("stages/train/model.py", "config", "rope_theta"): HF_CONFIG + " (transformers 4's rope key)",
    ("stages/train/model.py", "generation_config", "eos_token_id"): "a transformers GenerationConfig, or None",
    ("stages/train/model_source.py", "model.config", "quantization_config"): HF_CONFIG + " (a quantized model's)",
    # errors raised by other libraries
    ("stages/datasets/teachers.py", "err", "reason"): URL_ERROR,
    ("stages/engines/vllm/client.py", "err", "reason"): URL_ERROR,
    ("stages/scoring/judge.py", "err", "reason"): URL_ERROR,
    ("stages/scale/launch_ray.py", "error", "cause"): "a Ray error: RayTaskError carries the task's own exception",
    ("artifacts/retry.py", "exc", "response"): "a botocore ClientError's response; other errors in the chain have none",
    ("artifacts/store.py", "e", "__notes__"): "an exception's PEP 678 notes, present only once a note was added",
    ("stages/recipe/recipe_file.py", "e", "problem_mark"): "PyYAML's MarkedYAMLError; a plain YAMLError has none",
    ("stages/recipe/recipe_file.py", "e", "problem"): "PyYAML's MarkedYAMLError; a plain YAMLError has none",
    ("stages/recipe/recipe_file.py", "e", "context"): "PyYAML's MarkedYAMLError; a plain YAMLError has none",
    # the standard library
    ("stages/domains/code.py", "fn", "type_params"): "an ast.FunctionDef: type_params exists from Python 3.12",
    ("sandbox/supervisor.py", "sys", "_base_executable"): "CPython's private base interpreter path; not everywhere",
    # dynamic imports
    ("stages/recipe/config_base.py", "importlib.import_module(module)", "name"): DYNAMIC_IMPORT + " (a registry row)",
    ("stages/domains/__init__.py", "importlib.import_module(module)", "cls"): DYNAMIC_IMPORT + " (a domain class)",
    ("stages/scoring/reward_sources.py", "module", "name"): DYNAMIC_IMPORT + " (the user's reward function)",
    ("infra/deploy.py", "importlib.import_module(module)", "function"): DYNAMIC_IMPORT + " (a deployment's flow)",
    ("infra/deployments.py", "importlib.import_module(module)", "function"): DYNAMIC_IMPORT + " (a deployment)",
}


def probe_calls(root: Path) -> list[tuple[str, int, str, tuple[str, str, str]]]:
    """(file, line, getattr | hasattr, its key) for every call of getattr or hasattr in the packages under root,
    also as an attribute (`builtins.getattr(...)`)."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = str(path.relative_to(root))
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name not in PROBES:
                    continue
                obj = ast.unparse(node.args[0]) if node.args else ""
                attr = node.args[1] if len(node.args) > 1 else None
                text = attr.value if isinstance(attr, ast.Constant) else ast.unparse(attr) if attr else ""
                found.append((rel, node.lineno, name, (rel, obj, str(text))))
    return found


def unlisted(root: Path) -> list[str]:
    """`file:line: getattr(obj, "attr")` for every probe the allowlist does not name."""
    return [
        f'{rel}:{line}: {name}({key[1]}, "{key[2]}")'
        for rel, line, name, key in probe_calls(root)
        if key not in ALLOWED
    ]


def test_every_getattr_and_hasattr_is_of_an_object_not_ours():
    assert unlisted(ROOT) == []


def test_every_allowed_probe_is_still_there():
    """An entry whose call was removed or changed goes too: the list stays the list of probes that remain."""
    present = {key for *_, key in probe_calls(ROOT)}
    assert sorted(set(ALLOWED) - present) == []


def test_every_reason_is_one_line():
    assert all(reason and "\n" not in reason for reason in ALLOWED.values())


def test_a_probe_of_our_own_object_is_caught(tmp_path):
    """The check bites: a domain asked for a hook, a sink asked whether it restores, and an allowed probe's text
    in another file (the key names the file)."""
    for package in ("stages/evals", "stages/train", "flows"):
        (tmp_path / package).mkdir(parents=True)
    (tmp_path / "stages" / "evals" / "probe.py").write_text(
        'def details(domain):\n    return getattr(domain, "grade_details", None)\n'
    )
    (tmp_path / "stages" / "train" / "sinks.py").write_text(
        "import builtins\n\n\ndef restores(sink):\n    return builtins.hasattr(sink, 'restore')\n"
    )
    (tmp_path / "flows" / "named.py").write_text(
        "def cls_of(importlib, module, cls):\n    return getattr(importlib.import_module(module), cls)\n"
    )
    (tmp_path / "stages" / "plain.py").write_text("def restore(sink, step):\n    sink.restore(step, [])\n")
    assert unlisted(tmp_path) == [
        'flows/named.py:2: getattr(importlib.import_module(module), "cls")',
        'stages/evals/probe.py:2: getattr(domain, "grade_details")',
        'stages/train/sinks.py:5: hasattr(sink, "restore")',
    ]
