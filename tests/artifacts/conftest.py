"""The storage tests run twice: on file:// and on s3:// against a real moto S3 server (one per session)."""

import secrets

import pytest

from cascade.artifacts.retry import RetryPolicy
from cascade.artifacts.store import Store
from tests.artifacts.servers import FAKE_KEYS, make_bucket, moto_server

FAST_RETRY = RetryPolicy(attempts=3, base=0.05, cap=0.2)  # tests wait milliseconds, not seconds


@pytest.fixture(scope="session")
def moto(tmp_path_factory):
    server = moto_server(tmp_path_factory.mktemp("moto"))
    with pytest.MonkeyPatch.context() as mp:
        for k, v in FAKE_KEYS.items():
            mp.setenv(k, v)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def aws_env(monkeypatch):
    for k, v in FAKE_KEYS.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(k, raising=False)


def s3_store(endpoint: str, retry: RetryPolicy = FAST_RETRY) -> Store:
    """A store in a fresh bucket, so tests never see each other's objects."""
    bucket = f"t-{secrets.token_hex(6)}"
    make_bucket(endpoint, bucket)
    return Store(
        f"s3://{bucket}/cascade",
        {
            "client_kwargs": {"endpoint_url": endpoint},
            "use_listings_cache": False,
            "config_kwargs": {"retries": {"max_attempts": 1}},
        },
        retry=retry,
    )


@pytest.fixture(params=["file", "s3"])
def any_store(request, tmp_path):
    if request.param == "file":
        return Store(f"file://{tmp_path}/store", retry=FAST_RETRY)
    request.getfixturevalue("aws_env")
    return s3_store(request.getfixturevalue("moto").url)
