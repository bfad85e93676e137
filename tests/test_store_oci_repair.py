"""``store check --repair`` on ``oci://`` really repairs: after it, the next check is clean and a pull installs the
entries byte for byte.

Debian's docker-registry keeps the blob it holds under a digest whatever is uploaded again,
as content-addressed registries do: a layer damaged on the registry's disk stays damaged
under its digest, so the repair stores the rebuilt layer under another one.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import test_bundle
from test_bundle import Built, files_under
from test_store import run
from test_store_oci import image_of, push, registry_files
from warmcache_testkit.oci_registry import RunningRegistry

built = test_bundle.built


def test_repair_of_a_layer_damaged_in_the_registry_makes_the_next_check_clean_and_pulls_work(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    tag = ["--store", registry_host.url(f"team/fix-{uuid.uuid4().hex[:8]}", "prod")]
    push(built, tag)
    _, image = image_of(tag)
    layer = image.layers[0]
    stored = registry_files(registry_host, layer.digest)
    data = bytearray(stored.read_bytes())
    data[1024] ^= 0xFF  # a byte of the first file's content
    stored.write_bytes(bytes(data))

    code, report, err = run("store", "check", *tag)
    assert code == 5 and report is not None and [p["problem"] for p in report["problems"]] == ["damaged"], err
    code, repaired, err = run("store", "check", *tag, "--repair", "--cache-dir", str(built.root))
    assert code == 0 and repaired is not None and repaired["repaired"] == [f"blobs/{layer.digest}"], err
    code, clean, err = run("store", "check", *tag)
    assert code == 0 and clean is not None and clean["problems"] == [], err

    cache = tmp_path / "b"
    code, pulled, err = run(
        "pull", str(built.manifest), "--cache-dir", str(cache), "--db", f"sqlite:///{tmp_path / 'b.sqlite'}",
        "--allow-unsigned", *tag,
    )  # fmt: skip
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2, err
    expected = {k: v for k, v in files_under(built.root).items() if "unrelated" not in k}
    assert files_under(cache) == expected
