"""What a push builds on and which version it writes: a signer signs only what it verified.

A push keeps the shapes its tag already holds and writes them again under a new version;
a signed push therefore puts its signature on whatever it builds on. Anyone with push
rights but no key can put an older signed push back under the tag, or an unsigned
``tag.json`` with any version; a signer that merged into that would publish the old
indexes (or the invented version) as new. So a signed push builds only on a tag whose
document verifies against the signer's trusted keys (its own public key and ``push
--trust``) for this very repository and tag, unexpired (unless it is the very manifest
this host remembers), and no older than the newest version this host pushed or pulled of
the tag (:class:`~.freshness.TagMemory`: pushers remember as pullers do). Anything else
is refused, naming ``push --fresh``: the tag built from the local registry alone, at a
version above both the remote's verified one and the memory's. An unsigned document's
version is never used (a signed 10**15+1 would lock every host out of later pushes).

Unsigned pushes are not checked (nothing signs them, and a puller with trusted keys
refuses them): they build on the tag as it is, one version past it.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmcache.errors import CacheError, TrustError
from warmcache.store.oci.freshness import TagVersion, check_tag, version_of
from warmcache.store.oci.image import StoredImage, read_image
from warmcache.store.oci.repository import OciRepository
from warmcache.trust import SigningKey, TrustedKeys

#: What a refused base tells the signer to do.
FRESH_ADVICE = (
    "a signed push builds only on a tag its keys verify (its own and --trust), no older than this host's last; "
    "nothing pushed: push --fresh publishes this registry's shapes alone"
)


@dataclass(frozen=True, slots=True)
class Basis:
    """What one push attempt builds on: ``base``, whose shapes and layers it keeps (``None``: nothing), ``found``, what
    the tag held (which the push replaces), and the ``version`` it writes."""

    base: StoredImage | None
    found: StoredImage | None
    version: int


def signer_keys(signing_key: SigningKey, trusted: TrustedKeys) -> TrustedKeys:
    """The keys whose tags a signed push may build on: its own, and those it was told to trust (a key rotation)."""
    keys = (signing_key.public, *(key for key in trusted.keys if key != signing_key.public))
    source = f"the signing key {signing_key.path}" + (f" and {trusted.source}" if trusted.configured else "")
    return TrustedKeys(keys, source)


def push_basis(store: OciRepository, signing_key: SigningKey | None, trusted: TrustedKeys, fresh: bool) -> Basis:
    """Read the tag and decide what a push builds on (see the module docstring); :class:`TrustError` (one line) for a
    tag a signed push may not build on."""
    found = _read_tag(store, fresh)
    if signing_key is None:
        unsigned = 0 if fresh or found is None else version_of(found.tag_document)
        return Basis(None if fresh else found, found, unsigned + 1)
    keys = signer_keys(signing_key, trusted)
    known = store.memory.known(store.url)
    floor = known.version if known is not None else 0
    if fresh:
        return Basis(None, found, max(_verified_version(store, found, keys), floor) + 1)
    if found is None:
        return Basis(None, None, floor + 1)
    # The very manifest this host verified or wrote last is current as far as it knows, even once expired.
    own = known is not None and known.digest == found.digest
    seen = check_tag(
        found.tag_document,
        found.indexes,
        store.reference,
        found.digest,
        keys,
        check_expiry=not own,
        advice=FRESH_ADVICE,
    )
    store.memory.refuse_older(store.url, seen, known, same_version_ok=True, advice=FRESH_ADVICE)
    store.memory.remember(store.url, seen)  # the floor rises with what this host verified, pushed or not
    return Basis(found, found, max(seen.version, floor) + 1)


def _read_tag(store: OciRepository, fresh: bool) -> StoredImage | None:
    """The tag's image; for a fresh push, ``None`` where it is not one warmcache can read (nothing of it is used)."""
    try:
        return read_image(store.client, store.reference.tag)
    except CacheError:
        if fresh:
            return None
        raise


def _verified_version(store: OciRepository, found: StoredImage | None, keys: TrustedKeys) -> int:
    """The version of the tag's document where it verifies for this tag (expired or not: a version a trusted key
    signed is one hosts may remember), else 0."""
    if found is None:
        return 0
    try:
        seen: TagVersion = check_tag(
            found.tag_document, found.indexes, store.reference, found.digest, keys, check_expiry=False
        )
    except TrustError:
        return 0
    return seen.version
