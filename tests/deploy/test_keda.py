"""The KEDA ScaledObject, field by field against KEDA's documented ScaledObject spec
(keda.sh/docs/2.16/reference/scaledobject-spec) and prometheus scaler
(keda.sh/docs/2.16/scalers/prometheus), and against the worker it scales."""

import math
import re
from urllib.parse import urlparse

import kubernetes_validate
import pytest

from shared.settings import Settings
from tests.deploy import facts, k8s
from tests.deploy.k8s import registry, setting, worker

BACKLOG_METRIC = "fibermill_subrequests_backlog"

SPEC_FIELDS = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
SCALE_TARGET_FIELDS = {"apiVersion", "kind", "name", "envSourceContainerName"}
ADVANCED_FIELDS = {
    "restoreToOriginalReplicaCount",
    "horizontalPodAutoscalerConfig",
    "scalingModifiers",
}
HPA_CONFIG_FIELDS = {"name", "behavior"}
TRIGGER_FIELDS = {"type", "metadata", "name", "useCachedMetrics", "authenticationRef", "metricType"}
PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
PROMETHEUS_OPTIONAL = {
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "queryParameters",
    "unsafeSsl",
    "authModes",
}


@pytest.fixture(params=["base", "overlay"])
def objects(request, base, overlay):
    return base if request.param == "base" else overlay


@pytest.fixture
def scaled(objects):
    return k8s.one(objects, "ScaledObject")


@pytest.fixture
def trigger(scaled):
    (only,) = scaled["spec"]["triggers"]
    return only


def test_spec_has_only_documented_fields(scaled):
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= SPEC_FIELDS
    assert {"scaleTargetRef", "triggers"} <= set(spec)
    assert set(spec["scaleTargetRef"]) <= SCALE_TARGET_FIELDS
    assert set(spec.get("advanced", {})) <= ADVANCED_FIELDS
    assert (
        set(spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})) <= HPA_CONFIG_FIELDS
    )
    for name in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[name], int) and not isinstance(spec[name], bool), name


def test_scales_the_worker_deployment(objects, scaled):
    ref = scaled["spec"]["scaleTargetRef"]
    target = worker(objects)
    assert ref["name"] == target["metadata"]["name"]
    assert ref.get("kind", "Deployment") == target["kind"] == "Deployment"
    assert ref.get("apiVersion", "apps/v1") == target["apiVersion"]
    assert scaled["metadata"].get("namespace") == target["metadata"].get("namespace")


def test_replica_bounds_are_sane(scaled):
    spec = scaled["spec"]
    assert spec["minReplicaCount"] == 0, "workers scale to zero"
    assert "idleReplicaCount" not in spec  # only meaningful with minReplicaCount > 0
    assert spec["maxReplicaCount"] >= 1, "workers can scale up"
    assert spec["maxReplicaCount"] <= 64
    assert 5 <= spec["pollingInterval"] <= 60
    # long enough not to unload models between bursts, short enough to free idle GPUs
    assert 60 <= spec["cooldownPeriod"] <= 3600
    fallback = spec.get("fallback")
    if fallback:
        assert set(fallback) == {"failureThreshold", "replicas"}
        assert fallback["failureThreshold"] >= 1
        assert fallback["replicas"] >= 1, "a fallback keeps workers running"
        assert fallback["replicas"] <= spec["maxReplicaCount"]
        assert trigger_metric_type(spec) == "AverageValue", "fallback needs AverageValue"


def trigger_metric_type(spec):
    return spec["triggers"][0].get("metricType", "AverageValue")


def test_hpa_behavior_is_a_valid_hpa_behavior(scaled):
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "x"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
            "maxReplicas": 1,
            "behavior": behavior,
        },
    }
    kubernetes_validate.validate(hpa, k8s.target_kubernetes_version(), strict=True)


def test_trigger_is_a_documented_prometheus_trigger(trigger):
    assert set(trigger) <= TRIGGER_FIELDS
    assert trigger["type"] == "prometheus"
    assert trigger.get("metricType", "AverageValue") == "AverageValue"
    metadata = trigger["metadata"]
    assert set(metadata) >= PROMETHEUS_REQUIRED
    assert set(metadata) <= PROMETHEUS_REQUIRED | PROMETHEUS_OPTIONAL
    for k, v in metadata.items():
        assert isinstance(v, str), f"trigger metadata is a map of strings: {k}={v!r}"
    address = urlparse(metadata["serverAddress"])
    assert address.scheme in ("http", "https") and address.hostname


def test_activates_on_the_first_queued_subrequest(trigger):
    assert float(trigger["metadata"]["activationThreshold"]) == 0


def test_query_sums_the_backlog_of_the_models_the_worker_serves(objects, scaled, trigger):
    query = trigger["metadata"]["query"]
    assert query.startswith("sum("), "must return a single element"
    # every API replica exports the same backlog: de-duplicate per model before the sum
    assert re.search(rf"max by \(model\) \(\s*{BACKLOG_METRIC}\{{", query), query
    selector = re.search(rf"{BACKLOG_METRIC}\{{([^}}]*)\}}", query).group(1)
    labels = dict(re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', selector))
    assert labels["namespace"] == scaled["metadata"]["namespace"]
    container = k8s.main_container(worker(objects))
    served = setting(objects, container, "served_models")
    assert sorted(labels["model"].split("|")) == sorted(served)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", m) for m in served), "no regex characters"


def test_backlog_metric_is_exported_by_the_api():
    """fibermill_subrequests_backlog: a per-model gauge on the API's /metrics."""
    declared = facts.declared_metrics(("services/api", "shared"))
    assert BACKLOG_METRIC in declared, f"{BACKLOG_METRIC} is not declared by the API"
    assert declared[BACKLOG_METRIC] in ("Gauge", ""), declared[BACKLOG_METRIC]


def launcher_command(objects, tmp_path) -> list[str]:
    """The Celery command line the launcher builds for the worker pod's one GPU."""
    from services.worker import launcher

    container = k8s.main_container(worker(objects))
    path = tmp_path / "registry.yaml"
    path.write_text(k8s.registry_text(objects))
    settings = Settings(**{**k8s.settings_kwargs(objects, container), "model_registry": path})
    return launcher.command(settings, launcher.Slot(0, "cuda", "0"), "worker")


def test_threshold_is_what_one_worker_holds(objects, trigger, tmp_path):
    """KEDA runs backlog / threshold workers: the threshold is the sub-requests one worker
    holds at once, its Celery concurrency (`-c`, as the launcher computes it)."""
    command = launcher_command(objects, tmp_path)
    concurrency = int(command[command.index("-c") + 1])
    threshold = float(trigger["metadata"]["threshold"])
    assert math.isclose(threshold, concurrency), (threshold, concurrency)


def test_worker_consumes_the_queues_of_the_models_it_serves(objects, tmp_path):
    from shared.names import queue_for

    command = launcher_command(objects, tmp_path)
    queues = command[command.index("-Q") + 1].split(",")
    container = k8s.main_container(worker(objects))
    served = setting(objects, container, "served_models")
    assert sorted(queues) == sorted(queue_for(m) for m in served)
    registry(objects, tmp_path)  # every served model is in the registry (else UnknownModel)
