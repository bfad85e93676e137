"""Production proves what verify proved: an artifact built from other model code than this process runs is not loaded.

A precompiled artifact is the graph warmup traced from the model's code; the process that
loads it binds its own weights to that graph and never runs the model's Python forward.
verify proves each package's graph against the model it loads
(:mod:`warmcache.artifacts.aotinductor`), but a serving process that starts later, from
an image with newer modeling code (or a patch applied at import), would serve warmup's
computation silently. So warmup records in each artifact's header the digest of the model
code it traced (:func:`warmcache.identity.code_digest.model_code_digest`), and every load
(:func:`warmcache.artifacts.dispatch.install`: ``ShapeGuard.prime`` and verify's proof)
recomputes it for the model it binds, before the artifact's code is loaded: a
:class:`~warmcache.errors.CacheError` naming the file (under the guard's ``pad`` and
``refuse`` policies the start fails; under ``warn`` the bucket is traced from the model's
own code instead, which compiles).

An artifact without the digest (warmed by an earlier warmcache) is refused the same way:
nothing shows what code it was traced from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmcache.artifacts.format import MAGIC
from warmcache.errors import CacheError
from warmcache.identity.code_digest import model_code_digest

#: The header key warmup records the digest under.
HEADER_KEY = "model_code"
#: What a refusal tells the operator to do: verify fails the changed rows, so warmup builds them again.
_REMEDY = (
    "run warmcache verify with this code (it fails the changed rows), then warmup --retry-failed and verify again "
    "to build and prove them from the code this process runs"
)


@dataclass
class ModelCodeCheck:
    """The check for one model: its digest computed once, on the first artifact that needs it."""

    model: Any
    _digest: str | None = field(default=None, init=False)

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = model_code_digest(self.model)
        return self._digest

    def require(self, path: Path) -> None:
        """Refuse (:class:`CacheError`, one line naming ``path``) unless the artifact at ``path`` recorded this
        model's code digest; a file that cannot be read is left to the load, which says why."""
        recorded = recorded_model_code(path)
        if recorded is _UNREADABLE:
            return
        if recorded is None:
            raise CacheError(
                f"{path}: precompiled artifact records no model-code digest (built by an earlier warmcache), so "
                f"nothing shows it was built from the code this process runs; refusing to load it: {_REMEDY}"
            )
        if recorded != self.digest:
            raise CacheError(
                f"{path}: precompiled artifact was built from other model code than this process runs (code digest "
                f"{str(recorded)[:12]}… at warmup, {self.digest[:12]}… now): the model's code changed since warmup and "
                f"verify (a newer image, a patched or monkeypatched layer); refusing to load it: {_REMEDY}"
            )


_UNREADABLE = object()


def recorded_model_code(path: Path) -> Any:
    """The digest the header of the artifact at ``path`` recorded (``None``: none); :data:`_UNREADABLE` for a file
    that is missing, not an artifact, or whose bytes are not the sha256 its name says (the load refuses it as
    altered: a :class:`~warmcache.errors.TrustError`, which no policy falls back from)."""
    try:
        data = path.read_bytes()
    except OSError:
        return _UNREADABLE
    if hashlib.sha256(data).hexdigest() != path.name or not data.startswith(MAGIC):
        return _UNREADABLE
    try:
        header = json.loads(data[len(MAGIC) : data.find(b"\n", len(MAGIC))])
    except ValueError:
        return _UNREADABLE
    return header.get(HEADER_KEY) if isinstance(header, dict) else _UNREADABLE
