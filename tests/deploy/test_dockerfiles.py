"""The Dockerfiles, read as text: every Fibermill image in the manifests has one (image
`fibermill-<name>` is built from services/<name>/Dockerfile), they are multi-stage and
non-root, the API image has no torch, the worker image keeps the torch it installs first, and
ports, commands and users agree with the manifests."""

import fnmatch
import json
import re
from pathlib import Path

import pytest
import setuptools

from shared.settings import REPO_ROOT
from tests.deploy import facts, k8s
from tests.deploy.kustomize import split_image

IMAGE_PREFIX = "fibermill-"
# Images the manifests may use that this repository does not build.
THIRD_PARTY = {"redis"}


def dockerfile_for(image: str) -> Path:
    """The convention: image `[registry/path/]fibermill-<name>[:tag]` is built from
    services/<name>/Dockerfile."""
    repo, _, _ = split_image(image)
    name = repo.rsplit("/", 1)[-1]
    assert name.startswith(IMAGE_PREFIX), image
    return REPO_ROOT / "services" / name.removeprefix(IMAGE_PREFIX) / "Dockerfile"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), with comments dropped and continuation lines joined."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        if not pending and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.strip():
            op, _, args = line.strip().partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for op, args in instructions(path):
        if op == "FROM":
            result.append([])
        if result:
            result[-1].append((op, args))
    return result


def pip_installs(path: Path) -> list[str]:
    return [
        cmd.strip()
        for op, args in instructions(path)
        if op == "RUN"
        for cmd in args.split("&&")
        if re.search(r"\bpip install\b", cmd)
    ]


def fibermill_images(objects) -> dict[str, list[dict]]:
    """Dockerfile -> the workloads running an image built from it."""
    found: dict[str, list[dict]] = {}
    for w in k8s.workloads(objects):
        for c in k8s.containers(w):
            repo = split_image(c["image"])[0].rsplit("/", 1)[-1]
            if repo.startswith(IMAGE_PREFIX):
                found.setdefault(str(dockerfile_for(c["image"])), []).append((w, c))
    return found


API = REPO_ROOT / "services" / "api" / "Dockerfile"
WORKER = REPO_ROOT / "services" / "worker" / "Dockerfile"
DOCKERFILES = [API, WORKER]


def test_every_image_has_a_dockerfile_or_is_a_pinned_third_party_image(rendered):
    for image in k8s.images(rendered):
        repo, tag, digest = split_image(image)
        name = repo.rsplit("/", 1)[-1]
        if name.startswith(IMAGE_PREFIX):
            assert dockerfile_for(image).is_file(), f"{image}: no {dockerfile_for(image)}"
        else:
            assert name in THIRD_PARTY, image
        assert (tag and tag != "latest") or digest, f"{image}: pin a tag"
    assert sorted(fibermill_images(rendered)) == sorted(str(p) for p in DOCKERFILES)


@pytest.mark.parametrize("path", DOCKERFILES, ids=["api", "worker"])
def test_multi_stage_and_non_root(path, base):
    all_stages = stages(path)
    assert len(all_stages) >= 2, "multi-stage: build, then a runtime stage"
    final = all_stages[-1]
    assert any(op == "COPY" and "--from=" in args for op, args in final), "runtime copies the build"
    users = [args for op, args in final if op == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) > 0, users
    # the pods run the image as the user it was built for
    for workload, _ in fibermill_images(base)[str(path)]:
        assert k8s.pod_spec(workload)["securityContext"]["runAsUser"] == int(users[-1])


@pytest.mark.parametrize("path", DOCKERFILES, ids=["api", "worker"])
def test_ports_and_command_match_the_manifests(path, base):
    final = stages(path)[-1]
    exposed = {int(p.split("/")[0]) for op, args in final if op == "EXPOSE" for p in args.split()}
    (cmd,) = [json.loads(args) for op, args in final if op == "CMD"]
    for _, container in fibermill_images(base)[str(path)]:
        assert exposed == {p["containerPort"] for p in container["ports"]}
        assert container["command"] == cmd


@pytest.mark.parametrize("path", DOCKERFILES, ids=["api", "worker"])
def test_no_models_baked_in(path):
    for op, args in instructions(path):
        assert op != "ADD", "COPY only"
        if op == "COPY" and "--from=" not in args:
            sources = args.split()[:-1]
            assert not any(s.startswith("models") for s in sources), args


def test_api_image_has_no_torch():
    installs = pip_installs(API)
    assert installs
    for cmd in installs:
        assert "torch" not in cmd.lower(), cmd
        extras = re.findall(r"\.\[([^\]]*)\]", cmd)
        assert extras == ["api"], cmd
    assert "torch" not in " ".join(facts.pyproject()["project"]["optional-dependencies"]["api"])


def test_worker_image_keeps_the_torch_it_installs_first():
    installs = pip_installs(WORKER)
    torch_at = next(i for i, c in enumerate(installs) if '"torch==${TORCH_VERSION}"' in c)
    worker_at = next(i for i, c in enumerate(installs) if '".[worker]"' in c)
    assert torch_at < worker_at
    assert re.search(r"(--constraint|-c) \S+", installs[worker_at]), "torch held by constraints"
    args = dict(a.split("=", 1) for op, a in instructions(WORKER) if op == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == facts.extra_pin("worker", "torch")


# Tooling no image runs: benchmarks, model building, and the local stack of `make run`.
TOOLING = ("benchmarks", "modelbuild", "services/devstack")


def dockerignore_patterns() -> list[str]:
    return [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def ignored(path: str) -> bool:
    """Whether the build context leaves `path` out: a pattern matches it or a folder above it
    (a left-out folder takes its contents with it)."""
    parts = path.split("/")
    return any(
        fnmatch.fnmatch("/".join(parts[:i]), p.rstrip("/"))
        for i in range(1, len(parts) + 1)
        for p in dockerignore_patterns()
        if not p.startswith("!")
    )


def test_dockerignore_keeps_the_context_small_but_complete():
    patterns = dockerignore_patterns()
    for needed in (".venv", ".git", "models/tiny-*", "run", ".pytest_cache"):
        assert needed in patterns or needed + "/" in patterns, needed

    for path in DOCKERFILES:
        for op, args in instructions(path):
            if op == "COPY" and "--from=" not in args:
                for source in args.split()[:-1]:
                    assert not ignored(source), f"{path}: COPY {source} is in .dockerignore"
    # what `pip install .` reads
    assert not ignored("pyproject.toml") and not ignored("README.md")


def test_the_build_context_leaves_the_tooling_out():
    for path in TOOLING:
        assert ignored(path), f"{path} is in the images' build context"
        assert ignored(f"{path}/__init__.py"), path
    assert not ignored("services/api/app.py") and not ignored("services/worker/launcher.py")


def test_the_wheel_carries_no_tooling():
    """The packages `pip install .` puts in the wheel, found as setuptools finds them from
    pyproject's [tool.setuptools.packages.find]."""
    find = facts.pyproject()["tool"]["setuptools"]["packages"]["find"]
    finder = (setuptools.find_namespace_packages if find.get("namespaces", True)
              else setuptools.find_packages)
    packages = finder(str(REPO_ROOT), include=find["include"], exclude=find.get("exclude", ()))
    assert {"shared", "services.api", "services.worker", "services.cli"} <= set(packages)
    tooling = [p for p in packages
               if p.split(".")[0] in ("benchmarks", "modelbuild")
               or p == "services.devstack" or p.startswith("services.devstack.")]
    assert not tooling, tooling
