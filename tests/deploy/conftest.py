"""Fixtures of the deployment tests: the rendered kustomize base and example overlay."""

import subprocess

import pytest

from tests.deploy import k8s
from tests.deploy.kustomize import render


@pytest.fixture(scope="session", autouse=True)
def example_secrets() -> None:
    """The example overlay's Secret comes from secrets.env, made per checkout by its script
    (git ignores it), as an operator makes it once per installation."""
    script = k8s.OVERLAY / "make-secrets.sh"
    subprocess.run(["sh", str(script)], check=True, capture_output=True)


@pytest.fixture(scope="session")
def base() -> list[dict]:
    return render(k8s.BASE)


@pytest.fixture(scope="session")
def overlay() -> list[dict]:
    return render(k8s.OVERLAY)


@pytest.fixture(scope="session", params=["base", "overlay"])
def rendered(request) -> list[dict]:
    """Each rendering in turn: what holds for the base must hold for the overlay."""
    return render(k8s.BASE if request.param == "base" else k8s.OVERLAY)
