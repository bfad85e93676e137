"""A checkpoint's weights memory-mapped from its safetensors files, bound to a package by the names it records.

``safetensors.torch.load_file`` maps the file and returns views of the mapping (no read, no
copy: milliseconds for gigabytes); the pages come from the page cache as the packages touch
them, so every serving process of one model on a machine shares one copy of the weights.
A package names each constant as the exported step did (``model.`` + the model's own name)
and its header says which checkpoint names hold it (``checkpoint_names``: a tied
``lm_head.weight`` is saved once, under the embedding's name) and carries the values of the
non-persistent buffers no checkpoint holds (``buffers``, a rotary embedding's ``inv_freq``),
written at warmup by :func:`warmcache.artifacts.aoti_export.checkpoint_bindings`.

Imports neither transformers nor the model's code: only torch and safetensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.artifacts.format import decode_tensor
from warmcache.errors import CacheError, UsageError

if TYPE_CHECKING:
    import torch

#: The index of a checkpoint saved in several files (transformers' ``save_pretrained`` name).
SHARDED_INDEX = "model.safetensors.index.json"


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder: those its index names, or every ``*.safetensors`` in it."""
    index = folder / SHARDED_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{index}: unreadable checkpoint index ({exc})") from None
        return [folder / name for name in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UsageError(f"{folder}: no *.safetensors weights (a mounted start maps them; save with safetensors)")
    return files


@dataclass
class MappedCheckpoint:
    """Every tensor of a checkpoint, memory-mapped: ``{state_dict name: tensor}``."""

    folder: Path
    tensors: dict[str, torch.Tensor]
    #: Tensors converted to another dtype than the file's, by constant: a private copy (not shared between processes),
    #: made once for every package that binds it.
    converted: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def open(cls, folder: str | Path) -> MappedCheckpoint:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = Path(folder)
        tensors: dict[str, torch.Tensor] = {}
        for path in checkpoint_files(folder):
            try:
                tensors.update(load_file(path))
            except (OSError, SafetensorError) as exc:
                raise UsageError(f"{path}: not a readable safetensors file ({exc})") from None
        return cls(folder, tensors)

    def bind(self, package: Path, info: dict[str, Any], device: str) -> dict[str, torch.Tensor]:
        """``{fqn: tensor}`` for every constant a package header lists: mapped weights and its carried buffers.

        The shapes and dtypes are checked by the loader against the header; a weight the checkpoint holds in
        another dtype than the package's is converted once (a private copy, kept in :attr:`converted`: save the
        checkpoint in the served dtype to share it between processes).
        """
        import torch

        names = info.get("checkpoint_names")
        if names is None:
            raise CacheError(
                f"{package}: AOTInductor package records no checkpoint names (packaged by an earlier warmcache), so "
                "it cannot bind mapped weights; warm it again"
            )
        bound: dict[str, torch.Tensor] = {}
        for fqn, value in info.get("buffers", {}).items():
            bound[fqn] = decode_tensor(package, fqn, value, device)
        for fqn, (_, dtype) in info["constants"].items():
            if fqn in bound:
                continue
            found = next((self.tensors[n] for n in names.get(fqn, ()) if n in self.tensors), None)
            if found is None:
                raise UsageError(
                    f"{self.folder}: checkpoint holds none of {names.get(fqn) or [fqn]}, which package {package} "
                    "binds; is this the model the snapshot was warmed for?"
                )
            wanted = getattr(torch, dtype.removeprefix("torch."))
            if found.dtype != wanted and found.dtype.is_floating_point:
                found = self._converted(fqn, found, wanted)
            bound[fqn] = found.to(device)
        return bound

    def _converted(self, fqn: str, found: torch.Tensor, wanted: torch.dtype) -> torch.Tensor:
        converted = self.converted.get(fqn)
        if converted is None or converted.dtype != wanted:
            converted = self.converted[fqn] = found.to(wanted)
        return converted
