"""The Kubernetes job template renders a recipe's compute settings: GPUs per node, nodes, the rendezvous service.

Rendered with Prefect's own templating (`apply_values`, what the worker's `from_template_and_values` calls) and
the template's defaults, as the kubernetes worker would; no cluster runs here."""

import json

import jsonschema
import pytest
import yaml
from prefect.utilities.templating import apply_values

from cascade.infra.k8s import JobVariablesError, job_variables
from tests.artifacts.servers import ROOT
from tests.conftest import micro_recipe

TEMPLATE = json.loads((ROOT / "infra" / "k8s-gpu-job-template.json").read_text())
SERVICE = yaml.safe_load((ROOT / "infra" / "k8s-rdzv-service.yaml").read_text())
RDZV = "cascade-rdzv.cascade.svc:29500"


def render(variables: dict) -> dict:
    """The Job manifest the worker would submit for these job variables."""
    schema = TEMPLATE["variables"]
    assert set(variables) <= set(schema["properties"]), set(variables) - set(schema["properties"])
    jsonschema.validate(variables, schema)  # the server validates a run's job variables against it
    defaults = {k: v["default"] for k, v in schema["properties"].items() if v.get("default") is not None}
    return apply_values(TEMPLATE["job_configuration"], defaults | variables)["job_manifest"]


def test_the_job_template_renders_a_recipes_ranks_nodes_and_rendezvous(tmp_path):
    recipe = micro_recipe(
        tmp_path,
        "stages.sft.compute.nproc_per_node=4",
        "stages.math_rl.compute.nproc_per_node=2",
        "stages.math_rl.compute.nnodes=3",
        f"stages.math_rl.compute.rdzv_endpoint={RDZV}",
    )
    variables = job_variables(recipe)
    assert variables == {"gpus_per_node": 4, "nnodes": 3, "rdzv_service": "cascade-rdzv"}
    job = render(variables)
    assert (job["spec"]["completions"], job["spec"]["parallelism"], job["spec"]["completionMode"]) == (3, 3, "Indexed")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 4
    # the endpoint's host is the headless service, which selects this Job's pod 0
    assert SERVICE["metadata"]["name"] == RDZV.split(".")[0] and SERVICE["spec"]["clusterIP"] == "None"
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert SERVICE["spec"]["selector"] == {
        "cascade.rdzv": labels["cascade.rdzv"],
        "batch.kubernetes.io/job-completion-index": "0",
    }
    assert SERVICE["spec"]["ports"][0]["port"] == int(RDZV.rsplit(":", 1)[1])


def test_cpu_ranks_take_no_gpus_and_one_process_is_one_gpu_one_pod(tmp_path):
    assert job_variables(micro_recipe(tmp_path)) == {"gpus_per_node": 1, "nnodes": 1}
    cpu = micro_recipe(tmp_path, "compute.nproc_per_node=2", "compute.device=cpu")
    assert job_variables(cpu) == {"gpus_per_node": 1, "nnodes": 1}  # 2 CPU ranks; the evals' one GPU
    job = render(job_variables(cpu))
    assert job["spec"]["completions"] == 1 and job["spec"]["parallelism"] == 1


def test_two_rendezvous_hosts_in_one_job_are_refused(tmp_path):
    other = "other-rdzv.cascade.svc:29500"
    recipe = micro_recipe(
        tmp_path,
        "stages.sft.compute.nnodes=2",
        f"stages.sft.compute.rdzv_endpoint={RDZV}",
        "stages.math_rl.compute.nnodes=2",
        f"stages.math_rl.compute.rdzv_endpoint={other}",
    )
    with pytest.raises(JobVariablesError, match="different hosts"):
        job_variables(recipe)


def test_prefect_yaml_job_variables_are_the_templates():
    declared = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())["deployments"]
    for deployment in declared:
        variables = {k: v for k, v in deployment["work_pool"]["job_variables"].items() if k not in ("image", "env")}
        job = render(variables)  # every key is a template variable of the right type
        gpus = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert (gpus, job["spec"]["completions"]) == (1, 1), deployment["name"]


# The fields of KubeRay's RayCluster (ray.io/v1) CRD that the operator requires or that this example sets, with
# their types; the CRD itself is not reachable offline
RAYCLUSTER = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["headGroupSpec"],
            "properties": {
                "rayVersion": {"type": "string"},
                "headGroupSpec": {"$ref": "#/$defs/group", "required": ["rayStartParams", "template"]},
                "workerGroupSpecs": {
                    "type": "array",
                    "items": {
                        "$ref": "#/$defs/group",
                        "required": ["groupName", "rayStartParams", "template"],
                        "properties": {
                            "groupName": {"type": "string"},
                            "replicas": {"type": "integer", "minimum": 0},
                            "minReplicas": {"type": "integer", "minimum": 0},
                            "maxReplicas": {"type": "integer", "minimum": 0},
                        },
                    },
                },
            },
        },
    },
    "$defs": {
        "group": {
            "type": "object",
            "properties": {
                "rayStartParams": {"type": "object", "additionalProperties": {"type": "string"}},
                "template": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["containers"],
                            "properties": {
                                "containers": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {"type": "object", "required": ["name", "image"]},
                                }
                            },
                        }
                    },
                },
            },
        }
    },
}


def test_the_raycluster_example_is_a_valid_kuberay_cluster_for_a_ray_recipe(tmp_path):
    cluster = yaml.safe_load((ROOT / "infra" / "k8s-raycluster.yaml").read_text())
    jsonschema.validate(cluster, RAYCLUSTER)
    pinned = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("ray = "))
    assert f'"ray[client]=={cluster["spec"]["rayVersion"]}"' in pinned  # the image's Ray is the one the flow drives
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # no rank lands on the head
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert sorted(groups) == ["gpu", "rollout"]
    for group in groups.values():
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    workers = groups["gpu"]
    (container,) = workers["template"]["spec"]["containers"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
    (rollout,) = groups["rollout"]["template"]["spec"]["containers"]
    # `ray start --resources` takes JSON; KubeRay passes the string as written, quotes included
    advertised = json.loads(json.loads(groups["rollout"]["rayStartParams"]["resources"]))
    assert advertised == {"rollout": 1} and "resources" not in workers["rayStartParams"]
    assert rollout["resources"]["limits"]["nvidia.com/gpu"] >= 1
    containers = [*head["template"]["spec"]["containers"], container, rollout]
    assert all({"name": "RAY_worker_niceness", "value": "0"} in c["env"] for c in containers)
    # the recipe the header names fits: nnodes workers of nproc_per_node GPUs, and the Job runs none of its ranks
    recipe = micro_recipe(
        tmp_path,
        "compute.launcher=ray",
        f"compute.nnodes={workers['replicas']}",
        f"compute.nproc_per_node={gpus}",
        "compute.device=cuda",
        "engine.kind=vllm",
        "engine.ray_resources={rollout: 1, GPU: 1}",
    )
    assert job_variables(recipe) == {"gpus_per_node": 1, "nnodes": 1}
    assert recipe.engine.ray_resources["GPU"] <= rollout["resources"]["limits"]["nvidia.com/gpu"]
