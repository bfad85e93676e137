"""Alter one cache file inside a warmcache tag, as someone who can push to the registry but holds no signing key.

The container pipeline's third refusal (``tools/ci/container_pipeline.sh``): every digest of
the altered tag is consistent (layer, config ``diff_ids``, manifest), so a container
runtime pulls and mounts it without complaint, and only warmcache's signed index stands
between the altered bytes and ``dlopen``. The layout is what ``skopeo copy docker://… oci:LAYOUT:TAG``
writes; the altered layer is written back uncompressed, which any registry accepts.

    python tools/ci/oci_tamper.py LAYOUT TAG aotinductor/    # flips one byte of the first file under that folder
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
REF_NAME = "org.opencontainers.image.ref.name"


def tamper(layout: Path, tag: str, folder: str) -> str:
    """Flip the last byte of the first regular file under ``folder`` in ``tag``'s layers; returns its path."""
    index = _read_json(layout / "index.json")
    (entry,) = [m for m in index["manifests"] if m.get("annotations", {}).get(REF_NAME) == tag]
    manifest = _read_json(_blob(layout, entry["digest"]))
    config = _read_json(_blob(layout, manifest["config"]["digest"]))
    for number, layer in enumerate(manifest["layers"]):
        data = _blob(layout, layer["digest"]).read_bytes()
        altered, name = _alter_first_file(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data, folder)
        if name is None:
            continue
        digest = _write_blob(layout, altered)
        layer.update(mediaType=LAYER_TAR, digest=digest, size=len(altered))
        config["rootfs"]["diff_ids"][number] = digest
        config_bytes = json.dumps(config).encode()
        manifest["config"].update(digest=_write_blob(layout, config_bytes), size=len(config_bytes))
        manifest_bytes = json.dumps(manifest).encode()
        entry.update(digest=_write_blob(layout, manifest_bytes), size=len(manifest_bytes))
        (layout / "index.json").write_text(json.dumps(index))
        return name
    raise SystemExit(f"oci_tamper: no file under {folder!r} in any layer of {layout}:{tag}")


def _alter_first_file(tar_bytes: bytes, folder: str) -> tuple[bytes, str | None]:
    """The tar with the first regular file under ``folder`` altered (same size, last byte flipped), and its name."""
    out = io.BytesIO()
    altered: str | None = None
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as source, tarfile.open(fileobj=out, mode="w") as target:
        for member in source.getmembers():
            content = source.extractfile(member) if member.isreg() else None
            data = content.read() if content is not None else None
            if altered is None and data and f"/{folder}" in f"/{member.name.removeprefix('./')}":
                data, altered = data[:-1] + bytes([data[-1] ^ 0xFF]), member.name
            target.addfile(member, io.BytesIO(data) if data is not None else None)
    return out.getvalue(), altered


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _write_blob(layout: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _blob(layout, digest).write_bytes(data)
    return digest


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("layout", type=Path, help="an OCI layout folder (skopeo copy ... oci:LAYOUT:TAG)")
    parser.add_argument("tag")
    parser.add_argument("folder", help="the cache folder whose first file is altered, e.g. aotinductor/")
    args = parser.parse_args()
    print(f"altered {tamper(args.layout, args.tag, args.folder)} in {args.layout}:{args.tag}", file=sys.stderr)


if __name__ == "__main__":
    main()
