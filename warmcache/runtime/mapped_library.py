"""An AOTInductor package's unpacked ``.so``, opened so that every byte ``dlopen`` maps is a byte that was checked.

A package's header names the sha256 of its library (``aotinductor-lib/<sha256>``,
:func:`warmcache.cache.artifact_format.unpack_library`), and the package's own sha256, which the
signed row names, covers that header. Loading the library where it lies, instead of
unpacking the package into a writable temporary folder, is only as safe as the
gap between the check and the load:

* the file is opened once; its bytes are hashed through that descriptor and
  ``dlopen`` maps the same descriptor's file (``/proc/self/fd/N``), so renaming
  another file into its place (a writable folder) changes nothing;
* what is left is a write into the file itself, so the library is used only where
  nobody else can write it: a read-only mount (an image volume, ``--read-only``), or
  a file owned by this user or root with no group, other or ACL write permission.

Elsewhere (a file others may write, no ``/proc``) it is not used, and the package loads as
before, through a private temporary folder; a library whose bytes differ from the
digest is refused, under every guard policy, before anything in it runs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from warmcache.cache.artifact_format import library_path
from warmcache.errors import CacheError, TrustError

log = logging.getLogger(__name__)

_HEX = frozenset("0123456789abcdef")
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_ACL = "system.posix_acl_access"


@contextmanager
def checked_library(root: Path, sha256: str, package: Path) -> Iterator[str | None]:
    """Inside the block, a path ``dlopen`` maps the checked library by (valid until the block ends; a loaded library
    stays mapped after it), or ``None`` when it cannot be loaded where it lies (absent, or writable by others).

    Raises :class:`TrustError` (one line naming both files) when its bytes are not the ones ``package`` names.
    """
    if len(sha256) != 64 or not set(sha256) <= _HEX:
        raise CacheError(f"{package}: AOTInductor package names library {sha256[:80]!r}, not a sha256")
    path = root / library_path(sha256)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        log.debug("%s: no unpacked library %s; the package is unpacked instead", package, path)
        yield None
        return
    except OSError as exc:
        raise CacheError(f"{path}: AOTInductor library unreadable ({exc.strerror or exc})") from None
    try:
        mapped = f"/proc/self/fd/{fd}"
        why_not = _why_changeable(fd) or (None if os.path.exists(mapped) else "no /proc/self/fd")
        if why_not:
            log.debug("%s: not loaded where it lies (%s); the package is unpacked instead", path, why_not)
            yield None
            return
        with open(fd, "rb", closefd=False) as file:
            digest = hashlib.file_digest(file, "sha256").hexdigest()
        if digest != sha256:
            raise TrustError(
                f"{path}: AOTInductor library sha256 {digest[:16]}… differs from the {sha256[:16]}… its package "
                f"{package.name[:16]}… names; refusing to load it"
            )
        yield mapped
    finally:
        os.close(fd)


def _why_changeable(fd: int) -> str | None:
    """Why the open file's bytes could change between the check and ``dlopen`` (``None``: they cannot)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
        return None
    if info.st_uid not in (0, os.geteuid()):
        return f"owned by uid {info.st_uid}"
    if info.st_mode & _OTHERS_WRITE:
        return f"mode {stat.filemode(info.st_mode)}"
    try:
        acl = _ACL in os.listxattr(fd)
    except OSError:  # a file system without extended attributes has no ACL either
        acl = False
    return "an ACL may grant others write access" if acl else None
