"""Every built-in object validates (strictly: no unknown fields) against the Kubernetes
schemas of the version deploy/k8s/README.md targets, bundled offline by kubernetes-validate.
Custom resources (KEDA, Prometheus Operator) are checked field by field in test_keda.py and
test_monitoring.py."""

import kubernetes_validate
import pytest

from tests.deploy import k8s
from tests.deploy.kustomize import key


def test_target_version_is_bundled():
    version = k8s.target_kubernetes_version()
    bundled = {v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()}
    assert version in bundled


def test_every_builtin_object_validates(rendered):
    version = k8s.target_kubernetes_version()
    builtin = [o for o in rendered if (o["apiVersion"], o["kind"]) not in k8s.CUSTOM_KINDS]
    assert builtin
    for obj in builtin:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{key(obj)} at {path}: {e.message}")


def test_only_known_custom_resources(rendered):
    version = k8s.target_kubernetes_version()
    for obj in rendered:
        if (obj["apiVersion"], obj["kind"]) in k8s.CUSTOM_KINDS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(obj, version, strict=True)


def test_a_bad_field_is_caught():
    """The validation is strict: a misspelt field fails (the test above would catch typos)."""
    bad = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80, "targetPrt": "http"}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, k8s.target_kubernetes_version(), strict=True)
