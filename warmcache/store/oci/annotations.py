"""What ``skopeo inspect`` and registry UIs show of a pushed tag: its layout, models, toolchains and shapes, as the
manifest's annotations and the config's labels (a summary bounded in length, not the full shape list)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from warmcache.cache.layout import CacheFlavor

ANNOTATION_PREFIX = "dev.warmcache."
#: An annotation is shown by ``skopeo inspect`` and registry UIs: a summary, not the full shape list.
MAX_ANNOTATION_CHARS = 2000


def summary(flavor: CacheFlavor, indexes: dict[str, dict[str, Any]]) -> dict[str, str]:
    """What ``skopeo inspect`` and registry UIs show of the tag: layout, models, toolchains and shapes (as
    annotations and labels)."""
    rows = [document["row"] for _, document in sorted(indexes.items())]
    toolchains = {row["toolchain_hash"]: row["toolchain"] for row in rows}
    families: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        family = f"{row['model_name']}/{row['workload']} {row['dtype']}" + (
            f" max_cache_len={row['max_cache_len']}" if row.get("max_cache_len") else ""
        )
        families[family].append(f"{row['batch_size']}x{row['seq_len']}")
    return {
        f"{ANNOTATION_PREFIX}flavor": flavor,
        f"{ANNOTATION_PREFIX}models": ",".join(sorted({row["model_name"] for row in rows})),
        f"{ANNOTATION_PREFIX}toolchains": _bounded(
            "; ".join(f"{h[:16]} {_describe_toolchain(t)}" for h, t in sorted(toolchains.items()))
        ),
        f"{ANNOTATION_PREFIX}shapes": _bounded(
            "; ".join(f"{family}: batch x seq {' '.join(sorted(pairs))}" for family, pairs in sorted(families.items()))
        ),
        f"{ANNOTATION_PREFIX}shape-count": str(len(rows)),
    }


def _describe_toolchain(toolchain: dict[str, Any]) -> str:
    packages = " ".join(
        f"{name}={version}" for name, version in sorted((toolchain.get("packages") or {}).items()) if version
    )
    return (
        f"{toolchain.get('device')}/{toolchain.get('backend')}/{toolchain.get('mode')} on "
        f"{toolchain.get('platform')} ({packages})"
    )


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ANNOTATION_CHARS else text[: MAX_ANNOTATION_CHARS - 1] + "…"
