"""The Store on file:// and s3://: listing, sizes, atomic small writes, AWS settings from the environment."""

import pytest

from cascade.artifacts.config import StorageConfig
from cascade.artifacts.retry import RetryPolicy, is_transient, retrying
from cascade.artifacts.store import Store, storage_options


def test_keys_listing_and_sizes(any_store):
    st = any_store
    st.write_bytes("runs/a/01-sft/model/w.bin", b"x" * 10)
    st.write_bytes("runs/a/01-sft/steps/3/MANIFEST.json", b"{}")
    st.write_bytes("runs/b/recipe.json", b"{}")
    assert st.list_dirs("runs") == ["a", "b"]
    assert st.list_dirs("runs/a/01-sft") == ["model", "steps"]
    assert st.list("runs/a") == ["runs/a/01-sft/model/w.bin", "runs/a/01-sft/steps/3/MANIFEST.json"]
    assert st.sizes("runs/a/01-sft") == {"model/w.bin": 10, "steps/3/MANIFEST.json": 2}
    assert st.sizes("runs/none") == {} and st.list("runs/none") == [] and st.list_dirs("runs/none") == []
    st.delete("runs/a")
    assert not st.exists("runs/a/01-sft/model/w.bin") and st.list_dirs("runs") == ["b"]


def test_missing_key_is_file_not_found_and_not_retried(any_store):
    with pytest.raises(FileNotFoundError):
        any_store.read_bytes("no/such/key")


def test_file_writes_are_atomic(tmp_path, monkeypatch):
    st = Store(f"file://{tmp_path}/s")
    st.write_bytes("k/LEASE.json", b"old")

    def torn(self, data):
        open(self, "wb").write(data[:2])
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr("pathlib.Path.write_bytes", torn)
    with pytest.raises(KeyboardInterrupt):
        st.write_bytes("k/LEASE.json", b"new contents")
    monkeypatch.undo()
    assert st.read_bytes("k/LEASE.json") == b"old"


def test_aws_settings_come_from_the_recipe_else_the_environment(monkeypatch):
    for k in (
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "AWS_MAX_ATTEMPTS",
        "AWS_RETRY_MODE",
    ):
        monkeypatch.delenv(k, raising=False)
    assert storage_options(StorageConfig(root="file:///tmp/x")) == {}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_PROFILE", "ci")
    opts = storage_options(StorageConfig(root="s3://b/p"))
    assert opts["client_kwargs"] == {"endpoint_url": "http://env:9000"}
    # region in botocore's Config, never client_kwargs (s3fs would send it as a LocationConstraint)
    assert opts["config_kwargs"]["region_name"] == "eu-west-1" and opts["profile"] == "ci"
    cfg = StorageConfig(root="s3://b/p", endpoint_url="http://recipe:9000", region="us-east-2", profile="p2")
    opts = storage_options(cfg)
    assert opts["client_kwargs"] == {"endpoint_url": "http://recipe:9000"}
    assert opts["config_kwargs"]["region_name"] == "us-east-2" and opts["profile"] == "p2"
    assert not any("secret" in k.lower() or k in ("key", "token") for k in opts)


def test_region_in_the_recipe_still_creates_buckets_on_moto(moto, aws_env):
    st = Store.from_config(StorageConfig(root="s3://regional-bucket/p", endpoint_url=moto.url, region="us-east-1"))
    st.fs.mkdir("regional-bucket")
    st.write_bytes("k", b"v")
    assert st.read_bytes("k") == b"v"


def test_endpoint_from_the_environment_reaches_moto(moto, aws_env, monkeypatch):
    from tests.artifacts.servers import make_bucket

    make_bucket(moto.url, "env-endpoint")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    st = Store("s3://env-endpoint/root")  # no options: as `cascade resume --store s3://...` builds it
    st.write_bytes("a/b", b"1")
    assert st.list("a") == ["a/b"]


def error_chain(kind):
    from botocore.exceptions import ClientError, EndpointConnectionError

    def client(code, status):
        return ClientError(
            {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
        )

    if kind == "wrapped-503":  # what s3fs raises: an OSError whose __cause__ is the ClientError
        e = OSError(5, "Service Unavailable")
        e.__cause__ = client("ServiceUnavailable", 503)
        return e
    return {
        "endpoint": EndpointConnectionError(endpoint_url="http://x"),
        "slowdown": client("SlowDown", 503),
        "500": client("InternalError", 500),
        "throttle": client("Throttling", 400),
        "reset": ConnectionResetError(104, "reset"),
        "denied": client("AccessDenied", 403),
        "missing": FileNotFoundError("k"),
        "bad": ValueError("x"),
    }[kind]


@pytest.mark.parametrize(
    "kind, transient",
    [
        ("endpoint", True),
        ("slowdown", True),
        ("500", True),
        ("throttle", True),
        ("reset", True),
        ("wrapped-503", True),
        ("denied", False),
        ("missing", False),
        ("bad", False),
    ],
)
def test_transient_errors_are_told_from_permanent_ones(kind, transient):
    assert is_transient(error_chain(kind)) is transient


def test_backoff_grows_exponentially_and_is_capped(monkeypatch):
    waits, calls = [], []
    monkeypatch.setattr("cascade.artifacts.retry.time.sleep", waits.append)

    def failing():
        calls.append(1)
        raise error_chain("endpoint")

    with pytest.raises(Exception) as info:
        retrying(RetryPolicy(attempts=5, base=1.0, cap=3.0), "upload x", failing)
    assert len(calls) == 5 and len(waits) == 4
    assert 0.5 <= waits[0] <= 1 and 1 <= waits[1] <= 2 and all(1.5 <= w <= 3 for w in waits[2:])
    assert "upload x failed after 5 attempts" in info.value.__notes__[0]


def test_retries_stop_when_the_time_budget_is_spent(monkeypatch):
    clock, calls = [0.0], []
    monkeypatch.setattr("cascade.artifacts.retry.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("cascade.artifacts.retry.time.sleep", lambda s: clock.__setitem__(0, clock[0] + s))

    def hanging():  # each attempt waits out a 20 s read timeout
        calls.append(1)
        clock[0] += 20
        raise error_chain("endpoint")

    with pytest.raises(Exception) as info:
        retrying(RetryPolicy(attempts=50, base=1.0, cap=2.0, budget=60), "read x", hanging)
    assert len(calls) == 3 and clock[0] <= 60 + 20
    assert "read x failed after 3 attempts in" in info.value.__notes__[0]


def test_requests_have_timeouts_and_one_retry_layer(monkeypatch, tmp_path):
    from cascade.artifacts.store import BOTO_ATTEMPTS, CONNECT_TIMEOUT_S, READ_TIMEOUT_S

    for k in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(k, raising=False)
    opts = storage_options(StorageConfig(root="s3://b/p", endpoint_url="http://127.0.0.1:9"))
    assert opts["config_kwargs"]["connect_timeout"] == CONNECT_TIMEOUT_S
    assert opts["config_kwargs"]["read_timeout"] == READ_TIMEOUT_S
    assert opts["config_kwargs"]["retries"]["max_attempts"] == BOTO_ATTEMPTS
    assert Store.from_config(StorageConfig(root="s3://b/p", endpoint_url="http://127.0.0.1:9")).fs.retries == 1


def test_a_key_that_would_leave_the_store_is_refused(tmp_path):
    from cascade.artifacts.store import StoreError

    store = Store(f"file://{tmp_path}/store")
    for key in ("../x", "runs/r/../../../tmp/x", "a/.."):
        with pytest.raises(StoreError, match="leaves the store"):
            store.write_bytes(key, b"x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.iterdir())
    store.write_bytes("runs/r..s/x", b"x")  # a name with dots in it is a name
    assert (tmp_path / "store" / "runs" / "r..s" / "x").read_bytes() == b"x"
