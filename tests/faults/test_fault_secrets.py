"""Credentials in the environment never reach logs, MLflow params or tags or artifacts, report.json or anything
else in the store, or Prefect (logs, artifacts, flow-run parameters, read back from its API).

The micro cascade runs under a Prefect server with its store on S3 (moto) and tracking on a real MLflow
server, with fake AWS keys and an MLflow password in the environment (both are really used: S3 requests are
signed with the keys, MLflow requests carry the password as basic auth). Then every sink is read back and
searched for each secret value.
"""

import json
import secrets

import pytest

from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe
from tests.faults.conftest import new_bucket

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def fake_secrets() -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "MLFLOW_TRACKING_USERNAME": "cascade-" + secrets.token_hex(4),
        "MLFLOW_TRACKING_PASSWORD": secrets.token_urlsafe(18),
    }


def leaks(values: dict[str, str], sources: dict[str, str]) -> list[str]:
    return [f"{name} in {where}" for where, text in sources.items() for name, v in values.items() if v in text]


def mlflow_texts(client, experiment: str, tmp_path) -> dict[str, str]:
    exp = client.get_experiment_by_name(experiment)
    out = {}
    for run in client.search_runs([exp.experiment_id]):
        rid = run.info.run_id
        out[f"mlflow params {rid}"] = json.dumps(run.data.params)
        out[f"mlflow tags {rid}"] = json.dumps(run.data.tags)
        out[f"mlflow metric names {rid}"] = json.dumps(sorted(run.data.metrics))
        stack = [a for a in client.list_artifacts(rid)]
        while stack:
            a = stack.pop()
            if a.is_dir:
                stack += client.list_artifacts(rid, a.path)
            else:
                local = client.download_artifacts(rid, a.path, str(tmp_path / "art" / rid))
                out[f"mlflow artifact {rid}/{a.path}"] = open(local, "rb").read().decode("utf-8", "replace")
    for model in client.search_registered_models():
        out[f"mlflow model {model.name}"] = json.dumps(
            [v.source for v in client.search_model_versions(f"name = '{model.name}'")] + [str(model.tags)]
        )
    return out


async def prefect_texts() -> dict[str, str]:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        runs = await client.read_flow_runs()
        logs = await client.read_logs()
        artifacts = await client.read_artifacts()
    out = {f"prefect flow-run params {r.name}": json.dumps(r.parameters, default=str) for r in runs}
    out["prefect logs"] = "\n".join(str(rec.message) for rec in logs)
    out["prefect artifacts"] = "\n".join(json.dumps(a.data, default=str) + str(a.description) for a in artifacts)
    assert runs and artifacts, "nothing to scan: the flow left no Prefect records"
    return out


def test_no_secret_reaches_any_sink(s3, mlflow_url, tmp_path, monkeypatch, capfd, caplog):
    import asyncio

    from mlflow.tracking import MlflowClient

    values = fake_secrets()
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    bucket = new_bucket(s3.url)
    recipe = load_recipe(
        "micro",
        [
            f"storage.root=s3://{bucket}/cascade",
            f"storage.endpoint_url={s3.url}",
            f"tracking.uri={mlflow_url}",
            f"tracking.experiment=secrets-{bucket}",
        ],
    )
    with caplog.at_level("INFO"):  # what a run logs (DEBUG would add botocore's signed request headers)
        cascade_flow(recipe, "secrets")
    out, err = capfd.readouterr()
    store = Store.from_config(recipe.storage)
    sources = {"stdout": out, "stderr": err, "python logs": caplog.text}
    for key in store.list(""):
        sources[f"store {key}"] = store.read_bytes(key).decode("utf-8", "replace")
    sources.update(mlflow_texts(MlflowClient(mlflow_url), recipe.tracking.experiment, tmp_path))
    sources.update(asyncio.run(prefect_texts()))
    assert "store runs/secrets/report.json" in sources and any(k.startswith("mlflow params") for k in sources)
    assert leaks(values, {"control": "x" + values["AWS_SECRET_ACCESS_KEY"]}) != []  # the scan can see a leak
    found = leaks(values, sources)
    assert found == [], found
    print(f"scanned {len(sources)} sources, {sum(len(t) for t in sources.values())} characters")
