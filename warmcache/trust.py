"""Signatures on what warmcache ships: Ed25519 over canonical JSON, checked against trusted keys.

A compile cache from elsewhere is code production will run (compiled C++, pickled
graphs). The sha256 list in a bundle or a store index catches corruption, not
tampering: whoever can replace a ``.so`` can rewrite its listed hash. A signature
by a key the operator trusts closes that gap, so anything that carries a file list
(a bundle's metadata, an artifact store's index) is signed as a whole JSON
document: :func:`sign_document` adds a ``signature`` member over the canonical
bytes of everything else, :meth:`TrustedKeys.check_document` verifies it. Nothing
here knows what the document describes.

Keys are written as ``ed25519:<base64 of the 32-byte public key>``; a trust list
entry is such a string or the path of a ``.pub`` file holding one. The private key
is a PKCS#8 PEM file readable by its owner only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from warmcache.anchor import Anchor
from warmcache.errors import TrustError, UsageError, shown
from warmcache.jsonable import fields_json
from warmcache.settings_table import ALLOW_UNSIGNED, TRUSTED_KEYS, choose, switch

KEY_PREFIX = "ed25519:"
SIGNATURE_MEMBER = "signature"
TRUSTED_KEYS_ENV = TRUSTED_KEYS.env
#: A key file is one line; a larger file is not a key (and is not read whole).
_MAX_KEY_FILE_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class PublicKey:
    """An Ed25519 public key; ``key_id`` (16 hex digits of its sha256) names it in messages."""

    raw: bytes

    @property
    def text(self) -> str:
        return KEY_PREFIX + base64.b64encode(self.raw).decode()

    @property
    def key_id(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()[:16]

    @classmethod
    def parse(cls, text: str, where: str) -> PublicKey:
        """Parse ``ed25519:<base64>``; :class:`UsageError` naming ``where`` otherwise."""
        body = text.strip()
        if not body.startswith(KEY_PREFIX):
            raise UsageError(f"{where}: {shown(text)} is not a public key (expected {KEY_PREFIX}<base64>)")
        try:
            raw = base64.b64decode(body[len(KEY_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise UsageError(f"{where}: {shown(text)} is not a 32-byte Ed25519 public key in base64")
        return cls(raw)


class SigningKey:
    """A private Ed25519 key loaded from its file."""

    def __init__(self, private: Ed25519PrivateKey, path: Path) -> None:
        self._private = private
        self.path = path
        self.public = PublicKey(private.public_key().public_bytes_raw())

    @classmethod
    def load(cls, path: str | Path) -> SigningKey:
        # The key-file formats (PEM, PKCS#8, OpenSSH: about 25 ms to import) are the signing side's alone: a serving
        # process checks signatures with raw public keys and never imports them.
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        file = Path(path)
        try:
            data = _read_small(file)
            if data.lstrip().startswith(KEY_PREFIX.encode()):
                raise UsageError(
                    f"{file}: this is a public key; signing takes the private key it was made with "
                    f"({file.with_suffix('') if file.suffix == '.pub' else 'the file without .pub'})"
                )
            refuse_readable_by_others(file, "private key")
            private = load_pem_private_key(data, password=None)
        except OSError as exc:
            raise UsageError(f"{file}: cannot read signing key: {exc.strerror or exc}") from None
        except (ValueError, TypeError):
            raise UsageError(
                f"{file}: not an unencrypted PEM private key (make one with: warmcache keys generate)"
            ) from None
        if not isinstance(private, Ed25519PrivateKey):
            raise UsageError(f"{file}: a {type(private).__name__}, not an Ed25519 key; refused")
        return cls(private, file)

    def sign(self, payload: bytes) -> dict[str, str]:
        """A detached signature of ``payload``: which key, and the signature in base64."""
        return {"key": self.public.text, "ed25519": base64.b64encode(self._private.sign(payload)).decode()}


def generate_key(path: str | Path) -> PublicKey:
    """Write a new private key to ``path`` (mode 0600, never over an existing file) and its public key to
    ``path.pub``."""
    file = Path(path)
    public_file = file.with_name(file.name + ".pub")
    private = Ed25519PrivateKey.generate()
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat  # as in load

    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    public = SigningKey(private, file).public
    for existing in (file, public_file):
        if os.path.lexists(existing):
            raise UsageError(f"{existing}: already exists; refusing to overwrite a key")
    try:
        _write_new(file, pem, 0o600)
        _write_new(public_file, (public.text + "\n").encode(), 0o644)
    except OSError as exc:
        raise UsageError(f"{exc.filename or file}: cannot write key: {exc.strerror or exc}") from None
    return public


def canonical_bytes(document: Any) -> bytes:
    """The one byte form of a JSON value that is signed: sorted keys, no spaces, UTF-8.

    Refuses what JSON cannot round-trip (NaN, non-string keys) rather than signing
    bytes a reader would never reproduce.
    """
    try:
        return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
            "utf-8"
        )
    except (TypeError, ValueError) as exc:
        raise TrustError(f"cannot sign or check a document that is not plain JSON ({exc})") from None


def sign_document(document: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    """``document`` with a ``signature`` member over the canonical bytes of all its other members."""
    unsigned = {name: value for name, value in document.items() if name != SIGNATURE_MEMBER}
    plain = json.loads(canonical_bytes(unsigned))  # what a reader will parse: tuples are lists, keys strings
    return {**plain, SIGNATURE_MEMBER: key.sign(canonical_bytes(plain))}


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """What :meth:`TrustedKeys.check_document` found: verified by ``key_id``, or not checked."""

    checked: bool
    key_id: str | None

    def describe(self) -> str:
        if self.checked:
            return f"signature verified (key {self.key_id})"
        signed = f"signed by key {self.key_id}, " if self.key_id else "unsigned, "
        return (
            f"{signed}signature not checked: no trusted keys configured (--trust, ${TRUSTED_KEYS_ENV} "
            "or the manifest's [trust] keys)"
        )

    def as_json(self) -> dict[str, Any]:
        return fields_json(self, {"key_id": "key"})


@dataclass(frozen=True, slots=True)
class TrustedKeys:
    """The public keys whose signatures are accepted; empty means trust is not configured."""

    keys: tuple[PublicKey, ...] = ()
    source: str = ""

    @property
    def configured(self) -> bool:
        return bool(self.keys)

    @classmethod
    def load(cls, entries: Iterable[str], source: str, base: Path | None = None) -> TrustedKeys:
        """Keys from ``entries``, each ``ed25519:...`` or a public key file (relative to ``base``)."""
        return cls(tuple(load_public_key(entry, source, base) for entry in entries), source)

    @classmethod
    def resolve(cls, flag_values: Sequence[str], fallback: TrustedKeys | None = None) -> TrustedKeys:
        """``--trust`` values, else ``$WARMCACHE_TRUSTED_KEYS`` (comma-separated), else ``fallback``
        (a manifest's ``[trust] keys``).

        A variable that is set but empty is an error: it would silently turn checking off.
        """
        if flag_values:
            return cls.load(flag_values, TRUSTED_KEYS.sources()[0])
        from_env = choose(TRUSTED_KEYS, None)
        if from_env is not None:
            entries = [e for e in from_env.text.split(",") if e.strip()]
            if not entries:
                raise UsageError(
                    f"{from_env.source} is set but empty; unset it or list keys ({KEY_PREFIX}... or .pub "
                    "files, comma-separated)"
                )
            return cls.load(entries, from_env.source)
        return fallback or cls()

    def check_document(self, document: dict[str, Any], what: str) -> SignatureCheck:
        """Verify ``document``'s signature when trust is configured; :class:`TrustError` if it fails.

        With trust configured an unsigned document, a malformed signature, a key not
        in the list and a signature that does not match the content are all refused.
        """
        signature = document.get(SIGNATURE_MEMBER)
        if not self.configured:
            return SignatureCheck(False, _signer_id(signature))
        trusted = ", ".join(k.key_id for k in self.keys)
        if signature is None:
            raise TrustError(f"{what}: unsigned, but trusted keys are configured ({self.source}: {trusted}); refused")
        if (
            not isinstance(signature, dict)
            or not isinstance(signature.get("key"), str)
            or not isinstance(signature.get("ed25519"), str)
        ):
            raise TrustError(f"{what}: malformed signature {shown(signature)}; refused")
        try:
            signer = PublicKey.parse(signature["key"], f"{what}: signature key")
            raw_signature = base64.b64decode(signature["ed25519"], validate=True)
        except (UsageError, binascii.Error, ValueError):
            raise TrustError(f"{what}: malformed signature {shown(signature)}; refused") from None
        if signer not in self.keys:
            raise TrustError(
                f"{what}: signed by key {signer.key_id}, which is not trusted ({self.source}: {trusted}); refused"
            )
        payload = canonical_bytes({name: value for name, value in document.items() if name != SIGNATURE_MEMBER})
        try:
            Ed25519PublicKey.from_public_bytes(signer.raw).verify(raw_signature, payload)
        except InvalidSignature:
            raise TrustError(
                f"{what}: the signature of key {signer.key_id} does not match the content: altered after "
                "signing; refused"
            ) from None
        return SignatureCheck(True, signer.key_id)


#: No trusted keys: signatures are not checked (readers that only need a document's structure: gc, store check).
NOT_CONFIGURED = TrustedKeys()
ALLOW_UNSIGNED_ENV = ALLOW_UNSIGNED.env


def unsigned_allowed_by_environment() -> bool:
    """``$WARMCACHE_ALLOW_UNSIGNED`` set to a true value (the one reading,
    :func:`~warmcache.settings_table.parse_switch`), as ``--allow-unsigned`` reads it: what a library caller (a guard)
    honours too. A value that is neither true nor false is refused, naming the variable."""
    return switch(ALLOW_UNSIGNED)


def require_trust(trusted: TrustedKeys, allow_unsigned: bool, what: str) -> None:
    """Refuse to install ``what`` (a compile cache: code) unless its signature will be checked or the caller opted out.

    Without trusted keys no signature can be checked (anyone can sign), so installing
    is refused by default, whether the source is signed or not.
    """
    if not trusted.configured and not allow_unsigned:
        raise TrustError(
            f"{what}: no trusted keys configured, so nothing proves who built this compile cache, and "
            "a compile cache is code; refused: "
            f"pass --trust KEY.pub (or set ${TRUSTED_KEYS_ENV}, or the manifest's [trust] keys), or "
            "--allow-unsigned to install it unverified"
        )


def load_public_key(entry: str, source: str, base: Path | None = None) -> PublicKey:
    """One trust list entry: an inline ``ed25519:...`` key or the path of a ``.pub`` file."""
    if entry.strip().startswith(KEY_PREFIX):
        return PublicKey.parse(entry, source)
    _refuse_key_text(entry, source)
    file = Anchor(base).path(entry.strip()) if base is not None else Path(os.path.expanduser(entry.strip()))
    try:
        text = _read_small(file).decode("utf-8")
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{source}: cannot read public key file {shown(str(file))}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    # Never quote the file: it may be the private key (or any secret) passed by mistake, and errors land in CI logs.
    if "PRIVATE KEY" in text:
        raise UsageError(f"{source}: {shown(str(file))} holds a private key; pass the .pub file")
    try:
        return PublicKey.parse(text, f"{source}: {file}")
    except UsageError:
        raise UsageError(
            f"{source}: {shown(str(file))} is not a public key file (expected one line "
            f"{KEY_PREFIX}<base64>, as warmcache keys generate writes)"
        ) from None


def _refuse_key_text(entry: str, source: str) -> None:
    """Refuse, without quoting it, an entry that is key material rather than a key or a file name
    (``--trust "$(cat key)"``): errors land in CI logs."""
    if "PRIVATE KEY" in entry:
        raise UsageError(
            f"{source}: a private key was given where a public key belongs; pass the .pub file or its "
            f"{KEY_PREFIX}... line"
        )
    if "-----BEGIN" in entry or "\n" in entry.strip():
        raise UsageError(
            f"{source}: a block of text ({len(entry)} characters, not shown) was given where a public "
            f"key belongs; pass a .pub file or its {KEY_PREFIX}... line"
        )


def _signer_id(signature: Any) -> str | None:
    """The key id an unchecked signature claims, for the "not checked" message."""
    try:
        return PublicKey.parse(signature["key"], "signature").key_id
    except (TypeError, KeyError, AttributeError, UsageError):
        return None


def _write_new(file: Path, data: bytes, mode: int) -> None:
    """Create ``file`` (never over an existing one, never through a link) with exactly ``mode``, whatever the umask."""
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), mode)
        out.write(data)


def refuse_readable_by_others(file: Path, what: str) -> None:
    """A secret file (a signing key, a bearer token) that group or others can read is refused, as ssh refuses such a
    key: anyone on the host could sign or write as you."""
    mode = os.stat(file).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(
            f"{file}: {what} is readable by others (mode {stat.S_IMODE(mode):o}); refused: run chmod 600 {file}"
        )


def _read_small(file: Path) -> bytes:
    with open(file, "rb") as handle:
        data = handle.read(_MAX_KEY_FILE_BYTES + 1)
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise ValueError(f"larger than {_MAX_KEY_FILE_BYTES} bytes, not a key file")
    return data
