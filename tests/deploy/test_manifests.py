"""The manifests agree with the code: commands name real modules, ports and probe paths are
what the processes serve, every FIBERMILL_* variable is a setting, every reference resolves,
and the operational rules (non-root, GPU per worker, drain time, Redis durability) hold."""

import base64
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from shared.settings import REPO_ROOT, Settings
from tests.deploy import facts, k8s
from tests.deploy.facts import api_routes
from tests.deploy.k8s import api, redis, registry, setting, worker
from tests.deploy.kustomize import key

API_MODULE, API_ATTR = "services.api.app", "app"
API_SERVE = ["python", "-m", "services.api.serve"]
WORKER_MODULE = "services.worker.launcher"
SECRET_KEYS = {
    "FIBERMILL_API_KEYS",
    "FIBERMILL_WEBHOOK_SECRET",
    "FIBERMILL_REDIS_SENTINEL_PASSWORD",
    "REDIS_PASSWORD",
}


def serve_args(command: list[str]) -> dict:
    """The flags of `python -m services.api.serve` (uvicorn with a drain on SIGTERM)."""
    assert command[:3] == API_SERVE, command
    args = {}
    rest = command[3:]
    for flag, value in zip(rest[::2], rest[1::2], strict=True):
        args[flag.lstrip("-")] = value
    return args


# --- commands, ports, probes --------------------------------------------------------------------


def test_api_command_runs_the_app(rendered):
    container = k8s.main_container(api(rendered))
    args = serve_args(container["command"])
    assert facts.is_runnable(facts.module_file(API_SERVE[2]))
    # serve runs this app
    assert f"from {API_MODULE} import {API_ATTR}" in facts.module_file(API_SERVE[2]).read_text()
    assert facts.defines_top_level(facts.module_file(API_MODULE), API_ATTR)
    assert args["host"] == "0.0.0.0"
    assert k8s.container_port(container, "http") == int(args["port"]) == 8000


def test_worker_command_runs_the_launcher(rendered):
    container = k8s.main_container(worker(rendered))
    assert container["command"] == ["python", "-m", WORKER_MODULE]
    assert facts.is_runnable(facts.module_file(WORKER_MODULE))


def test_api_probes_hit_real_routes_on_the_served_port(rendered):
    container = k8s.main_container(api(rendered))
    port = int(serve_args(container["command"])["port"])
    routes = api_routes()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for kind, probe in k8s.probes(container):
        get = probe["httpGet"]
        assert get["path"] in routes, f"{kind}: no route {get['path']}"
        assert k8s.container_port(container, get["port"]) == port, kind


def test_worker_metrics_port_is_what_the_worker_serves(rendered):
    """celery_app serves /metrics (prometheus_client) on worker_metrics_port + device_index;
    a one-GPU pod runs one worker, device index 0."""
    container = k8s.main_container(worker(rendered))
    served = setting(rendered, container, "worker_metrics_port") + 0
    assert k8s.container_port(container, "metrics") == served
    celery_app = facts.module_file("services.worker.celery_app").read_text()
    assert "serve_metrics(settings.worker_metrics_port + settings.device_index)" in celery_app
    server = facts.module_file("services.worker.metrics_server").read_text()
    assert "start_http_server(" in server  # serves /metrics (any path) on that port
    # ... and only after the models loaded, which is what the startup probe relies on
    body = celery_app.split("def _load", 1)[1]
    assert body.index("_runtime.start()") < body.index("serve_metrics(")


def test_worker_probes_use_the_metrics_endpoint(rendered):
    container = k8s.main_container(worker(rendered))
    metrics_port = k8s.container_port(container, "metrics")
    kinds = dict(k8s.probes(container))
    assert set(kinds) == {"startupProbe", "readinessProbe", "livenessProbe"}
    for kind, probe in kinds.items():
        assert probe["httpGet"]["path"] == "/metrics", kind
        assert k8s.container_port(container, probe["httpGet"]["port"]) == metrics_port, kind
    startup = kinds["startupProbe"]
    # model loading: at least 10 minutes before the kubelet gives up
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


# --- settings and references --------------------------------------------------------------------


def test_every_fibermill_variable_is_a_setting(rendered):
    """FIBERMILL_READY_REQUIRES_WORKERS included: with workers scaled to zero the API must be
    ready, or no job would arrive to scale them up."""
    names = set(k8s.one(rendered, "ConfigMap", "fibermill-settings")["data"])
    for w in k8s.workloads(rendered):
        for c in k8s.containers(w):
            names |= {v["name"] for v in k8s.env_list(c)}
    fibermill = {n for n in names if n.startswith("FIBERMILL_")}
    unknown = {
        n for n in fibermill if n.removeprefix("FIBERMILL_").lower() not in Settings.model_fields
    }
    assert unknown == set(), "not fields of shared.settings.Settings"


def test_api_is_ready_without_workers(rendered):
    container = k8s.main_container(api(rendered))
    assert k8s.env_value(rendered, container, "FIBERMILL_READY_REQUIRES_WORKERS") == "false"


@pytest.mark.parametrize("component", ["api", "worker"])
def test_settings_validate(rendered, component):
    container = k8s.main_container(k8s.workload_for(rendered, component))
    # types and cross-field rules (heartbeat < lease, ...)
    Settings(**k8s.settings_kwargs(rendered, container))


@pytest.mark.parametrize("component", ["api", "worker"])
def test_redis_url_carries_the_password(rendered, component):
    container = k8s.main_container(k8s.workload_for(rendered, component))
    env = k8s.env_list(container)
    names = [v["name"] for v in env]
    url = k8s.env_value(rendered, container, "FIBERMILL_REDIS_URL")
    m = re.fullmatch(r"redis://:\$\(REDIS_PASSWORD\)@([a-z0-9-]+):(\d+)/(\d+)", url or "")
    assert m, url
    # Kubernetes expands $(VAR) only from variables defined earlier in the list
    assert names.index("REDIS_PASSWORD") < names.index("FIBERMILL_REDIS_URL")
    password = env[names.index("REDIS_PASSWORD")]["valueFrom"]["secretKeyRef"]
    host, port = m.group(1), int(m.group(2))
    service = k8s.one(rendered, "Service", host)
    assert port in [p["port"] for p in service["spec"]["ports"]]
    targets = k8s.selected_workloads(rendered, service["spec"]["selector"])
    assert targets == [redis(rendered)]
    # the same secret key is the Redis server's requirepass
    redis_env = k8s.env_list(k8s.container_named(redis(rendered), "redis"))
    server_password = next(v for v in redis_env if v["name"] == "REDIS_PASSWORD")
    assert server_password["valueFrom"]["secretKeyRef"] == password


def test_secrets_come_from_the_secret(rendered):
    for w in k8s.workloads(rendered):
        for c in k8s.containers(w):
            for var in k8s.env_list(c):
                if var["name"] in SECRET_KEYS:
                    assert "secretKeyRef" in var.get("valueFrom", {}), (c["name"], var["name"])
    settings = k8s.one(rendered, "ConfigMap", "fibermill-settings")["data"]
    assert not SECRET_KEYS & set(settings)
    assert "FIBERMILL_REDIS_URL" not in settings  # holds the password: built in each pod


def test_every_reference_resolves(overlay):
    """Secrets, ConfigMaps (and their keys) and claims that pods use all exist (the base has
    no Secret: the overlay provides it)."""

    def data_keys(kind, name):
        obj = k8s.one(overlay, kind, name)
        return set(obj.get("data") or {}) | set(obj.get("stringData") or {})

    for w in k8s.workloads(overlay):
        spec = k8s.pod_spec(w)
        for c in k8s.containers(w):
            for var in k8s.env_list(c):
                for kind, ref_name in (
                    ("Secret", "secretKeyRef"),
                    ("ConfigMap", "configMapKeyRef"),
                ):
                    ref = var.get("valueFrom", {}).get(ref_name)
                    if ref and not ref.get("optional"):
                        assert ref["key"] in data_keys(kind, ref["name"]), (
                            w["metadata"]["name"],
                            ref,
                        )
            for source in c.get("envFrom") or []:
                for kind, ref_name in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
                    if ref_name in source:
                        k8s.one(overlay, kind, source[ref_name]["name"])
        for volume in spec.get("volumes") or []:
            if "configMap" in volume:
                k8s.one(overlay, "ConfigMap", volume["configMap"]["name"])
            if "secret" in volume:
                k8s.one(overlay, "Secret", volume["secret"]["secretName"])
            if "persistentVolumeClaim" in volume:
                k8s.one(
                    overlay, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]
                )


def test_the_secret_is_generated_per_installation_and_usable(overlay, tmp_path):
    """No secret is committed: the overlay's Secret comes from secrets.env, which git ignores
    and make-secrets.sh writes with fresh random values (never over an existing file)."""
    assert "deploy/k8s/overlays/*/secrets.env" in (REPO_ROOT / ".gitignore").read_text()
    committed = subprocess.run(["git", "ls-files", str(k8s.K8S)], capture_output=True,
                               text=True, check=True, cwd=k8s.K8S).stdout
    assert "secrets.env" not in committed and "kind: Secret" not in "".join(
        p.read_text() for p in k8s.K8S.rglob("*.yaml"))
    secret = k8s.one(overlay, "Secret", "fibermill-secrets")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    # No signing secret: each installation generates its own (kept in Redis).
    assert "webhook-secret" not in data
    shutil.copy(k8s.OVERLAY / "make-secrets.sh", tmp_path)
    made = [subprocess.run(["sh", str(tmp_path / "make-secrets.sh")], capture_output=True,
                           text=True, check=True).stdout for _ in range(2)]
    assert "API key" in made[0] and "leaving it" in made[1]
    fresh = dict(line.split("=", 1) for line in (tmp_path / "secrets.env").read_text().split())
    assert fresh["redis-password"] != data["redis-password"]  # random per installation
    key = made[0].split()[-1]
    assert fresh["api-keys"] == "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    assert re.fullmatch(r"[A-Za-z0-9]+", data["redis-password"]), "must be URL-safe"
    for entry in data["api-keys"].split(","):
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", entry.strip())


# --- the model registry ---------------------------------------------------------------------


def mount_of(workload, container, volume_type: str, name: str) -> str:
    volumes = {
        v["name"]: v
        for v in k8s.pod_spec(workload).get("volumes") or []
        if (v.get(volume_type) or {}).get("name" if volume_type == "configMap" else "claimName")
        == name
    }
    mounts = [m["mountPath"] for m in container.get("volumeMounts") or [] if m["name"] in volumes]
    assert len(mounts) == 1, f"{container['name']}: {volume_type} {name} mounted {mounts}"
    return mounts[0]


@pytest.mark.parametrize("component", ["api", "worker"])
def test_registry_is_mounted_where_the_setting_points(rendered, component, tmp_path):
    w = k8s.workload_for(rendered, component)
    container = k8s.main_container(w)
    mount = mount_of(w, container, "configMap", "fibermill-registry")
    assert str(setting(rendered, container, "model_registry")) == f"{mount}/registry.yaml"
    registry(rendered, tmp_path)  # parses as a registry


def test_worker_models_are_on_the_models_volume(rendered, tmp_path):
    w = worker(rendered)
    container = k8s.main_container(w)
    models_mount = mount_of(w, container, "persistentVolumeClaim", "fibermill-models")
    volume = next(v for v in k8s.pod_spec(w)["volumes"] if "persistentVolumeClaim" in v)
    assert volume["persistentVolumeClaim"].get("readOnly") is True
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] == volume["name"])
    reg = registry(rendered, tmp_path)
    served = setting(rendered, container, "served_models")
    assert served, "FIBERMILL_WORKER_MODELS must name the models this Deployment serves"
    for model in served:
        path = reg.get(model).path
        assert path.is_absolute() and path.parent == Path(models_mount), path
        # the example serves the demo models committed in the repository
        assert (REPO_ROOT / "models" / path.name).is_dir(), path.name


def test_the_api_reads_the_models_where_the_workers_do(rendered):
    """The API counts prompts with each text model's tokenizer.json against its config.json:
    the registry's paths must lead to the same files in both, read-only."""
    mounts = {}
    for component in ("api", "worker"):
        w = k8s.workload_for(rendered, component)
        container = k8s.main_container(w)
        mounts[component] = mount_of(w, container, "persistentVolumeClaim", "fibermill-models")
        volume = next(v for v in k8s.pod_spec(w)["volumes"]
                      if (v.get("persistentVolumeClaim") or {}).get("claimName")
                      == "fibermill-models")
        assert volume["persistentVolumeClaim"].get("readOnly") is True, component
        assert all(m.get("readOnly") for m in container["volumeMounts"]
                   if m["name"] == volume["name"]), component
    assert mounts["api"] == mounts["worker"]


# --- workloads: labels, security, resources, lifecycle ------------------------------------------


def test_labels_are_consistent(rendered):
    for obj in rendered:
        if obj["kind"] == "Namespace":
            continue
        labels = obj["metadata"].get("labels") or {}
        assert labels.get(k8s.NAME_LABEL) == k8s.APP, key(obj)
        assert labels.get(k8s.PART_OF_LABEL) == k8s.APP, key(obj)
    components = set()
    for w in k8s.workloads(rendered):
        template_labels = k8s.pod_template(w)["metadata"]["labels"]
        component = template_labels[k8s.COMPONENT_LABEL]
        assert w["metadata"]["labels"][k8s.COMPONENT_LABEL] == component
        assert template_labels[k8s.NAME_LABEL] == k8s.APP
        assert k8s.matches(w["spec"]["selector"], template_labels)
        components.add(component)
    assert components == {"api", "worker", "redis"}


def test_services_select_one_workload_and_its_ports(rendered):
    for service in k8s.find(rendered, "Service"):
        targets = k8s.selected_workloads(rendered, service["spec"]["selector"])
        assert len(targets) == 1, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            k8s.workload_port(targets[0], port["targetPort"])
            assert port.get("name"), "named ports (monitors refer to them by name)"


def test_pods_run_unprivileged(rendered):
    for w in k8s.workloads(rendered):
        spec = k8s.pod_spec(w)
        name = w["metadata"]["name"]
        assert spec.get("automountServiceAccountToken") is False, name
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] > 0, name
        assert security["seccompProfile"]["type"] == "RuntimeDefault", name
        for c in k8s.containers(w):
            cs = c["securityContext"]
            assert cs["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert cs["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert cs["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert not cs.get("privileged"), (name, c["name"])
            assert "runAsUser" not in cs or cs["runAsUser"] > 0
            assert c["resources"]["limits"]["memory"], (name, c["name"])


def test_workers_get_exactly_one_gpu(rendered):
    container = k8s.main_container(worker(rendered))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"].get("nvidia.com/gpu", 1) == 1
    for component in ("api", "redis"):
        for c in k8s.containers(k8s.workload_for(rendered, component)):
            assert "nvidia.com/gpu" not in c["resources"]["limits"], (component, c["name"])


def sleep_seconds(hook: dict) -> int:
    command = hook["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


def test_worker_drains_within_the_grace_period(rendered):
    """preStop, then SIGTERM: the worker finishes what it holds for FIBERMILL_DRAIN_SECONDS (at
    least the longest sub-request), hands back the rest, and is killed by the launcher 15 s
    after that at the latest: all before Kubernetes' SIGKILL."""
    w = worker(rendered)
    container = k8s.main_container(w)
    time_limit = setting(rendered, container, "subrequest_time_limit_seconds")
    drain = setting(rendered, container, "drain_seconds")
    grace = k8s.pod_spec(w)["terminationGracePeriodSeconds"]
    assert drain >= time_limit
    assert grace > sleep_seconds(container["lifecycle"]) + drain + 15


def test_api_drains_within_the_grace_period(rendered):
    w = api(rendered)
    container = k8s.main_container(w)
    drain = setting(rendered, container, "api_drain_seconds")
    longest_request = setting(rendered, container, "max_wait_seconds") + 5
    grace = k8s.pod_spec(w)["terminationGracePeriodSeconds"]
    assert grace > sleep_seconds(container["lifecycle"]) + drain + longest_request


def test_api_has_a_prestop_and_survives_disruptions(rendered):
    w = api(rendered)
    container = k8s.main_container(w)
    assert (
        0 < sleep_seconds(container["lifecycle"]) < k8s.pod_spec(w)["terminationGracePeriodSeconds"]
    )
    pdb = k8s.one(rendered, "PodDisruptionBudget", w["metadata"]["name"])
    assert k8s.selected_workloads(rendered, pdb["spec"]["selector"]) == [w]
    hpa = k8s.one(rendered, "HorizontalPodAutoscaler")
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def test_api_hpa_scales_the_api_on_cpu(rendered):
    hpa = k8s.one(rendered, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    w = api(rendered)
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == (
        "apps/v1",
        "Deployment",
        w["metadata"]["name"],
    )
    assert hpa["spec"]["minReplicas"] >= 1, "the API never scales to zero"
    assert hpa["spec"]["maxReplicas"] >= hpa["spec"]["minReplicas"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    # utilization is relative to the request
    assert k8s.main_container(w)["resources"]["requests"]["cpu"]


def test_autoscaled_deployments_leave_replicas_to_the_autoscaler(rendered):
    """A `replicas` in the manifest would reset the autoscaler's choice on every apply."""
    targets = {
        o["spec"]["scaleTargetRef"]["name"]
        for o in rendered
        if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
    }
    assert targets == {api(rendered)["metadata"]["name"], worker(rendered)["metadata"]["name"]}
    for name in targets:
        assert "replicas" not in k8s.one(rendered, "Deployment", name)["spec"]


def test_redis_is_durable_and_password_protected(rendered):
    sts = redis(rendered)
    assert sts["kind"] == "StatefulSet"
    container = k8s.container_named(sts, "redis")
    image, tag = container["image"].split(":")
    assert image == "redis" and tag.startswith("7")
    # The role script chooses replicaof, then runs redis-server with the container's args.
    (script,) = [a for a in container["command"] if a.startswith("/scripts/")]
    text = k8s.one(rendered, "ConfigMap", "fibermill-redis-scripts")["data"][Path(script).name]
    assert 'exec redis-server "$@"' in text
    options = dict(zip(container["args"][::2], container["args"][1::2], strict=True))
    assert options["--appendonly"] == "yes"
    # The fsync policy is one setting: everysec by default, `always` a one-line switch.
    assert options["--appendfsync"] == "$(REDIS_APPENDFSYNC)"
    ref = next(v for v in k8s.env_list(container)
               if v["name"] == "REDIS_APPENDFSYNC")["valueFrom"]["configMapKeyRef"]
    policy = k8s.one(rendered, "ConfigMap", ref["name"])["data"][ref["key"]]
    assert policy == "everysec"
    switch = (k8s.OVERLAY / "patches" / "settings.yaml").read_text()
    assert f"# {ref['key']}: always" in switch
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--hash-max-listpack-value"] == "1024"
    assert options["--requirepass"] == options["--masterauth"] == "$(REDIS_PASSWORD)"
    # an isolated primary refuses writes
    assert options["--min-replicas-to-write"] == "1"
    assert int(options["--min-replicas-max-lag"]) <= 10
    assert "--maxmemory" in options
    data_dir = options["--dir"]
    templates = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[data_dir] in templates
    assert k8s.container_port(container, "redis") == 6379
    governing = k8s.one(rendered, "Service", sts["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"


def test_redis_is_reachable_only_from_api_workers_and_its_peers(rendered):
    """Clients and replication on 6379, sentinels on 26379: from the API, the workers and the
    Redis pods (replicas, sentinels watching each other), nothing else."""
    policies = [
        p
        for p in k8s.find(rendered, "NetworkPolicy")
        if k8s.selected_workloads(rendered, p["spec"]["podSelector"]) == [redis(rendered)]
    ]
    assert len(policies) == 1
    policy = policies[0]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    sts = redis(rendered)
    ports = [k8s.workload_port(sts, "redis"), k8s.workload_port(sts, "sentinel")]
    assert sorted(p["port"] for p in rule["ports"]) == sorted(ports) == [6379, 26379]
    allowed = set()
    for peer in rule["from"]:
        assert set(peer) == {"podSelector"}, "pods of this namespace only"
        allowed |= {
            w["metadata"]["name"] for w in k8s.selected_workloads(rendered, peer["podSelector"])
        }
    assert allowed == {
        api(rendered)["metadata"]["name"],
        worker(rendered)["metadata"]["name"],
        sts["metadata"]["name"],
    }


def test_prometheus_may_scrape_the_workers(rendered):
    w = worker(rendered)
    port = k8s.container_port(k8s.main_container(w), "metrics")
    policies = [
        p
        for p in k8s.find(rendered, "NetworkPolicy")
        if w in k8s.selected_workloads(rendered, p["spec"]["podSelector"])
    ]
    assert policies
    rules = [r for p in policies for r in p["spec"]["ingress"]]
    assert any(
        port in [p["port"] for p in r["ports"]]
        and any("namespaceSelector" in peer for peer in r["from"])
        for r in rules
    )


def test_every_network_policy_selects_pods(rendered):
    for policy in k8s.find(rendered, "NetworkPolicy"):
        assert k8s.selected_workloads(rendered, policy["spec"]["podSelector"]), policy["metadata"][
            "name"
        ]


def test_namespace_enforces_restricted_pod_security(rendered):
    namespace = k8s.one(rendered, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in rendered:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == namespace["metadata"]["name"], key(obj)


def test_config_files_are_plain_yaml():
    """No templating left in the manifests (kustomize only)."""
    for path in k8s.K8S.rglob("*.yaml"):
        text = path.read_text()
        assert "{{" not in text, path
        list(yaml.safe_load_all(text))
