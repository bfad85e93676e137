"""Production proves what verify proved: an artifact built from other model code than this process runs is not loaded.

A precompiled artifact is the graph warmup traced from the model's code; the process that
loads it binds its own weights to that graph and never runs the model's Python forward.
verify proves each package's graph against the model it loads
(:mod:`warmcache.artifacts.aotinductor`), but a serving process that starts later, from
an image with newer modeling code (or a patch applied at import), would serve warmup's
computation silently. So warmup records in each artifact's header the digest of the model
code it traced (:func:`warmcache.identity.code_digest.model_code_digest`), and every load
(:func:`warmcache.artifacts.dispatch.install`: ``ShapeGuard.prime`` and verify's proof)
recomputes it for the model it binds and compares it with the header as the file is checked
(:func:`warmcache.artifacts.format.read_checked`), before the artifact's code is loaded: a
:class:`~warmcache.errors.CacheError` naming the file (under the guard's ``pad`` and
``refuse`` policies the start fails; under ``warn`` the bucket is traced from the model's
own code instead, which compiles).

An artifact without the digest (warmed by an earlier warmcache) is refused the same way:
nothing shows what code it was traced from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    def require(self, path: Path, recorded: str | None) -> None:
        """Refuse (:class:`CacheError`, one line naming ``path``) unless ``recorded``, the digest the artifact's header
        holds (:attr:`warmcache.artifacts.format.Header.model_code`), is this model's code digest.

        Called by :func:`warmcache.artifacts.format.read_checked` once the file's sha256 and
        header were checked, before any of its code is loaded: the file is read once, and an
        altered one is refused as altered (a :class:`~warmcache.errors.TrustError`) first.
        """
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
