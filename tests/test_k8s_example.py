"""examples/k8s: every YAML validates with kubernetes-validate --strict, and what the pods run names what they mount.

Checked: the schema of Kubernetes 1.28-1.37 (the serving Deployment's image volume from 1.31,
where the field appeared), the manifest in the ConfigMap through warmcache's own validation,
that each command (in the containers and in the headers' kubectl lines) names files the pod
mounts, that the warmup pods ask for a Neuron device, have deadlines and a signing key readable
by their owner only, and that every file the Dockerfile copies exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from warmcache.manifest import load_manifest
from warmcache.trust import generate_key

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "k8s"
VERSIONS = [f"1.{minor}.0" for minor in range(28, 38)]
#: The first schema with ``volumes[].image`` (alpha in 1.31, beta from 1.33, on by default from 1.35).
IMAGE_VOLUME_SINCE = 31


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [doc["spec"]["template"]["spec"]] if doc["kind"] in ("Job", "Deployment") else []


def mounted(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    return [m["mountPath"] for m in container.get("volumeMounts", [])]


#: The serving Deployments: Trainium, and CPU (what tools/ci/container_pipeline.sh runs in podman).
SERVING = ("serve-deployment.yaml", "serve-deployment-cpu.yaml")


@pytest.mark.parametrize("name", ["warmup-job.yaml", *SERVING])
def test_every_document_validates_strictly(name: str) -> None:
    since = IMAGE_VOLUME_SINCE if name in SERVING else 28
    for version in VERSIONS:
        if int(version.split(".")[1]) < since:
            continue
        for doc in documents(name):
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_serving_deployment_mounts_the_tag_warmup_pushes_read_only() -> None:
    (config_map,) = [d for d in documents("warmup-job.yaml") if d["kind"] == "ConfigMap"]
    manifest_text = config_map["data"]["deploy.toml"]
    (deployment,) = documents("serve-deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "image" in v]
    assert f'url = "oci://{volume["image"]["reference"]}"' in manifest_text, (
        "the deployment mounts the tag the warmup pushes"
    )
    (container,) = pod["containers"]
    cache_mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert cache_mount["readOnly"] and container["command"][2] == cache_mount["mountPath"]


@pytest.mark.parametrize("name", SERVING)
def test_a_serving_pod_can_write_nowhere(name: str) -> None:
    """A read-only root and no writable volume, /tmp included: the packages' .so files are mapped from the mount."""
    (deployment,) = documents(name)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not [v for v in pod["volumes"] if "emptyDir" in v], "no emptyDir, not even for /tmp"
    assert all(m["readOnly"] for m in container["volumeMounts"]), container["volumeMounts"]


def test_commands_name_files_the_pods_mount(tmp_path: Path) -> None:
    docs = documents("warmup-job.yaml") + [doc for name in SERVING for doc in documents(name)]
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    pod_root = tmp_path / "pod"  # the pod's /etc/warmcache, with the key files its secrets hold
    (pod_root / "etc/warmcache/signing").mkdir(parents=True)
    (pod_root / "etc/warmcache/trust").mkdir(parents=True)
    generate_key(pod_root / "etc/warmcache/signing/build-key")
    (pod_root / "etc/warmcache/signing/build-key.pub").rename(pod_root / "etc/warmcache/trust/build-key.pub")
    manifest_file = pod_root / "etc/warmcache/deploy.toml"
    manifest_file.write_text(
        config_map["data"]["deploy.toml"].replace('"/etc/warmcache/', f'"{pod_root}/etc/warmcache/')
    )
    manifest = load_manifest(manifest_file)
    assert manifest.store.push and manifest.store.url and manifest.store.url.is_oci and manifest.store.sign_key
    assert manifest.trusted_keys.configured and [m.device for m in manifest.models] == ["neuron"]
    files_in = {"/etc/warmcache/deploy.toml", "/etc/warmcache/signing/build-key", "/etc/warmcache/trust/build-key.pub"}
    paths_used: list[tuple[str, list[str]]] = []
    for doc in docs:
        for pod in pod_specs(doc):
            for container in pod.get("initContainers", []) + pod["containers"]:
                words = " ".join(container["command"])
                paths = re.findall(r"(/(?:etc|cache|models|app)[\w./-]*)", words)
                paths_used.append((container["name"], paths))
                mounts = mounted(pod, container)
                for path in paths:
                    assert path.startswith("/app/") or any(
                        path == m or path.startswith(m.rstrip("/") + "/") for m in mounts
                    ), f"{doc['metadata']['name']}/{container['name']}: {path} is not mounted"
                if doc["kind"] == "Job" and container["name"] == "warmup":
                    assert container["resources"]["limits"]["aws.amazon.com/neuron"] == "1"
                    assert set(mounts) >= {
                        "/etc/warmcache/deploy.toml",
                        "/etc/warmcache/signing",
                        "/etc/warmcache/trust",
                        "/etc/warmcache/docker",
                        "/cache",
                        "/models",
                    }
            if doc["kind"] == "Job":
                assert doc["spec"]["activeDeadlineSeconds"] > 0 and doc["spec"]["ttlSecondsAfterFinished"] > 0
                keys = [v for v in pod.get("volumes", []) if v["name"] == "signing-key"]
                assert all(v["secret"]["defaultMode"] == 0o400 for v in keys), (
                    "warmcache refuses a private key others can read"
                )
    # The kubectl lines in the headers: each warmcache command names a file its pod mounts.
    for name in ("warmup-job.yaml", *SERVING):
        for line in (EXAMPLES / name).read_text().splitlines():
            if line.startswith("#") and "kubectl exec" in line:
                for path in re.findall(r"(/etc/warmcache/[\w./-]+|/cache\b)", line):
                    assert path in files_in or path == "/cache", (
                        f"{name}: {line.strip()} names {path}, which no pod mounts"
                    )
    assert ("warmup", ["/etc/warmcache/deploy.toml", "/cache"]) in paths_used


def test_every_file_the_dockerfile_copies_exists_and_reaches_the_builder() -> None:
    text = (EXAMPLES / "Dockerfile").read_text()
    sources = [word for line in text.splitlines() if line.startswith("COPY ") for word in line.split()[1:-1]]
    assert sources and all((ROOT / source).exists() for source in sources), sources
    # .dockerignore admits only what the Dockerfile copies (a .venv would travel to the builder otherwise).
    admitted = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert set(sources) <= admitted, set(sources) - admitted
    lines = set(text.splitlines())
    assert {"ARG BASE=python:3.11-slim-bookworm", "FROM ${BASE} AS cpu", "FROM ${NEURON_BASE} AS neuron"} <= lines
    assert "USER 1000" in lines, "the cpu image runs as a non-root user"


def test_the_cpu_image_silences_only_inductors_python_h_warning() -> None:
    """Container warmups printed "Can't find Python.h" about 20 times (Debian's python3 has no headers, and Inductor's
    default wrapper needs none): the image's filter hides that warning, and no other."""
    (setting,) = re.findall(r'^ENV PYTHONWARNINGS="([^"]+)"$', (EXAMPLES / "Dockerfile").read_text(), flags=re.M)
    probe = "import warnings; warnings.warn(\"Can't find Python.h in /usr/include/python3.11\"); warnings.warn('kept')"
    done = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, "PYTHONWARNINGS": setting}, capture_output=True, text=True
    )
    assert "Python.h" not in done.stderr and "UserWarning: kept" in done.stderr, done.stderr


def test_the_container_pipeline_runs_what_the_deployment_runs() -> None:
    """tools/ci/container_pipeline.sh (CI) builds this Dockerfile and starts serve.py as the CPU Deployment does: the
    same command on the tag mounted at the Deployment's cache path, with nothing writable (``--read-only``, no tmpfs, as
    ``readOnlyRootFilesystem`` with no emptyDir); a drift here would leave CI testing another pod."""
    pipeline = (ROOT / "tools" / "ci" / "container_pipeline.sh").read_text()
    (deployment,) = documents("serve-deployment-cpu.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    python, script, cache = container["command"][:3]
    assert "-f examples/k8s/Dockerfile" in pipeline and "--target cpu" in pipeline
    assert f"destination={cache}" in pipeline and f"{python} {script} {cache} " in pipeline
    assert "--model-path" in container["command"] and "--model-path" in pipeline
    pod_user = deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert container["image"].endswith(":cpu") and pod_user == 1000, "the cpu image's own user"
    serving = re.search(r"^serve_args\(\) \{.*?^\}", pipeline, re.MULTILINE | re.DOTALL)
    assert serving and "--read-only " in serving.group() and "--tmpfs" not in serving.group(), "nothing writable"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^  (timed )?tools/ci/container_pipeline\.sh$", ci, re.MULTILINE), "CI runs the pipeline"
