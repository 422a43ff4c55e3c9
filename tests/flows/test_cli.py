"""Bad input: one line on stderr, exit code 2, no traceback, nothing written."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

CASCADE = [sys.executable, "-m", "cascade.flows.cli"]
ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "hunter2-7f3k9q"


def cascade(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CASCADE_HOME=str(home))
    return subprocess.run([*CASCADE, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "tiny", "nonsense.key=1"], "bad override of 'nonsense.key': nonsense: unknown key; known: "),
        (["run", "tiny", "stages.sft.stepz=1"], "stages.1.sft.stepz: unknown key; did you mean 'steps'?"),
        (["run", "/no/such/recipe.yaml"], "recipe file not found: /no/such/recipe.yaml"),
        (
            ["run", "micro", "stages.math_rl.name=../../../../tmp/cascade-escape", "tracking.enabled=false"],
            "stages.4.grpo.name: '../../../../tmp/cascade-escape' is not a name: letters, digits, '_', '-'",
        ),
        (["run", "micro", "stages.math_rl.name=math rl (v2)"], "'math rl (v2)' is not a name"),
        (["run", "nope"], "unknown recipe 'nope'"),
        (["run", "tiny", "stages.sft.steps"], "bad override 'stages.sft.steps': expected key=value"),
        (["run", "tiny", "stages.sft.steps=lots"], "Input should be a valid integer"),
        (["run", "tiny", "--run-id", "Bad ID!"], "bad run id 'Bad ID!'"),
        (["resume", "no-such-run"], "unknown run id 'no-such-run'"),
        (["status", "no-such-run"], "unknown run id 'no-such-run'"),
        (["report", "no-such-run"], "unknown run id 'no-such-run'"),
        (["eval", "/no/such/model"], "no such model or checkpoint: /no/such/model"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, message):
    home = tmp_path / "home"
    result = cascade(*args, home=home)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("cascade: error: ") and message in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert files_under(home) == []


@pytest.mark.parametrize(
    "args", [["run", "nope"], ["run", "tiny", "nonsense.key=1"], ["resume", "no-such-run"], ["eval", "/no/such/model"]]
)
def test_bad_input_is_reported_without_importing_torch_or_prefect(tmp_path, args):
    """Catching the one-line errors once imported torch, transformers and Prefect: 11 s to say a recipe is unknown."""
    probe = (
        "import sys\nfrom cascade.flows.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    print(e.code, sorted(m for m in ('torch', 'transformers', 'prefect') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=dict(os.environ, CASCADE_HOME=str(tmp_path / "home")),
    )
    assert result.stdout.strip() == "2 []", result.stdout + result.stderr
    assert result.stderr.startswith("cascade: error: ")


@pytest.mark.parametrize(
    "args, field, instead",
    [
        (["run", "micro", f"storage.root=s3://user:{PASSWORD}@bucket/x"], "storage.root", "AWS_ACCESS_KEY_ID"),
        (
            ["run", "micro", f"storage.endpoint_url=http://AKIA:{PASSWORD}@minio:9000"],
            "storage.endpoint_url",
            "AWS_ACCESS_KEY_ID",
        ),
        (["run", "micro", f"engine.url=http://u:{PASSWORD}@host"], "engine.url", "api_key_env"),
        (
            ["run", "micro", f"tracking.uri=http://bob:{PASSWORD}@mlflow:5000"],
            "tracking.uri",
            "MLFLOW_TRACKING_PASSWORD",
        ),
        (
            ["run", "micro", f"stages.difficulty.reference=http://{PASSWORD}@vllm:8000"],
            "stages.difficulty.reference",
            "api_key_env",
        ),
        (["status", "--store", f"s3://user:{PASSWORD}@bucket/x"], "storage.root", "AWS_ACCESS_KEY_ID"),
        # a secret holding '/', as AWS secret keys often do
        (["status", "--store", f"s3://KEY:ab/{PASSWORD}@bucket/x"], "storage.root", "AWS_ACCESS_KEY_ID"),
        (["run", "micro", f"tracking.uri=http://bob:x/{PASSWORD}@mlflow:5000"], "tracking.uri", "MLFLOW_TRACKING"),
        (
            ["run", "micro", f"storage.endpoint_url=http://AKIA:a/{PASSWORD}@minio:9000"],
            "storage.endpoint_url",
            "AWS_ACCESS_KEY_ID",
        ),
    ],
)
def test_credentials_in_a_url_are_refused_without_echoing_them(tmp_path, args, field, instead):
    home = tmp_path / "home"
    result = cascade(*args, home=home)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert f"{field}: a URL holds credentials" in lines[0] and instead in lines[0], lines[0]
    assert PASSWORD not in result.stdout + result.stderr
    assert files_under(home) == []


def test_existing_run_id_is_refused_without_touching_it(tmp_path):
    home = tmp_path / "home"
    recipe_file = home / "runs" / "taken" / "recipe.json"
    recipe_file.parent.mkdir(parents=True)
    recipe_file.write_text("{}")
    result = cascade("run", "micro", "--run-id", "taken", home=home)
    assert result.returncode == 2
    assert "run 'taken' already exists; continue it with `cascade resume taken`" in result.stderr
    assert recipe_file.read_text() == "{}"
    assert files_under(home) == [recipe_file]


def test_status_lists_nothing_on_an_empty_store(tmp_path):
    result = cascade("status", "--json", home=tmp_path / "home")
    assert result.returncode == 0 and result.stdout.strip() == "[]"


def test_second_writer_is_refused_while_the_lease_is_live(tmp_path):
    from cascade.artifacts.lease import Lease
    from cascade.artifacts.store import Store

    home = tmp_path / "home"
    store = Store(f"file://{home}")
    from cascade.flows.recipes import load_recipe

    store.write_bytes("runs/busy/recipe.json", load_recipe("micro").model_dump_json().encode())
    with Lease(store, "busy"):
        before = files_under(home)
        result = cascade("resume", "busy", home=home)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "run 'busy' is being written by another process: host " in lines[0]
        assert files_under(home) == before
    assert not store.exists("runs/busy/LEASE.json")


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "stages.sft.steps=3",
            "resume takes compute.* overrides only (where ranks run, not what they train): 'stages.sft.steps=3'",
        ),
        ("compute.nnodes=0", "compute.nnodes: Input should be greater than or equal to 1"),
    ],
)
def test_resume_takes_compute_overrides_only_and_refuses_the_rest_in_one_line(tmp_path, override, message):
    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe

    home = tmp_path / "home"
    Store(f"file://{home}").write_bytes("runs/stored/recipe.json", load_recipe("micro").model_dump_json().encode())
    before = files_under(home)
    result = cascade("resume", "stored", override, home=home)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cascade: error: ") and message in lines[0], lines
    assert files_under(home) == before


def test_gc_lists_then_deletes_an_orphaned_partial_upload(tmp_path):
    home = tmp_path / "home"
    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe

    store = Store(f"file://{home}")
    store.write_bytes("runs/r1/recipe.json", load_recipe("micro").model_dump_json().encode())
    store.write_bytes("runs/r1/01-sft/model/model.safetensors", b"half a checkpoint")  # no MANIFEST.json
    listed = cascade("gc", "r1", home=home)
    assert listed.returncode == 0 and "01-sft" in listed.stdout
    assert store.exists("runs/r1/01-sft/model/model.safetensors")
    deleted = cascade("gc", "r1", "--yes", home=home)
    assert deleted.returncode == 0
    assert not store.exists("runs/r1/01-sft/model/model.safetensors")
    assert store.exists("runs/r1/recipe.json")


def test_a_racing_run_of_the_same_id_writes_nothing_and_is_one_line(tmp_path):
    """The lease is taken before recipe.json is written: a run that loses the race leaves the winner's recipe."""
    from cascade.artifacts.lease import Lease
    from cascade.artifacts.store import Store

    home = tmp_path / "home"
    store = Store(f"file://{home}")
    with Lease(store, "raced"):  # the winner has the lease and has not written its recipe yet
        result = cascade("run", "micro", "--run-id", "raced", "seed=7", home=home)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "run 'raced' is being written by another process" in lines[0], result.stderr
        assert "Traceback" not in result.stderr + result.stdout
        assert not store.exists("runs/raced/recipe.json")


def test_a_run_failure_that_is_not_a_bug_is_one_line_exit_1(capsys):
    import typer

    from cascade.flows.cli.common import guarded
    from cascade.stages.errors import GateFailed

    @guarded
    def failing_run():
        raise GateFailed("regression gate: math dropped 0.130 after if_rl (tolerance 0.05)")

    with pytest.raises(typer.Exit) as exit_:
        failing_run()
    assert exit_.value.exit_code == 1
    assert (
        capsys.readouterr().err == "cascade: error: regression gate: math dropped 0.130 after if_rl (tolerance 0.05)\n"
    )


def test_a_matrix_wider_than_the_terminal_is_split_into_column_groups_never_cut():
    from cascade.flows.cli.inspection import column_groups

    assert column_groups([10, 10, 10], 25) == [[0, 1], [2]]
    assert column_groups([30, 5, 5], 20) == [[0], [1, 2]]  # a column wider than the room still gets a table
    assert column_groups([5, 5], 80) == [[0, 1]]


def test_a_command_leaves_nothing_in_the_temp_directory(tmp_path, monkeypatch):
    """torch makes its compile cache directory on import: under the cascade home, not `torchinductor_<user>`."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # set in this process by importing cascade
    result = cascade("run", "/no/such/recipe.yaml", home=tmp_path / "home")  # far enough to import torch
    assert result.returncode == 2, result.stderr
    assert list(temp.iterdir()) == []


HOLD_A_SCRATCH_DIR = """
import time
from cascade.stages.train.context import stage_workdir
with stage_workdir() as workdir:
    (workdir / "model.safetensors").write_bytes(b"w" * 4096)
    print(workdir, flush=True)
    time.sleep(120)
"""


def test_gc_local_removes_only_the_scratch_directories_no_live_process_owns(tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    holders = [
        subprocess.Popen([sys.executable, "-c", HOLD_A_SCRATCH_DIR], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    killed, live = (Path(h.stdout.readline().strip()) for h in holders)
    try:
        holders[0].kill()  # kill -9: its stage_workdir is never removed
        holders[0].wait()
        foreign = temp / "cascade-made-elsewhere"  # no owner file: nothing says whether it is in use
        foreign.mkdir()
        listed = cascade("gc", "--local", home=tmp_path / "home")
        assert listed.returncode == 0, listed.stderr
        assert f"would delete  {killed}  (4.0 KB; process {holders[0].pid} is gone)" in listed.stdout
        assert str(live) not in listed.stdout and f"kept  {foreign}" in listed.stdout
        assert "1 in use" in listed.stdout and killed.exists()
        deleted = cascade("gc", "--local", "--yes", home=tmp_path / "home")
        assert deleted.returncode == 0 and f"deleted  {killed}" in deleted.stdout, deleted.stdout
        assert sorted(temp.iterdir()) == sorted([live, foreign])
        assert (live / "model.safetensors").exists()
    finally:
        holders[1].kill()
        holders[1].wait()


@pytest.mark.slow
def test_a_failed_stage_is_one_line_naming_the_log_that_holds_prefects_traceback(tmp_path):
    """A stage that stops on bad input (flex_attention on a CPU) as run on a fresh clone: exit 2 and our one
    line, which names the log file; Prefect's task traceback is in that file, not on the terminal."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "CASCADE_STORE", "MLFLOW_TRACKING_URI")}
    env.update(CASCADE_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1", COLUMNS="200")
    result = subprocess.run(
        [*CASCADE, "run", "micro", "--run-id", "flex", "stages.sft.attention=flex_attention"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    log = tmp_path / "home" / "logs" / "flex.log"
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"cascade: error: stage 'sft': attention flex_attention trains on cuda only (torch has no CPU backward "
        f"for it); use sdpa (log: {log})"
    ]
    assert "Traceback" not in result.stdout + result.stderr
    assert "Traceback" in log.read_text() and "flex_attention trains on cuda only" in log.read_text()


def test_a_transformers_warning_goes_to_the_run_log_not_the_terminal(tmp_path, capfd):
    """transformers' loggers have their own stderr handler; under a run's log file they must write to the file
    (a reward model's load report of its new score head reached the terminal of `cascade run tiny-rlhf`)."""
    import logging

    from transformers.utils import logging as hf_logging

    from cascade.flows.cli.common import LOG_FILE, logs_to_file

    root = logging.getLogger()
    saved = list(root.handlers), list(LOG_FILE)
    try:
        logs_to_file(tmp_path / "run.log")
        hf_logging.get_logger("transformers.modeling_utils").warning("score.weight | MISSING")
        for handler in root.handlers:
            handler.flush()
        assert "MISSING" not in capfd.readouterr().err
        assert "WARNING transformers.modeling_utils: score.weight | MISSING" in (tmp_path / "run.log").read_text()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        LOG_FILE[:] = saved[1]
        logging.captureWarnings(False)
        hf_logging.disable_propagation()
        hf_logging.enable_default_handler()


UNEXPECTED = """
import sys
import time
from pathlib import Path
import typer
from cascade.flows.cli.common import guarded, logs_to_file

app = typer.Typer()

@app.command()
@guarded
def run(log: str):
    logs_to_file(Path(log))
    raise RuntimeError("an eval's data file went missing\\nsecond line")

app()
"""


def test_any_other_failure_of_a_run_is_one_line_and_exit_1_with_its_traceback_in_the_log(tmp_path):
    """Not only bad input and stage failures: whatever stops a run that logs to a file (a lost lease, a benchmark
    file gone mid-run, a bug) is one line naming the exception and the log, which holds the traceback. Before,
    such a failure printed a screen of Rich traceback (2026-11-27: a BenchmarkError in the first eval)."""
    log = tmp_path / "run.log"
    result = subprocess.run([sys.executable, "-c", UNEXPECTED, str(log)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"cascade: error: RuntimeError: an eval's data file went missing (log: {log})"
    ]
    assert "Traceback" in log.read_text() and "second line" in log.read_text()


def test_without_a_terminal_progress_is_a_line_per_interval_and_the_last(monkeypatch):
    import io

    from rich.console import Console

    import cascade.flows.cli.runs as runs

    clock = [100.0]
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    update = runs.progress_lines(Console(file=out, width=200), every=30.0)("01 sft:sft", "steps")
    for step in range(1, 101):  # a step every 0.7 s: 70 s in all
        clock[0] += 0.7
        update(step, 100)
    assert out.getvalue().splitlines() == [
        "01 sft:sft: 1/100 steps, 0:00",
        "01 sft:sft: 44/100 steps, 0:30",
        "01 sft:sft: 87/100 steps, 1:00",
        "01 sft:sft: 100/100 steps, 1:09",
    ]
    evals = runs.progress_lines(Console(file=out, width=200), every=30.0)("eval sft: ifeval", "items")
    evals(541, 541)
    assert out.getvalue().splitlines()[-1] == "eval sft: ifeval: 541/541 items, 0:00"


@pytest.mark.slow
def test_status_and_resume_say_where_a_cut_off_run_stands_and_a_moved_store_resumes_where_it_is(tmp_path, prefect_api):
    """SFT fails at its last step (the test-only fault hook) after its step checkpoint 3: status says no process
    runs the run and shows the step checkpoint. Then its home moves: resume, told where the store is now, says so,
    names what each stage does, finishes the run there and writes nothing at the old path."""
    env = {k: v for k, v in os.environ.items() if k not in ("CASCADE_STORE", "MLFLOW_TRACKING_URI")}
    env.update(OMP_NUM_THREADS="1", COLUMNS="200", PREFECT_API_URL=prefect_api)
    old, new = tmp_path / "home", tmp_path / "moved"

    def cli(home, *args: str, **extra: str) -> subprocess.CompletedProcess:
        command = [*CASCADE, *args]
        run_env = {**env, "CASCADE_HOME": str(home), **extra}
        return subprocess.run(command, capture_output=True, text=True, env=run_env, cwd=ROOT, timeout=600)

    failed = cli(old, "run", "micro", "--run-id", "cut", "tracking.enabled=false", CASCADE_TEST_FAIL_STAGE="cut/sft")
    assert failed.returncode == 1, (failed.stdout + failed.stderr)[-3000:]
    status = cli(old, "status", "cut")
    assert "failed; `cascade resume cut` continues it" in status.stdout, status.stdout
    assert re.search(r"│ sft +│ sft +│ \w+ \(step checkpoint 3\)", status.stdout), status.stdout
    old.rename(new)
    resumed = cli(new, "resume", "cut", "--store", f"file://{new}")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    lines = resumed.stdout.splitlines()
    assert lines[0] == f"cut began in file://{old} and is in file://{new} now: it continues there", lines
    assert lines[2:4] == ["  sft_data: committed, skipped", "  sft: continues from its step checkpoint 3 of 6"]
    assert lines[4:7] == ["  difficulty: starts", "  if_rl: starts", "  math_rl: starts"]
    assert not old.exists(), sorted(str(p.relative_to(old)) for p in old.rglob("*"))  # nothing at the old path
    report = json.loads((new / "runs" / "cut" / "report.json").read_text())
    assert report["status"] == "FINISHED" and [s["name"] for s in report["stages"]][-1] == "math_rl"
    assert "running" not in cli(new, "status", "cut").stdout.splitlines()[0].replace("not running", "")


def test_status_tells_a_live_owner_from_one_whose_process_is_gone(tmp_path):
    import socket

    from cascade.artifacts.report import RunReport
    from cascade.artifacts.store import Store
    from cascade.flows.cli.inspection import run_process

    store = Store(f"file://{tmp_path}")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lease = {"token": "t" * 16, "expires": time.time() + 60, "host": socket.gethostname()}
    report = RunReport(run_id="r", recipe="micro")
    store.write_bytes("runs/r/LEASE.json", json.dumps({**lease, "pid": int(gone.stdout)}).encode())
    assert run_process(store, "r", report).startswith("killed: its process is gone (host ")
    store.write_bytes("runs/r/LEASE.json", json.dumps({**lease, "pid": os.getpid()}).encode())
    assert run_process(store, "r", report).startswith(f"running: host {socket.gethostname()} pid {os.getpid()}")


def test_the_terminal_prints_brackets_in_user_strings_as_they_are(capsys):
    """A path or name holding `[/x]` or `[word]` is text, not a markup tag (one raised, the other vanished)."""
    from cascade.flows.cli.common import console

    console.print("store file:///tmp/mk[/x]home/runs/[draft]", highlight=False)
    assert capsys.readouterr().out == "store file:///tmp/mk[/x]home/runs/[draft]\n"


def test_a_recipe_that_starts_vllm_without_its_venv_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """eval.engine vllm (as smollm2-if sets it) with no vLLM venv: one line naming the command that builds it, exit
    2, nothing written; not a failure at the first eval."""
    monkeypatch.setenv("CASCADE_VLLM_VENV", str(tmp_path / "no-venv"))
    home = tmp_path / "home"
    result = cascade("run", "micro", "eval.engine=vllm", home=home)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "eval.engine vllm starts a vLLM server" in lines[0] and "make vllm" in lines[0]
    assert files_under(home) == []
