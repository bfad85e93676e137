"""The precompiled decode artifact's format, the one home its writer (``warmup``) and loader (``runtime``) import.

What it is on disk and the checks before anything in it runs; the decode call's signature both
sides compare (:func:`decode_signature`); and how an AOTInductor package names and carries
its constants (:func:`named_tensors`, :func:`encode_tensor`, :func:`decode_tensor`).

A precompiled artifact is one decode graph of one bucket, compiled ahead of time
with Dynamo's guards dropped (``torch.compile(...).aot_compile``) and saved with
``save_compiled_function``. Its payload is a pickle that carries code, so it is
never unpickled before two checks pass:

* its sha256 equals the one in its name, ``precompiled/<sha256>``: the registry
  row (and a bundle's row list) names the artifact by that path, so a file
  swapped or altered after warmup recorded it is refused;
* its header (plain JSON, read without unpickling) names the same model config,
  toolchain, batch, cache length, dtype and input signature as the row it is
  loaded for.

File layout: ``MAGIC`` line, one JSON header line, then the payload bytes.

An AOTInductor package's shared library is also written on its own, unpacked, as
``aotinductor-lib/<sha256 of the .so>``, and the package's header names that digest
(``"library"``): the header is covered by the package's sha256, which the signed row names,
so a start checks the library against it and ``dlopen``-s it where it lies (a read-only
mount included) instead of unpacking the package into a writable temporary folder
(:mod:`warmcache.artifacts.mapped_library`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.errors import CacheError, TrustError

if TYPE_CHECKING:
    from warmcache.artifacts.code_check import ModelCodeCheck
from warmcache.modeling.decode_inputs import state_parts

#: Folder under a cache root that holds precompiled artifacts (see ``layout``).
PRECOMPILED_DIR = "precompiled"
#: Folder of AOTInductor decode packages: the same file format, the payload a ``.pt2`` package (see
#: ``artifacts.aoti_loader``).
AOTINDUCTOR_DIR = "aotinductor"
#: Folder of AOTInductor packages' shared libraries, unpacked at warmup and named by their own sha256
#: (:func:`unpack_library`).
AOTINDUCTOR_LIBRARY_DIR = "aotinductor-lib"
#: The registry's kind of such a library, recorded on every row that records its package: a start maps it where it lies.
AOTINDUCTOR_LIBRARY = "aotinductor-library"
#: An artifact being written: ``.<sha256>.partial`` beside its final name (``cache scan`` lists leftovers, ``doctor
#: --fix`` removes them).
PARTIAL_SUFFIX = ".partial"
MAGIC = b"warmcache-precompiled-v1\n"
#: ``((name, shape, dtype), ...)`` of every input of a decode call, a scalar's type and value in its dtype place.
Signature = tuple[tuple[str, tuple[int, ...], str], ...]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """Everything a precompiled decode graph is valid for; all must match the row it serves."""

    config_hash: str
    toolchain_hash: str
    batch_size: int
    max_cache_len: int
    dtype: str
    backend: str
    mode: str
    #: ``[[name, shape, dtype], ...]`` of every tensor the decode call receives (:func:`decode_signature`).
    signature: Signature

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        values = dict(data)
        values["signature"] = tuple(
            (str(n), tuple(int(d) for d in shape), str(dt)) for n, shape, dt in data["signature"]
        )
        return cls(**values)


#: The :class:`Fingerprint` fields a registry row fixes, each named as the row's column (the signature comes from the
#: decode call).
ROW_FINGERPRINT = tuple(f.name for f in fields(Fingerprint) if f.name != "signature")


@dataclass(frozen=True, slots=True)
class Header:
    fingerprint: Fingerprint
    #: Dynamo names its module references ``___module_<name>_<id>_c<n>``; a fresh process binds them to these modules.
    module_globals: dict[str, str]
    #: An AOTInductor package's inputs, constants and CPU capability (``artifacts.aoti_export.package_decode``);
    #: ``None`` otherwise.
    aotinductor: dict[str, Any] | None = None
    #: The digest of the model code warmup traced (:mod:`warmcache.artifacts.code_check`); ``None`` before it was kept.
    model_code: str | None = None


def artifact_path(sha256: str, folder: str = PRECOMPILED_DIR) -> str:
    """The entry path (relative to the cache root) of the artifact with this content hash."""
    return f"{folder}/{sha256}"


def encode(header: Header, payload: bytes) -> bytes:
    return MAGIC + json.dumps(asdict(header), sort_keys=True).encode() + b"\n" + payload


def write_artifact(root: Path, header: Header, payload: bytes, folder: str = PRECOMPILED_DIR) -> str:
    """Write atomically under ``root``; returns the entry path (content-addressed, so rewriting is harmless).

    An AOTInductor package's library is written first (:func:`unpack_library`), and its header names it.
    """
    if folder == AOTINDUCTOR_DIR and header.aotinductor is not None:
        library = unpack_library(root, payload, header.aotinductor.get("device"))
        if library is not None:
            header = replace(header, aotinductor={**header.aotinductor, "library": library})
    data = encode(header, payload)
    path = artifact_path(hashlib.sha256(data).hexdigest(), folder)
    _write_atomically(root / path, data)
    return path


def write_call_artifact(
    root: Path,
    call: dict[str, Any],
    fingerprint_fields: dict[str, Any],
    payload: bytes,
    *,
    module_globals: dict[str, str] | None = None,
    aotinductor: dict[str, Any] | None = None,
    model_code: str | None = None,
    folder: str = PRECOMPILED_DIR,
) -> str:
    """:func:`write_artifact` under the header a row checks the file by: the fingerprint of the ``call`` it serves
    (its :func:`decode_signature`) with the row's ``fingerprint_fields``; returns the entry path."""
    fingerprint = Fingerprint(signature=decode_signature(call), **fingerprint_fields)
    header = Header(fingerprint, module_globals or {}, aotinductor, model_code)
    return write_artifact(root, header, payload, folder)


def _write_atomically(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{target.name}{PARTIAL_SUFFIX}"
    try:
        partial.write_bytes(data)
        partial.replace(target)
    except BaseException:  # a full disk must not leave a 1 MB half-file nobody removes
        partial.unlink(missing_ok=True)
        raise


#: Members of a ``.pt2`` archive that only describe it (``<archive>/<name>``): nothing a runner reads.
_ARCHIVE_RECORDS = frozenset(
    {"archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id"}
)
#: Files of the package's model folder that a runner does not read: the sources and the loader's metadata.
_UNREAD_SUFFIXES = (".cpp", "_metadata.json")


def unpack_library(root: Path, payload: bytes, device: object) -> str | None:
    """Write the package's ``.so`` under ``root`` as ``aotinductor-lib/<sha256>`` and return that sha256; ``None``
    (nothing written) when the ``.so`` alone cannot run it.

    Only a CPU package whose model folder holds one ``.so`` and nothing else a runner reads
    (no weights, no kernel binaries, no proxy-executor ``.json``, which the runner looks up by
    the ``.so``'s own file name) is loaded from its library alone; every other package loads
    through the package loader as before.
    """
    if device != "cpu":
        return None
    try:
        archive = zipfile.ZipFile(io.BytesIO(payload))
        names = archive.namelist()
    except (zipfile.BadZipFile, ValueError):
        return None
    libraries = [n for n in names if n.endswith(".so") and "/data/aotinductor/" in n]
    described = [n for n in names if n.split("/", 1)[-1] in _ARCHIVE_RECORDS or n.endswith(_UNREAD_SUFFIXES)]
    if len(libraries) != 1 or len(libraries) + len(described) != len(names):
        return None
    data = archive.read(libraries[0])
    digest = hashlib.sha256(data).hexdigest()
    _write_atomically(root / library_path(digest), data)
    return digest


def library_path(sha256: str) -> str:
    """The entry path (relative to the cache root) of the unpacked library with this content hash."""
    return artifact_path(sha256, AOTINDUCTOR_LIBRARY_DIR)


def library_of(root: Path, entry: str) -> str | None:
    """The entry of the library a package written under ``root`` names (its header alone is read), or ``None``: for
    warmup, which records the library on every row that records the package."""
    with (root / entry).open("rb") as file:
        if file.read(len(MAGIC)) != MAGIC:
            return None
        raw = json.loads(file.readline())
    library = (raw.get("aotinductor") or {}).get("library")
    return library_path(library) if isinstance(library, str) else None


def read_checked(
    root: Path, entry: str, expected: dict[str, Any], code: ModelCodeCheck | None = None
) -> tuple[Header, bytes]:
    """Header and payload of ``entry``, after its sha256, fingerprint and model code were checked; nothing is
    unpickled.

    ``expected`` holds the fingerprint fields the row fixes (all but ``signature``,
    which the dispatcher checks on every call); ``code``, when given, the digest of the
    code of the model the file will be bound to (:mod:`warmcache.artifacts.code_check`).

    Raises :class:`CacheError` (one line naming the file) on a missing or foreign artifact,
    :class:`TrustError` on one whose bytes differ from its recorded sha256.
    """
    path = root / entry
    name = Path(entry).name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CacheError(f"{path}: precompiled artifact unreadable ({exc.strerror or exc})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != name:  # altered since it was recorded: refused under every guard policy, like a forged row
        raise TrustError(
            f"{path}: precompiled artifact sha256 {digest[:16]}… differs from its registry record "
            f"{name[:16]}…; refusing to load it"
        )
    if not data.startswith(MAGIC):
        raise CacheError(f"{path}: not a warmcache precompiled artifact")
    end = data.find(b"\n", len(MAGIC))
    try:
        raw = json.loads(data[len(MAGIC) : end])
        header = Header(
            Fingerprint.from_json(raw["fingerprint"]),
            {str(k): str(v) for k, v in raw["module_globals"].items()},
            raw.get("aotinductor"),
            raw.get("model_code"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CacheError(f"{path}: precompiled artifact header unreadable ({exc})") from None
    differing = {f: v for f, v in expected.items() if getattr(header.fingerprint, f) != v}
    if differing:
        shown = ", ".join(f"{f}={getattr(header.fingerprint, f)!r} (row: {v!r})" for f, v in differing.items())
        raise CacheError(
            f"{path}: precompiled artifact was compiled for another {'/'.join(differing)}: {shown}; refusing to load it"
        )
    if code is not None:
        code.require(path, header.model_code)
    return header, data[end + 1 :]


def decode_signature(kwargs: dict[str, Any]) -> Signature:
    """What a compiled decode graph is specialised on: each tensor's shape and dtype, each scalar's value.

    Covers the arguments generate() passes (``input_ids``, ``position_ids``, the
    mask dict, the cache's per-layer key/value tensors and recurrent states, ``logits_to_keep``, ...),
    so batch, cache length, dtype and number of layers all take part.
    """
    entries: list[tuple[str, tuple[int, ...], str]] = []

    def add(name: str, value: Any) -> None:
        shape = getattr(value, "shape", None)
        if shape is not None and hasattr(value, "dtype"):
            entries.append((name, tuple(int(d) for d in shape), str(value.dtype)))
        elif isinstance(value, dict):
            for key in sorted(value):
                add(f"{name}.{key}", value[key])
        elif hasattr(value, "layers"):
            for i, layer in enumerate(value.layers):
                add(f"{name}.layers[{i}].keys", getattr(layer, "keys", None))
                add(f"{name}.layers[{i}].values", getattr(layer, "values", None))
                for part, tensor in state_parts(layer):
                    add(f"{name}.layers[{i}].{part}", tensor)
        else:
            entries.append((name, (), f"{type(value).__name__}:{value!r}"))

    for key in sorted(kwargs):
        add(key, kwargs[key])
    return tuple(entries)


def named_tensors(module: Any, prefix: str = "") -> dict[str, Any]:
    """Every parameter and buffer under every name it has, as a package's constant list names them.

    Not ``state_dict()``: it leaves non-persistent buffers out (a rotary embedding's
    ``inv_freq`` at real configs), and a package lists whichever of a tied weight's
    names the export met first.
    """
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    return {prefix + name: tensor.detach() for name, tensor in tensors.items()}


def encode_tensor(tensor: Any) -> list[Any]:
    """``[shape, dtype, base64 of its bytes]``: a small tensor as a JSON header holds it, exactly (bfloat16 too)."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return [list(tensor.shape), str(tensor.dtype), base64.b64encode(flat.view(torch.uint8).numpy().tobytes()).decode()]


def decode_tensor(path: Path, fqn: str, value: Any, device: str) -> Any:
    """The tensor :func:`encode_tensor` wrote, on ``device``; a malformed one is a line naming package and constant."""
    import torch

    try:
        shape, dtype_name, data = value
        dtype = getattr(torch, str(dtype_name).removeprefix("torch."))
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"not a dtype: {dtype_name}")
        raw = bytearray(base64.b64decode(data, validate=True))
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape([int(d) for d in shape]).to(device)
    except (ValueError, TypeError, AttributeError, RuntimeError) as exc:
        raise CacheError(
            f"{path}: AOTInductor package's computed constant {fqn} is malformed ({exc}); refusing to load it"
        ) from None
