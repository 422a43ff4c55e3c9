#!/usr/bin/env bash
# Creates <repo>/.venv-trl: TRL's GRPOTrainer, the peer bench/bench_grpo.py times beside our GRPO stage, kept out
# of the project venv. Same torch (the CPU build, installed first, as the Makefile does) and, through the
# project's constraints.txt, the same transformers/accelerate/datasets as .venv, so both sides run the same
# model code; math-verify is one extra, for the project's math grader (the reward both sides use), and peft the
# other, at the project's pin, for the LoRA peer of bench/bench_lora.py.
# Idempotent: a stamp records the pins of the last complete install.
#
# Usage: bash bench/trl-venv.sh            (FORCE=1 to rebuild from scratch)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRL_VENV:-$REPO_ROOT/.venv-trl}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
TRL_PIN="trl==1.16.0"
GRADER_PIN="math-verify==0.9.0"
PEFT_PIN="peft==0.21.2"
STAMP="$VENV/.cascade-stamp"
WANT_STAMP="$TORCH_PIN $TRL_PIN $GRADER_PIN $PEFT_PIN $(sha256sum "$REPO_ROOT/constraints.txt" | cut -c1-16)"

if [[ "${FORCE:-0}" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" && -x "$VENV/bin/python" ]]; then
    echo "trl venv up to date: $VENV"
    exit 0
fi

start=$(date +%s)
[[ "${FORCE:-0}" == 1 ]] && rm -rf "$VENV"
rm -f "$STAMP"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"

PIP=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)
# The local package mirrors warn once per package they do not carry; that noise is not ours.
quiet_mirrors() { grep -v "is ignored: it is neither a file" >&2 || true; }
"${PIP[@]}" install "$TORCH_PIN" 2> >(quiet_mirrors)
# constraints.txt pins torch==2.13.0 too, so no resolver pass can swap in a CUDA build.
"${PIP[@]}" install -c "$REPO_ROOT/constraints.txt" "$TRL_PIN" "$GRADER_PIN" "$PEFT_PIN" 2> >(quiet_mirrors)

"$VENV/bin/python" - <<'PY'
import peft, torch, transformers, trl
from trl import GRPOConfig, GRPOTrainer  # noqa: F401
assert not torch.cuda.is_available() and "+cpu" in torch.__version__, torch.__version__
print(f"trl {trl.__version__} peft {peft.__version__} transformers {transformers.__version__} torch {torch.__version__} ok")
PY

echo "$WANT_STAMP" >"$STAMP"
echo "trl venv ready in $(( $(date +%s) - start ))s: $VENV"
