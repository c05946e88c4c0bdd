"""Helpers to read rendered manifests: look objects up, walk pod templates, resolve ports,
match label selectors. Plain functions over the dicts tests/deploy/kustomize.py returns."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.registry import ModelRegistry
from shared.settings import REPO_ROOT, Settings

K8S = REPO_ROOT / "deploy" / "k8s"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "example"
README = K8S / "README.md"

NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
PART_OF_LABEL = "app.kubernetes.io/part-of"
APP = "fibermill"

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
# Custom resources: not in the Kubernetes schemas; each is checked field by field elsewhere.
CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}


def target_kubernetes_version() -> str:
    """The Kubernetes version deploy/k8s/README.md says the manifests target ("1.30")."""
    found = re.findall(r"[Tt]arget(?:s|ed)?:?\s+\**Kubernetes\s+(1\.\d+)", README.read_text())
    assert len(set(found)) == 1, f"README.md must name one target Kubernetes version: {found}"
    return found[0]


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def pod_template(workload: dict) -> dict:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]


def pod_spec(workload: dict) -> dict:
    return pod_template(workload)["spec"]


def containers(workload: dict) -> list[dict]:
    spec = pod_spec(workload)
    return list(spec.get("initContainers") or []) + list(spec["containers"])


def workload_for(objects: list[dict], component: str) -> dict:
    found = [
        w
        for w in workloads(objects)
        if pod_template(w)["metadata"]["labels"].get(COMPONENT_LABEL) == component
    ]
    assert len(found) == 1, f"expected one workload of component {component}, found {found}"
    return found[0]


def main_container(workload: dict) -> dict:
    cs = pod_spec(workload)["containers"]
    assert len(cs) == 1, f"{workload['metadata']['name']}: expected one container"
    return cs[0]


def container_named(workload: dict, name: str) -> dict:
    """A container of a pod with several (Redis's data node beside its sentinel)."""
    found = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(found) == 1, f"{workload['metadata']['name']}: expected one container {name}"
    return found[0]


def workload_port(workload: dict, port: int | str) -> int:
    """A port by number or by name, as one of any of the workload's containers' ports."""
    for c in pod_spec(workload)["containers"]:
        if any(port in (p["containerPort"], p.get("name")) for p in c.get("ports") or []):
            return container_port(c, port)
    raise AssertionError(f"{workload['metadata']['name']} has no port {port!r}")


def env_list(container: dict) -> list[dict]:
    return list(container.get("env") or [])


def env_value(objects: list[dict], container: dict, name: str) -> str | None:
    """A variable's literal value: from the container's env, else from its envFrom ConfigMaps."""
    for var in env_list(container):
        if var["name"] == name:
            return var.get("value")
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef")
        if ref:
            data = one(objects, "ConfigMap", ref["name"]).get("data") or {}
            if name in data:
                return data[name]
    return None


def env_names(objects: list[dict], container: dict) -> list[str]:
    names = [var["name"] for var in env_list(container)]
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef")
        if ref:
            names.extend((one(objects, "ConfigMap", ref["name"]).get("data") or {}).keys())
    return names


def container_port(container: dict, port: int | str) -> int:
    """A port by number or by name, as one of the container's ports."""
    for p in container.get("ports") or []:
        if port in (p["containerPort"], p.get("name")):
            return p["containerPort"]
    raise AssertionError(f"container {container['name']} has no port {port!r}")


def probes(container: dict) -> Iterator[tuple[str, dict]]:
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in container:
            yield kind, container[kind]


def matches(selector: dict, labels: dict) -> bool:
    """Does a label selector (matchLabels and matchExpressions, or a plain map) match?"""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def selected_workloads(objects: list[dict], selector: dict) -> list[dict]:
    return [
        w for w in workloads(objects) if matches(selector, pod_template(w)["metadata"]["labels"])
    ]


def images(objects: list[dict]) -> list[str]:
    return [c["image"] for w in workloads(objects) for c in containers(w)]


def api(objects: list[dict]) -> dict:
    return workload_for(objects, "api")


def worker(objects: list[dict]) -> dict:
    return workload_for(objects, "worker")


def redis(objects: list[dict]) -> dict:
    return workload_for(objects, "redis")


def settings_values(objects: list[dict], container: dict) -> dict[str, str | None]:
    """The FIBERMILL_* variables a container gets (ConfigMap, then its own env, which wins)."""
    return {
        name: env_value(objects, container, name)
        for name in env_names(objects, container)
        if name.startswith("FIBERMILL_")
    }


def settings_kwargs(objects: list[dict], container: dict) -> dict[str, str]:
    """Settings(**kwargs) for the literal FIBERMILL_* values the container gets."""
    kwargs = {}
    for name, value in settings_values(objects, container).items():
        field = name.removeprefix("FIBERMILL_").lower()
        if value is not None and field in Settings.model_fields:
            kwargs[field] = value
    return kwargs


def setting(objects: list[dict], container: dict, field: str) -> Any:
    """A setting as the container's process will see it (defaults for what is not set)."""
    return getattr(Settings(**settings_kwargs(objects, container)), field)


def registry_text(objects: list[dict]) -> str:
    return one(objects, "ConfigMap", "fibermill-registry")["data"]["registry.yaml"]


def registry(objects: list[dict], tmp_path: Path) -> ModelRegistry:
    """The model registry ConfigMap, parsed as the services parse it."""
    path = tmp_path / "registry.yaml"
    path.write_text(registry_text(objects))
    return ModelRegistry.load(path)
