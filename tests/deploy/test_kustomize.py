"""The kustomizations: every file they list exists, every manifest file is listed, and the
test renderer agrees with kustomize itself where kubectl is installed."""

import shutil
import subprocess

import pytest
import yaml

from tests.deploy import k8s
from tests.deploy.kustomize import KustomizeError, key, referenced_files, render, split_image

KUSTOMIZATIONS = [k8s.BASE, k8s.OVERLAY]


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=["base", "overlay"])
def test_every_listed_file_exists(folder):
    for path in referenced_files(folder):
        assert path.is_file(), f"{folder}: {path} is listed but does not exist"


def test_every_yaml_file_under_deploy_k8s_is_listed():
    listed = {p for folder in KUSTOMIZATIONS for p in referenced_files(folder)}
    on_disk = {p.resolve() for ext in ("*.yaml", "*.yml") for p in k8s.K8S.rglob(ext)}
    assert on_disk - listed == set(), "YAML files no kustomization lists"


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=["base", "overlay"])
def test_renders_uniquely_named_objects(folder):
    objects = render(folder)
    keys = [key(o) for o in objects]
    assert len(keys) == len(set(keys))
    assert objects, "nothing rendered"


def test_overlay_keeps_every_base_object(base, overlay):
    assert {key(o) for o in base} <= {key(o) for o in overlay}


def test_overlay_sets_images_and_patches(base, overlay):
    for image in k8s.images(overlay):
        repo, tag, _ = split_image(image)
        if repo.rsplit("/", 1)[-1].startswith("fibermill-"):
            assert repo.startswith("registry.example.com/"), image
            assert tag, image
    settings = k8s.one(overlay, "ConfigMap", "fibermill-settings")["data"]
    assert settings["FIBERMILL_PUBLIC_URL"].startswith("https://")
    for kind in ("ServiceMonitor", "PodMonitor"):
        for monitor in k8s.find(overlay, kind):
            assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
            # the patch merged into the base's labels instead of replacing them
            assert monitor["metadata"]["labels"][k8s.NAME_LABEL] == k8s.APP


def _kubectl_kustomize() -> bool:
    if shutil.which("kubectl") is None:
        return False
    probe = subprocess.run(
        ["kubectl", "kustomize", "--help"], capture_output=True, text=True, timeout=60
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _kubectl_kustomize(), reason="needs kubectl with kustomize built in")
@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=["base", "overlay"])
def test_renderer_matches_kubectl_kustomize(folder):
    out = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    theirs = {key(o): _unwrapped(o) for o in yaml.safe_load_all(out.stdout) if o}
    ours = {key(o): o for o in render(folder)}
    assert sorted(ours) == sorted(theirs)
    for k, obj in ours.items():
        assert obj == theirs[k], f"{k} differs from kubectl kustomize"


def _unwrapped(obj: dict) -> dict:
    """kustomize prints a long base64 value of a Secret wrapped in lines, which Kubernetes
    reads as the same bytes."""
    if obj.get("kind") == "Secret" and obj.get("data"):
        obj["data"] = {k: "".join(v.split()) for k, v in obj["data"].items()}
    return obj


# The renderer itself: what it refuses, so a kustomization using more than it implements fails
# loudly instead of rendering something kustomize would not.


def _write(folder, files):
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {A: '1'}\n"
DEPLOY = """apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers: [{name: x, image: 'localhost:5000/fibermill-api:1'}]
"""


def test_renderer_refuses_unimplemented_fields(tmp_path):
    _write(
        tmp_path, {"kustomization.yaml": "resources: [cm.yaml]\nnamePrefix: x-\n", "cm.yaml": CM}
    )
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(tmp_path)


def test_renderer_refuses_patches_with_lists(tmp_path):
    _write(
        tmp_path,
        {
            "kustomization.yaml": "resources: [d.yaml]\npatches: [{path: p.yaml}]\n",
            "d.yaml": DEPLOY,
            "p.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
            "spec: {template: {spec: {containers: [{name: x, image: y}]}}}\n",
        },
    )
    with pytest.raises(KustomizeError, match="lists"):
        render(tmp_path)


def test_renderer_refuses_a_missing_resource(tmp_path):
    _write(tmp_path, {"kustomization.yaml": "resources: [gone.yaml]\n"})
    with pytest.raises(KustomizeError, match="does not exist"):
        render(tmp_path)


def test_renderer_merges_maps_sets_images_and_namespace(tmp_path):
    _write(
        tmp_path,
        {
            "base/kustomization.yaml": "resources: [cm.yaml, d.yaml]\n",
            "base/cm.yaml": CM,
            "base/d.yaml": DEPLOY,
            "kustomization.yaml": "namespace: ns\nresources: [base]\npatches: [{path: p.yaml}]\n"
            "images: [{name: 'localhost:5000/fibermill-api', newTag: '2'}]\n",
            "p.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {B: '2'}\n",
        },
    )
    objects = render(tmp_path)
    cm = k8s.one(objects, "ConfigMap", "c")
    assert cm["data"] == {"A": "1", "B": "2"}
    assert cm["metadata"]["namespace"] == "ns"
    assert k8s.images(objects) == ["localhost:5000/fibermill-api:2"]


def test_split_image():
    assert split_image("redis:7.4") == ("redis", "7.4", None)
    assert split_image("host:5000/a/b") == ("host:5000/a/b", None, None)
    assert split_image("host:5000/a/b:1@sha256:ab") == ("host:5000/a/b", "1", "sha256:ab")
