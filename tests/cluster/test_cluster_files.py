"""The files of cluster/, validated offline: nothing here runs Docker, Kubernetes, Prometheus,
Grafana or Ray, and nothing reaches the network.

Each file is checked against the schema of its format where one could be had offline, vendored in
tests/cluster/schemas/ (its README.md says where each came from): the Compose file against the
compose-spec schema, the ConfigMap and every pod template and `metadata` inside the KubeRay
resources against Kubernetes' schemas, the Prometheus config against SchemaStore's schema. The
KubeRay CRD schemas could not be had offline: the KubeRay fields themselves are checked against
the closed lists below. The Grafana dashboard has no JSON schema here: its structure is checked
and every PromQL expression is parsed.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import typer
import yaml  # type: ignore[import-untyped]
from jsonschema.validators import validator_for  # type: ignore[import-untyped]
from referencing import Registry, Resource

from choreography_ray.cli import app
from choreography_ray.job import Job
from choreography_ray.storage import open_storage
from choreography_ray.types import import_type

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KUBERNETES_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"

#: The project's metrics as Prometheus names them: Ray prefixes a user metric with `ray_`, and a
#: counter's series ends in `_total`; a histogram is queried through its three series.
COUNTERS = {
    f"ray_choreography_{name}_total"
    for name in (
        "steps_started",
        "steps_succeeded",
        "steps_failed",
        "steps_retried",
        "steps_restarted_by_lease",
        "steps_stopped",
        "outcome_deliveries_retried",
        "rehydrations",
    )
}
GAUGES = {"ray_choreography_jobs"}
HISTOGRAMS = {"ray_choreography_storage_write_seconds", "ray_choreography_batch_size"}
SERIES = COUNTERS | GAUGES | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
#: Grafana's own variables, replaced by a value of their kind before an expression is parsed.
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b")
VARIABLE_FILTERS = ("scope", "namespace", "job_type")

#: The Compose services that run a Ray node, and the port every node serves its metrics on.
RAY_SERVICES = ("ray-head", "ray-worker-1", "ray-worker-2")
METRICS_PORT = 8080

#: The KubeRay `ray.io/v1` fields these manifests use, as the KubeRay API reference names them
#: (RayClusterSpec, HeadGroupSpec, WorkerGroupSpec, RayJobSpec). This is no CRD schema: a field
#: that is not listed fails the test until it is looked up in the reference and added here.
RAYCLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs"}
HEAD_GROUP_SPEC = {"rayStartParams", "template"}
WORKER_GROUP_SPEC = {
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "rayStartParams",
    "template",
}
RAYJOB_SPEC = {"clusterSelector", "submissionMode", "entrypoint"}
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}


def load(path: Path) -> Any:
    with path.open(encoding="utf-8") as file:
        return json.load(file) if path.suffix == ".json" else yaml.safe_load(file)


@functools.cache
def kubernetes_registry() -> Registry[Any]:
    resources = [Resource.from_contents(load(p)) for p in (SCHEMAS / "kubernetes").glob("*.json")]
    return Registry().with_resources((r.contents["$id"], r) for r in resources)


def schema_errors(
    schema: dict[str, Any], instance: Any, registry: Registry[Any] | None = None
) -> list[str]:
    """Every way `instance` breaks `schema`, as `path: message` lines."""
    cls = validator_for(schema)
    validator = cls(schema, registry=registry if registry is not None else Registry())
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(instance)
    ]


def kubernetes_errors(definition: str, instance: Any) -> list[str]:
    """The errors of `instance` as the Kubernetes type `definition` (strict: no unknown field)."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"{KUBERNETES_DEFINITIONS}#/$defs/{definition}",
    }
    return schema_errors(schema, instance, kubernetes_registry())


def kuberay_errors(resource: dict[str, Any]) -> list[str]:
    """The errors of a RayCluster or RayJob: its KubeRay fields against the lists above, its
    `metadata` and pod templates against Kubernetes' ObjectMeta and PodTemplateSpec."""
    errors = kubernetes_errors(
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", resource["metadata"]
    )
    if resource.get("apiVersion") != "ray.io/v1":
        errors.append(f"apiVersion {resource.get('apiVersion')!r} is not ray.io/v1")
    spec = resource["spec"]
    groups: list[tuple[str, dict[str, Any], set[str]]] = []
    if resource["kind"] == "RayCluster":
        groups = [
            ("spec", spec, RAYCLUSTER_SPEC),
            ("headGroupSpec", spec["headGroupSpec"], HEAD_GROUP_SPEC),
        ]
        groups += [
            (f"workerGroupSpecs/{g.get('groupName')}", g, WORKER_GROUP_SPEC)
            for g in spec["workerGroupSpecs"]
        ]
        for group in spec["workerGroupSpecs"]:
            counts = [group.get(k) for k in ("minReplicas", "replicas", "maxReplicas")]
            if not all(isinstance(c, int) for c in counts) or counts != sorted(counts):
                errors.append(
                    f"{group.get('groupName')}: not minReplicas <= replicas <= maxReplicas"
                )
    elif resource["kind"] == "RayJob":
        groups = [("spec", spec, RAYJOB_SPEC)]
        if spec.get("submissionMode", "K8sJobMode") not in SUBMISSION_MODES:
            errors.append(f"spec: unknown submissionMode {spec['submissionMode']!r}")
        errors += [
            f"spec: {k}={v!r} is not a string pair"
            for k, v in spec["clusterSelector"].items()
            if not isinstance(v, str)
        ]
    else:
        errors.append(f"kind {resource['kind']!r} is neither RayCluster nor RayJob")
    for where, group, fields in groups:
        errors += [f"{where}: unknown field {name!r}" for name in sorted(set(group) - fields)]
        params = group.get("rayStartParams", {})
        errors += [
            f"{where}: rayStartParams {k} is not a string"
            for k, v in params.items()
            if not isinstance(v, str)
        ]
        if "template" in group:
            errors += [
                f"{where}/template/{e}"
                for e in kubernetes_errors("io.k8s.api.core.v1.PodTemplateSpec", group["template"])
            ]
    return errors


def compose() -> Any:
    return load(CLUSTER / "compose.yaml")


def kuberay(name: str) -> Any:
    return load(CLUSTER / "kuberay" / name)


def dashboard() -> Any:
    return load(CLUSTER / "grafana" / "choreography-ray.json")


def selectors(expression: str) -> set[str]:
    """The metric names an expression of the dashboard selects, after parsing it as PromQL."""
    expression = GRAFANA_INTERVALS.sub("5m", expression)
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name or "<a selector without a metric name>")

    promql_parser.walk(promql_parser.parse(expression), visit)
    return names


def variable_selector(query: str) -> str:
    """The series selector of a `label_values(SELECTOR, LABEL)` variable query."""
    match = re.fullmatch(r"label_values\((.+), *(\w+)\)", query)
    assert match, f"not a label_values query: {query!r}"
    return match.group(1)


# --- Compose ----------------------------------------------------------------------------------


def test_compose__valid_against_the_compose_spec_schema() -> None:
    assert schema_errors(load(SCHEMAS / "compose-spec.json"), compose()) == []


def test_compose__a_replica_set_initiated_by_its_health_check_and_ray_nodes_on_it() -> None:
    services = compose()["services"]
    mongo = services["mongo"]
    assert mongo["command"][mongo["command"].index("--replSet") + 1] == "rs0"
    check = " ".join(mongo["healthcheck"]["test"])
    assert "rs.initiate(" in check and "_id: 'rs0'" in check
    head = services["ray-head"]
    assert head["depends_on"]["mongo"]["condition"] == "service_healthy"
    assert {p.split(":")[0] for p in head["ports"]} >= {"8265", "6379", "10001", str(METRICS_PORT)}
    for name in RAY_SERVICES:
        service = services[name]
        assert service["build"] == {"context": "..", "dockerfile": "cluster/Dockerfile"}
        url = service["environment"]["CHOREOGRAPHY_STORAGE"]
        assert url.startswith("mongodb://mongo:27017/") and "replicaSet=rs0" in url
        assert f"--metrics-export-port={METRICS_PORT}" in service["command"]
        if name != "ray-head":
            assert "--address=ray-head:6379" in service["command"]
    asyncio.run(open_storage(url).close())  # a MongoDB URL the project takes; no I/O
    assert (CLUSTER / "Dockerfile").is_file()


def test_dockerfile__an_official_ray_image_for_python_3_11_that_installs_the_project() -> None:
    text = (CLUSTER / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-py311$", text, re.MULTILINE)
    assert re.search(r"^RUN pip install --no-cache-dir \. ", text, re.MULTILINE)
    version = re.search(r"^ARG RAY_VERSION=(\S+)$", text, re.MULTILINE)
    assert version and kuberay("raycluster.yaml")["spec"]["rayVersion"] == version.group(1)


# --- Kubernetes and KubeRay -------------------------------------------------------------------


def test_configmap__valid_against_the_kubernetes_schema() -> None:
    configmap = kuberay("configmap.yaml")
    schema = load(SCHEMAS / "kubernetes" / "configmap-v1.json")
    assert schema_errors(schema, configmap, kubernetes_registry()) == []


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay__fields_listed_and_pod_templates_valid_against_kubernetes(name: str) -> None:
    assert kuberay_errors(kuberay(name)) == []


def test_rayjob__runs_choreography_ray_run_on_the_raycluster_with_a_valid_request() -> None:
    cluster, job, configmap = (
        kuberay(n) for n in ("raycluster.yaml", "rayjob.yaml", "configmap.yaml")
    )
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["choreography-ray", "run"]
    # The command line parses as `run` takes it (nothing runs).
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    parsed = group.commands["run"].make_context("run", argv[2:]).params
    job_type = import_type(parsed["job_type"])
    assert issubclass(job_type, Job)
    # The request file is the ConfigMap's, mounted on the head, and valid for that job type.
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    mount = head["containers"][0]["volumeMounts"][0]
    volume = next(v for v in head["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    item = volume["configMap"]["items"][0]
    assert parsed["request"] == f"{mount['mountPath']}/{item['path']}"
    job_type.request_type().model_validate_json(configmap["data"][item["key"]])


# --- Prometheus and Grafana -------------------------------------------------------------------


def test_prometheus__valid_against_the_schemastore_schema() -> None:
    config = load(CLUSTER / "prometheus" / "prometheus.yml")
    assert schema_errors(load(SCHEMAS / "prometheus.json"), config) == []


def test_prometheus__scrapes_the_metrics_port_of_every_ray_service() -> None:
    config = load(CLUSTER / "prometheus" / "prometheus.yml")
    assert config["scrape_configs"]
    targets = set()
    for job in config["scrape_configs"]:
        discovery = [k for k in job if k.endswith("_sd_configs")]
        assert job.get("static_configs") or discovery, f"{job['job_name']} has no targets"
        targets |= {t for c in job.get("static_configs", []) for t in c["targets"]}
    assert targets == {f"{service}:{METRICS_PORT}" for service in RAY_SERVICES}
    assert set(RAY_SERVICES) <= set(compose()["services"])


def test_grafana_dashboard__panels_query_only_the_project_metrics() -> None:
    board = dashboard()
    assert board["schemaVersion"] == 42 and board["uid"] and board["title"]
    expressions = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert all(p["targets"] for p in board["panels"])
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    used = set().union(*(selectors(e) for e in expressions))
    assert used <= SERIES, f"not the project's metrics: {sorted(used - SERIES)}"
    assert used >= COUNTERS | GAUGES, f"no panel for {sorted(COUNTERS | GAUGES - used)}"
    assert {f"{h}_bucket" for h in HISTOGRAMS} <= used
    for expression in expressions:
        for label in VARIABLE_FILTERS:
            assert f'{label}=~"${label}"' in expression, f"{label} filter missing: {expression}"


def test_grafana_dashboard__a_prometheus_datasource_and_filter_variables() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for label in VARIABLE_FILTERS:
        variable = variables[label]
        assert variable["type"] == "query"
        assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert selectors(variable_selector(variable["query"]["query"])) <= SERIES
    panels_and_targets = board["panels"] + [t for p in board["panels"] for t in p["targets"]]
    assert all(x["datasource"]["uid"] == "${datasource}" for x in panels_and_targets)


def test_grafana_provisioning__loads_the_dashboard_from_the_compose_prometheus() -> None:
    provisioning = CLUSTER / "grafana" / "provisioning"
    (source,) = load(provisioning / "datasources" / "prometheus.yaml")["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = load(provisioning / "dashboards" / "choreography-ray.yaml")["providers"]
    mounts = compose()["services"]["grafana"]["volumes"]
    target = next(
        m.split(":")[1] for m in mounts if m.startswith("./grafana/choreography-ray.json")
    )
    assert Path(target).parent == Path(provider["options"]["path"])


# --- The validators reject a broken file ------------------------------------------------------


def broken(document: Any, path: str, value: Any) -> Any:
    """A copy of `document` with the item at the slash-separated `path` set to `value`."""
    document = copy.deepcopy(document)
    *parents, last = path.split("/")
    node = document
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return document


def test_validators__reject_a_broken_field_of_each_file() -> None:
    compose_schema = load(SCHEMAS / "compose-spec.json")
    assert schema_errors(compose_schema, broken(compose(), "services/mongo/helthcheck", {}))
    assert schema_errors(compose_schema, broken(compose(), "services/ray-head/ports", 8265))
    configmap_schema = load(SCHEMAS / "kubernetes" / "configmap-v1.json")
    bad_configmap = broken(kuberay("configmap.yaml"), "data/storage", 27017)
    assert schema_errors(configmap_schema, bad_configmap, kubernetes_registry())
    cluster = kuberay("raycluster.yaml")
    head = "spec/headGroupSpec/template/spec/containers/0"
    assert kuberay_errors(broken(cluster, f"{head}/ports/0/containerPort", "6379"))
    assert kuberay_errors(broken(cluster, f"{head}/port", []))
    assert kuberay_errors(broken(cluster, "spec/workerGroupSpecs/0/replica", 2))
    assert kuberay_errors(broken(cluster, "spec/workerGroupSpecs/0/replicas", 5))
    assert kuberay_errors(broken(cluster, "spec/headGroupSpec/rayStartParams/num-cpus", 2))
    assert kuberay_errors(broken(kuberay("rayjob.yaml"), "spec/submissionMode", "Batch"))
    prometheus = load(CLUSTER / "prometheus" / "prometheus.yml")
    prometheus_schema = load(SCHEMAS / "prometheus.json")
    assert schema_errors(
        prometheus_schema, broken(prometheus, "scrape_configs/0/static_config", [])
    )
    assert schema_errors(prometheus_schema, broken(prometheus, "global/scrape_interval", "often"))
    with pytest.raises(ValueError):
        selectors("sum(rate(ray_choreography_jobs[5m])")
