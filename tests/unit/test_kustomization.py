"""deploy/k8s/kustomization.yaml has the fields its comment tells an operator to set, and they take effect."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def test_the_namespace_and_the_image_are_fields_to_edit() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))

    assert kustomization["namespace"]
    [image] = kustomization["images"]
    assert image["name"] == "tomoribot-ltm-worker"  # the name the Deployment and the Job use
    assert image["newName"]
    assert isinstance(image["newTag"], str)
    for manifest in ("deployment.yaml", "migrate-job.yaml"):
        assert f"image: {image['name']}:" in (K8S / manifest).read_text(encoding="utf-8"), manifest


def test_kustomize_puts_every_object_in_the_namespace_and_uses_the_image() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the manifests offline)")
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    [image] = kustomization["images"]

    rendered = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    containers = [
        c
        for d in documents
        if d["kind"] in ("Deployment", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]

    assert {d["metadata"].get("namespace") for d in documents} == {kustomization["namespace"]}
    assert {c["image"] for c in containers} == {f"{image['newName']}:{image['newTag']}"}
