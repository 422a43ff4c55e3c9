"""`recipes/smollm2-gsm8k.yaml` through the flow with tiny sizes: smollm2-135m is fine-tuned on GSM8K train rows,
trained with GRPO on GSM8K train prompts and evaluated on the GSM8K test split after every model stage.

Only sizes are overridden (rows, steps, batch, held-out items, new tokens); the model, the data files, their
loader, the eval set and the stage list are the shipped recipe's. Speeds at full sizes: bench/RESULTS.md.
"""

import json

import pytest

from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe
from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
TINY = [
    "stages.sft_data.sources.math.shared.count=6",
    "stages.sft.steps=2",
    "stages.sft.batch_size=2",
    "stages.sft.micro_batch_size=2",
    "stages.sft.warmup_steps=1",
    "stages.sft.checkpoint_every=0",
    "stages.gsm8k_rl.prompts.math.shared.count=4",
    "stages.gsm8k_rl.steps=1",
    "stages.gsm8k_rl.prompts_per_step=2",
    "stages.gsm8k_rl.group_size=2",
    "stages.gsm8k_rl.checkpoint_every=0",
    "domains.math.heldout_size=2",
    "domains.math.max_new_tokens=12",
    "eval.benchmarks.gsm8k.limit=2",
    "eval.benchmarks.gsm8k.max_new_tokens=12",
    "tracking.enabled=false",
]


def test_smollm2_gsm8k_runs_sft_grpo_and_the_gsm8k_test_eval(tmp_path, monkeypatch, smollm2_home):
    monkeypatch.setenv("CASCADE_HOME", str(smollm2_home))  # the test session's converted smollm2-135m
    recipe = load_recipe("smollm2-gsm8k", [f"storage.root=file://{tmp_path}/store", *TINY])
    report = cascade_flow(recipe, "gsm")
    stages = {s.name: s for s in report.stages}
    assert stages["sft_data"].metrics["rows"] == 6, stages["sft_data"].metrics
    assert stages["sft"].metrics["steps"] == 2 and stages["sft"].metrics["tokens_per_s"] > 0
    assert stages["gsm8k_rl"].metrics["steps"] == 1
    assert [e.after_stage for e in report.evals][-2:] == ["sft", "gsm8k_rl"]
    assert all(0.0 <= e.scores[column] <= 1.0 for e in report.evals for column in ("math", "bench/gsm8k"))
    # the benchmark column is the GSM8K test split's first items
    test_rows = [json.loads(line) for line in (DEFAULT_DATA_ROOT / "math/gsm8k_test.jsonl").open()][:2]
    (record_file,) = (tmp_path / "store" / "runs" / "gsm" / "evals").glob("*-gsm8k_rl.json")
    record = json.loads(record_file.read_text())
    bench_prompts = [r["prompt"] for r in record["items"] if r["domain"] == "bench/gsm8k"]
    assert [p.split("\n\n")[0] for p in bench_prompts] == [row["question"].strip() for row in test_rows]
