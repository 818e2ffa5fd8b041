"""helm/corral rendered with the Helm v4 SDK (helm-python-sdk), and what the tests read from it."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "corral"
VALUE_SETS = ("default", *sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml")))
"""The default values and every set in helm/corral/ci (chart-testing's `ci/*-values.yaml` convention)."""
RELEASE, NAMESPACE = "corral", "corral-test"


def values(name: str) -> dict[str, Any]:
    """A value set by name: 'default' (values.yaml alone) or the stem of a ci/ file."""
    return {} if name == "default" else yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text())


@functools.cache
def rendered(name: str) -> dict[str, str]:
    """Each template's output for value set `name`, as Helm renders it for an install (hooks included)."""
    return helm_python.Chart.load(str(CHART)).render(values(name), name=RELEASE, namespace=NAMESPACE)


def manifests(name: str) -> list[dict[str, Any]]:
    """Every Kubernetes object of value set `name`."""
    return [doc for text in rendered(name).values() for doc in yaml.safe_load_all(text) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of `kind` named `name`."""
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object name, pod spec) of every workload."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object/container name, container) of every container and init container."""
    for owner, spec in pod_specs(docs):
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            yield f"{owner}/{container['name']}", container
