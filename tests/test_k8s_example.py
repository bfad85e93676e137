"""examples/k8s: the Job parses, runs warmcache warmup on the manifest it mounts, and that manifest is valid.

No Kubernetes schema validator installs from the package registries here
(kubeconform and kubeval are Go binaries), so the YAML is parsed and the fields
the README relies on are checked; the embedded manifest goes through warmcache's
own validation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from warmcache.manifest import load_manifest

yaml = pytest.importorskip("yaml")

JOB = Path(__file__).resolve().parents[1] / "examples" / "k8s" / "warmup-job.yaml"


def test_the_k8s_job_warms_the_manifest_it_mounts(tmp_path: Path) -> None:
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all(JOB.read_text())}
    assert set(documents) == {"ConfigMap", "Job"}
    config_map, job = documents["ConfigMap"], documents["Job"]
    assert job["apiVersion"] == "batch/v1" and job["spec"]["parallelism"] == job["spec"]["completions"] > 1

    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["warmcache", "warmup"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["manifest"]["configMap"]["name"] == config_map["metadata"]["name"]
    (file_name,) = config_map["data"]
    assert command[2] == f"{mounts['manifest']}/{file_name}", "the command names the mounted manifest"
    assert {e["name"] for e in container["env"]} >= {"WARMCACHE_DB"}

    manifest = tmp_path / file_name
    manifest.write_text(config_map["data"][file_name])
    parsed = load_manifest(manifest)
    assert parsed.store.push and parsed.store.url.startswith("s3://"), "each pod publishes what it compiles"
    assert parsed.lease_seconds == 600
    assert [m.name for m in parsed.models] == ["qwen3-8b"]
