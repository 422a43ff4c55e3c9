"""Our GRPO stage beside TRL's GRPOTrainer on the same model, prompts, group size and completion length (issue 19).

    PYTHONPATH=. .venv/bin/python bench/bench_grpo.py                 # tiny model, 8 x 4 x 32, fp32 and bf16
    PYTHONPATH=. .venv/bin/python bench/bench_grpo.py --profile       # where one of our steps spends its time
    PYTHONPATH=. .venv/bin/python bench/bench_grpo.py --grid          # model x group size x completion length
    PYTHONPATH=. .venv/bin/python bench/bench_grpo.py --model smollm2-135m --lora-rank 16   # LoRA on both sides

The peer runs in its own venv: `bash bench/trl-venv.sh` builds .venv-trl (TRL 1.16.0, the same CPU torch and
transformers as .venv). Both sides load one HF model directory (the project's tiny model saved by
stages.train.model.save_hf, or smollm2-135m's converted checkpoint), draw P prompts per step from the math domain's
train split (chat-formatted by the model's template), sample G completions of up to T new tokens at temperature 1
with HF generation, score them with our math grader, and take one optimizer step per rollout batch without KL.
Ours is `stages.kinds.grpo.run_grpo.run_grpo` on a one-stage recipe (bench/grpo_cascade_side.py); TRL's is
bench/grpo_trl_peer.py.

Every run is a fresh process, one at a time: per round, ours "as configured" (groups whose rewards are all equal
are dropped before the backward), TRL, and ours on "the same work" (`drop_flat_groups: false`: every sequence
updated, as TRL does), the order reversed every other round. A step's time is the interval between consecutive
step ends (rollout, rewards, update, weight sync, logging); the first --warmup steps, which include set-up, are
not counted. Printed: per run the median s/step and sampled tokens/s, per side the median over rounds, and last
the ratio cascade/trl (below 1: ours is faster), with the load average seen during the runs, and each run's peak
resident memory (from wait4). With --lora-rank both sides train peft LoRA adapters (alpha 2 x rank, every linear
layer but the head, no dropout) instead of every weight.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRL_VENV = Path(os.environ.get("TRL_VENV", REPO / ".venv-trl"))  # as bench/trl-venv.sh names it
TRL_PYTHON = TRL_VENV / "bin" / "python"
SIDES = ("cascade", "trl", "cascade-same-work")


@dataclass(frozen=True)
class Setting:
    """One configuration both sides run; passed to each side's process as JSON."""

    model_dir: str
    prompts: int = 8
    group: int = 4
    tokens: int = 32
    dtype: str = "fp32"
    steps: int = 5  # timed steps per run
    warmup: int = 2  # steps run first and not timed
    threads: int = os.cpu_count() or 1
    pool: int = 512  # math train prompts both sides draw from
    seed: int = 0
    lr: float = 5e-5
    same_work: bool = False  # ours only: drop_flat_groups false
    lora_rank: int = 0  # > 0: both sides train LoRA adapters of this rank (alpha 2 x rank) on every linear layer


def side_command(side: str, setting: Setting) -> list[str]:
    if side == "trl":
        return [str(TRL_PYTHON), str(REPO / "bench" / "grpo_trl_peer.py"), json.dumps(asdict(setting))]
    same = replace(setting, same_work=side == "cascade-same-work")
    return [sys.executable, str(REPO / "bench" / "grpo_cascade_side.py"), json.dumps(asdict(same))]


def trl_same_work_kwargs(
    prompts: int,
    group: int,
    tokens: int,
    steps: int,
    lr: float,
    seed: int,
    dtype: str,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> dict:
    """TRL 1.16 GRPOConfig keyword arguments (all but output_dir) that make GRPOTrainer do our stage's work: P
    prompts x G samples, generation batch = train batch (one generation per optimizer step, so the old logprobs are
    the detached current ones, as in ours), no KL (beta=0) and so no reference model, HF `generate` (use_vllm=False),
    fp32 or bf16 autocast, and no gradient checkpointing (TRL's default turns it on; our stage's default has it off).
    Plain data, so the main venv builds and tests them and the peer (in .venv-trl) takes them as JSON."""
    return dict(
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        max_steps=steps,
        seed=seed,
        learning_rate=lr,
        per_device_train_batch_size=prompts * group,
        gradient_accumulation_steps=1,
        num_generations=group,
        steps_per_generation=1,
        max_completion_length=tokens,
        temperature=temperature,
        top_p=top_p,
        beta=0.0,
        use_vllm=False,
        log_completions=False,
        bf16=dtype == "bf16",
        dataloader_num_workers=0,
        gradient_checkpointing=False,
    )


def run_checked(command: list[str], threads: int, who: str) -> str:
    """A side's process with the checkout on PYTHONPATH and `threads` torch threads; its stdout. A failure exits
    with the process's last stderr line."""
    return run_measured(command, threads, who)[0]


def run_measured(command: list[str], threads: int, who: str) -> tuple[str, float]:
    """run_checked's process, and its peak resident memory in GB (from wait4)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0), err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            last = (err.read().strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"{who} failed (exit {os.waitstatus_to_exitcode(status)}): {last}")
        return out.read(), usage.ru_maxrss / 2**20  # KiB on Linux


def run_side(side: str, setting: Setting, loads: list[float]) -> dict:
    """One run in a fresh process: its step times and tokens (the side's last stdout line, JSON)."""
    loads.append(os.getloadavg()[0])
    stdout, peak_gb = run_measured(side_command(side, setting), setting.threads, f"bench_grpo: the {side} run")
    loads.append(os.getloadavg()[0])
    result = json.loads(stdout.strip().splitlines()[-1])
    seconds = result["step_seconds"]
    return {
        "s_per_step": statistics.median(seconds),
        "tok_per_s": sum(result["tokens_sampled"]) / sum(seconds),
        "kept_groups": result["kept_groups"],
        "peak_rss_gb": peak_gb,
    }


def compare(setting: Setting, rounds: int, sides: tuple[str, ...] = SIDES) -> dict[str, dict]:
    """Alternating runs of every side; per side the medians over rounds. Prints one line per run."""
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    loads: list[float] = []
    for r in range(rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            runs[side].append(run_side(side, setting, loads))
            got = runs[side][-1]
            print(
                f"  round {r + 1} {side:<18} {got['s_per_step']:.3f} s/step  {got['tok_per_s']:7.0f} tok/s  "
                f"kept groups {got['kept_groups']:.2f}  peak RSS {got['peak_rss_gb']:.2f} GB  "
                f"(load {loads[-2]:.1f} -> {loads[-1]:.1f})",
                flush=True,
            )
    return {
        side: {key: statistics.median(run[key] for run in got) for key in got[0]} | {"load": loads}
        for side, got in runs.items()
    }


def model_dirs(names: list[str], tmp: Path) -> dict[str, str]:
    """name -> an HF directory both sides load: `tiny` saved here from its default config (seed 0), smollm2-135m's
    converted checkpoint, or a directory given by path. A random-init tiny model never solves a math prompt, so
    "as configured" drops every group; a trained policy (a path) makes that comparison mean something."""
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import build_tiny_model, save_hf
    from cascade.stages.train.model_source import smollm2_dir
    from cascade.stages.train.tokenizer import load_tokenizer

    dirs = {}
    for name in names:
        if name == "tiny":
            tokenizer = load_tokenizer()
            save_hf(build_tiny_model(ModelConfig(), len(tokenizer), seed=0), tokenizer, tmp / "tiny")
            dirs[name] = str(tmp / "tiny")
        elif name != "smollm2-135m":
            if not (Path(name) / "config.json").is_file():
                raise SystemExit(f"bench_grpo: --model {name}: not tiny, smollm2-135m or an HF model dir")
            dirs[name] = name
        else:
            try:
                dirs[name] = str(smollm2_dir())
            except FileNotFoundError as e:
                raise SystemExit(f"bench_grpo: {e}") from None
    return dirs


def print_comparison(label: str, medians: dict[str, dict]) -> None:
    trl = medians["trl"]["s_per_step"]
    loads = [x for side in medians.values() for x in side["load"]]
    for side, got in medians.items():
        print(
            f"{label} {side:<18} median {got['s_per_step']:.3f} s/step  {got['tok_per_s']:7.0f} tok/s  "
            f"peak RSS {got['peak_rss_gb']:.2f} GB"
        )
    print(f"{label} load average during the runs: {min(loads):.1f}-{max(loads):.1f} (1 min)")
    if "cascade" in medians:
        print(f"{label} cascade/trl as configured: {medians['cascade']['s_per_step'] / trl:.2f}")
    if "cascade-same-work" in medians:
        print(f"{label} cascade/trl same work:     {medians['cascade-same-work']['s_per_step'] / trl:.2f}")


def grid(base: Setting, dirs: dict[str, str], groups: list[int], lengths: list[int], rounds: int) -> None:
    """s/step and tokens/s of both sides (ours on the same work) per model x group size x completion length."""
    print(
        f"{'model':<13} {'G':>3} {'T':>4}  {'cascade s/step':>14} {'tok/s':>7}  {'trl s/step':>10} {'tok/s':>7}  "
        f"{'ratio':>5}  load"
    )
    for name, model_dir in dirs.items():
        for group in groups:
            for tokens in lengths:
                setting = replace(base, model_dir=model_dir, group=group, tokens=tokens)
                got = compare(setting, rounds, ("cascade-same-work", "trl"))
                ours, trl = got["cascade-same-work"], got["trl"]
                loads = ours["load"] + trl["load"]
                print(
                    f"{name:<13} {group:>3} {tokens:>4}  {ours['s_per_step']:>14.3f} {ours['tok_per_s']:>7.0f}  "
                    f"{trl['s_per_step']:>10.3f} {trl['tok_per_s']:>7.0f}  "
                    f"{ours['s_per_step'] / trl['s_per_step']:>5.2f}  {min(loads):.1f}-{max(loads):.1f}",
                    flush=True,
                )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        nargs="+",
        help="tiny, smollm2-135m or an HF model dir (e.g. a trained policy: "
        "runs/<run>/01-sft/model of `make run`); default tiny; --grid: tiny and smollm2-135m",
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, nargs="+", help="group size(s); default 4; --grid: 4 8 16")
    parser.add_argument("--tokens", type=int, nargs="+", help="completion length(s); default 32; --grid: 32 128")
    parser.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (set-up, first allocations)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads per run")
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="> 0: both sides train LoRA adapters of this rank (peft), not every weight",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--profile", action="store_true", help="break one of our steps down by phase (no TRL)")
    mode.add_argument("--grid", action="store_true", help="model x group x length, both sides, fp32")
    args = parser.parse_args(argv)
    args.model = args.model or (["tiny", "smollm2-135m"] if args.grid else ["tiny"])
    args.group = args.group or ([4, 8, 16] if args.grid else [4])
    args.tokens = args.tokens or ([32, 128] if args.grid else [32])
    for name in ("prompts", "steps", "warmup", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.lora_rank < 0:
        parser.error("--lora-rank must be at least 0")
    if min(args.group + args.tokens) < 1:
        parser.error("--group and --tokens must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.profile and not TRL_PYTHON.exists():
        raise SystemExit(
            f"bench_grpo: no TRL venv at {TRL_VENV}: build it with "
            "`bash bench/trl-venv.sh` (or run --profile, which needs only ours)"
        )
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        dirs = model_dirs(args.model, Path(tmp))
        base = Setting(
            model_dir="",
            prompts=args.prompts,
            steps=args.steps,
            warmup=args.warmup,
            threads=args.threads,
            lora_rank=args.lora_rank,
        )
        lora = f", LoRA rank {args.lora_rank} on both sides" if args.lora_rank else ""
        print(
            f"bench_grpo: {args.prompts} prompts per step, {args.steps} timed steps after {args.warmup} warm-up, "
            f"{args.threads} threads{lora}, load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        if args.profile:
            from grpo_cascade_side import profile_step  # noqa: PLC0415  (bench/ is the script's own dir)

            for name, model_dir in dirs.items():
                for dtype in args.dtype:
                    for same_work in (False, True):
                        setting = replace(
                            base,
                            model_dir=model_dir,
                            group=args.group[0],
                            tokens=args.tokens[0],
                            dtype=dtype,
                            same_work=same_work,
                        )
                        profile_step(setting, f"{name} {dtype} P{args.prompts} G{args.group[0]} T{args.tokens[0]}")
        elif args.grid:
            grid(replace(base, dtype=args.dtype[0]), dirs, args.group, args.tokens, args.rounds)
        else:
            for name, model_dir in dirs.items():
                for dtype in args.dtype:
                    label = f"[{name} {dtype} P{args.prompts} G{args.group[0]} T{args.tokens[0]}]"
                    print(label, flush=True)
                    setting = replace(
                        base, model_dir=model_dir, group=args.group[0], tokens=args.tokens[0], dtype=dtype
                    )
                    print_comparison(label, compare(setting, args.rounds))


def run_main(main) -> None:
    """A bench's entry point: a SystemExit with a message is a one-line error and exit code 2, as for bad arguments."""
    try:
        main()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    run_main(main)
