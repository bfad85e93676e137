"""Which step of generation an AOTInductor package computes, as its header says.

A bucket's packages are its decode step (generate()'s one-token call, one package per batch
size) and, since prefills are packaged too, its prompt (one per batch size and prompt length):
a process that serves from packages alone (:mod:`warmcache.runtime.mounted`) runs both, one
that runs generate() loads the decode package only. A header without a ``step`` is a decode
package: every package warmed before prefills were packaged.
"""

from __future__ import annotations

from typing import Any

DECODE_STEP = "decode"
PREFILL_STEP = "prefill"


def package_step(aotinductor: dict[str, Any]) -> str:
    """The step an AOTInductor package header names (:data:`DECODE_STEP` when it predates the field)."""
    return str(aotinductor.get("step", DECODE_STEP))
