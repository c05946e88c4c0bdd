"""A small kustomize renderer for the subset of kustomize that deploy/k8s uses.

It needs no kustomize binary. `render(folder)` returns the objects that
`kubectl kustomize folder` would print (as dicts, in no particular order); where kubectl is
installed, a test checks that the two agree.

The subset, and nothing else (any other field of a kustomization.yaml raises):

- `resources`: YAML files (one or more documents each) and folders holding a
  kustomization.yaml, rendered recursively (a base's own transformations apply first).
- `namespace`: sets metadata.namespace on every namespaced object. A Namespace object is left
  alone, and must be the one named (kustomize would rename it otherwise).
- `images`: for each entry (`name`, optional `newName`, `newTag`, `digest`), every container
  and init container of a pod template whose image repository is exactly `name` gets the new
  repository, tag or digest.
- `patches` with `path` only (no `target`, no inline `patch`): strategic-merge patches whose
  documents name their target by kind and metadata.name. Only maps are merged (recursively;
  a scalar replaces, null deletes the key). A patch containing a list raises, because
  kustomize merges lists by their merge keys, which this renderer does not do.
- `secretGenerator` with `name` and `envs` (files of `key=value` lines; blank lines and `#`
  comments skipped), which must come with `generatorOptions.disableNameSuffixHash: true` (no
  hashed names, so no references to rewrite) and may set `generatorOptions.labels`: an Opaque
  Secret whose `data` holds each value base64-encoded.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION = "kustomization.yaml"
SUPPORTED_FIELDS = {"apiVersion", "kind", "namespace", "resources", "images", "patches",
                    "secretGenerator", "generatorOptions"}
# Kinds with no namespace (of those a Fibermill deployment could plausibly contain).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "PriorityClass",
    "StorageClass",
    "RuntimeClass",
}


class KustomizeError(ValueError):
    pass


def load_kustomization(folder: Path) -> dict:
    path = Path(folder) / KUSTOMIZATION
    if not path.is_file():
        raise KustomizeError(f"{folder}: no {KUSTOMIZATION}")
    data = yaml.safe_load(path.read_text()) or {}
    unknown = set(data) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{path}: fields this renderer does not implement: {sorted(unknown)}")
    if data.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{path}: kind must be Kustomization")
    return data


def load_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(Path(path).read_text()) if doc is not None]


def referenced_files(folder: Path) -> list[Path]:
    """Every file a kustomization (and the kustomizations it includes) reads, resolved."""
    folder = Path(folder).resolve()
    data = load_kustomization(folder)
    files = [folder / KUSTOMIZATION]
    for entry in data.get("resources") or []:
        target = (folder / entry).resolve()
        files.extend(referenced_files(target) if target.is_dir() else [target])
    files.extend((folder / p["path"]).resolve() for p in data.get("patches") or [])
    files.extend((folder / env).resolve() for g in data.get("secretGenerator") or []
                 for env in g.get("envs") or [])
    return files


def render(folder: Path) -> list[dict]:
    folder = Path(folder).resolve()
    data = load_kustomization(folder)
    objects: list[dict] = []
    for entry in data.get("resources") or []:
        target = (folder / entry).resolve()
        if target.is_dir():
            objects.extend(render(target))
        elif target.is_file():
            objects.extend(copy.deepcopy(load_documents(target)))
        else:
            raise KustomizeError(f"{folder / KUSTOMIZATION}: resource {entry} does not exist")
    objects.extend(_generated_secrets(folder, data))
    _check_unique(objects, folder)
    for patch in data.get("patches") or []:
        _apply_patch_file(objects, folder, patch)
    for image in data.get("images") or []:
        _set_image(objects, image)
    if "namespace" in data:
        _set_namespace(objects, data["namespace"])
    return objects


def _generated_secrets(folder: Path, data: dict) -> list[dict]:
    generators = data.get("secretGenerator") or []
    if not generators:
        return []
    options = data.get("generatorOptions") or {}
    if set(options) - {"disableNameSuffixHash", "labels"} or not options.get(
            "disableNameSuffixHash"):
        raise KustomizeError(f"{folder / KUSTOMIZATION}: generatorOptions must set "
                             "disableNameSuffixHash: true (and may set labels), nothing else")
    secrets = []
    for g in generators:
        if set(g) - {"name", "envs"}:
            raise KustomizeError(f"{folder / KUSTOMIZATION}: secretGenerator supports name "
                                 f"and envs only, not {sorted(set(g) - {'name', 'envs'})}")
        values: dict[str, str] = {}
        for env in g.get("envs") or []:
            path = folder / env
            if not path.is_file():
                raise KustomizeError(f"{folder / KUSTOMIZATION}: env file {env} does not exist")
            for line in path.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    name, _, value = line.partition("=")
                    values[name.strip()] = value
        metadata: dict[str, Any] = {"name": g["name"]}
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        secrets.append({
            "apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
        })
    return secrets


def key(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def _check_unique(objects: list[dict], folder: Path) -> None:
    seen = set()
    for obj in objects:
        k = (obj["kind"], obj["metadata"]["name"])
        if k in seen:
            raise KustomizeError(f"{folder}: {k} is defined twice")
        seen.add(k)


def _apply_patch_file(objects: list[dict], folder: Path, patch: dict) -> None:
    if set(patch) != {"path"}:
        raise KustomizeError(f"{folder}: only `patches: - path: FILE` is implemented, got {patch}")
    for doc in load_documents(folder / patch["path"]):
        _reject_lists(doc, f"{patch['path']}")
        kind, name = doc["kind"], doc["metadata"]["name"]
        targets = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
        if len(targets) != 1:
            raise KustomizeError(f"{patch['path']}: {len(targets)} objects match {kind}/{name}")
        _merge(targets[0], doc)


def _reject_lists(node: Any, where: str) -> None:
    if isinstance(node, list):
        raise KustomizeError(f"{where}: patches with lists are not implemented")
    if isinstance(node, dict):
        if "$patch" in node:
            raise KustomizeError(f"{where}: $patch directives are not implemented")
        for value in node.values():
            _reject_lists(value, where)


def _merge(target: dict, patch: dict) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """`repo[:tag][@digest]` -> (repo, tag, digest). A port in the registry host is no tag."""
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    tag = None
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        image, tag = image.rsplit(":", 1)
    return image, tag, digest


def _containers(obj: dict) -> list[dict]:
    spec = obj.get("spec") or {}
    pod = (spec.get("jobTemplate", {}).get("spec", spec).get("template") or {}).get("spec") or {}
    return list(pod.get("containers") or []) + list(pod.get("initContainers") or [])


def _set_image(objects: list[dict], entry: dict) -> None:
    unknown = set(entry) - {"name", "newName", "newTag", "digest"}
    if unknown:
        raise KustomizeError(f"images: fields not implemented: {sorted(unknown)}")
    for obj in objects:
        for container in _containers(obj):
            repo, tag, digest = split_image(container["image"])
            if repo != entry["name"]:
                continue
            repo = entry.get("newName", repo)
            if "digest" in entry:
                container["image"] = f"{repo}@{entry['digest']}"
                continue
            tag = entry.get("newTag", tag)
            container["image"] = (
                repo + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
            )


def _set_namespace(objects: list[dict], namespace: str) -> None:
    for obj in objects:
        if obj["kind"] == "Namespace":
            if obj["metadata"]["name"] != namespace:
                raise KustomizeError(
                    f"Namespace {obj['metadata']['name']} differs from namespace: {namespace}"
                )
        elif obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
