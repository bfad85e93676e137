"""An AOTInductor package's unpacked ``.so``, opened so that every byte ``dlopen`` maps is a byte that was checked.

A package's header names the sha256 of its library (``aotinductor-lib/<sha256>``,
:func:`warmcache.artifacts.format.unpack_library`), and the package's own sha256, which the
signed row names, covers that header. Loading the library where it lies, instead of
unpacking the package into a writable temporary folder, is only as safe as the
gap between the check and the load:

* the folder is opened once and the library through it; its bytes are hashed through
  that descriptor, and ``dlopen`` is given ``/proc/self/fd/<folder>/<sha256>``, resolved in
  the same folder whatever is renamed above it. The name holds the digest because
  ``dlopen`` knows a loaded library by the name it was given: a bare descriptor number,
  reused once closed, handed a later package the first one's library (measured: the
  batch-4 package ran the batch-1 code);
* what is left is a change of the folder's entry or a write into the file, so the library
  is used only where nobody else can make either: a read-only mount (an image volume,
  ``--read-only``), or a folder and file owned by this user or root with no group, other
  or ACL write permission.

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

from warmcache.artifacts.format import library_path
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
    folder = _open(path.parent, os.O_DIRECTORY)
    fd = None if folder is None else _open(path, os.O_NOFOLLOW, folder)
    try:
        # By the folder's descriptor and the library's own name: dlopen knows a loaded library by the name it was
        # given, so a descriptor's number alone, reused after close, would hand back another library.
        mapped = f"/proc/self/fd/{folder}/{sha256}"
        if folder is None or fd is None:
            why_not: str | None = "absent"
        else:
            why_not = _why_changeable(folder) or _why_changeable(fd) or (None if os.path.exists(mapped) else "no /proc")
        if why_not or fd is None:
            log.debug("%s: not loaded where it lies (%s); the package is unpacked instead", path, why_not)
            yield None
            return
        with open(fd, "rb", closefd=False) as file:
            digest = hashlib.file_digest(file, "sha256").hexdigest()
        if digest != sha256:
            raise TrustError(
                f"{path}: AOTInductor library sha256 {digest[:16]}… differs from the {sha256[:16]}… its "
                f"package {package.name[:16]}… names; refusing to load it"
            )
        yield mapped
    finally:
        for opened in (fd, folder):
            if opened is not None:
                os.close(opened)


def _open(path: Path, flags: int, folder: int | None = None) -> int | None:
    """A read-only descriptor of ``path`` (by its name in ``folder`` when given), ``None`` when it is absent."""
    try:
        if folder is None:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
        return os.open(path.name, os.O_RDONLY | os.O_CLOEXEC | flags, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CacheError(f"{path}: AOTInductor library unreadable ({exc.strerror or exc})") from None


def _why_changeable(fd: int) -> str | None:
    """Why the open file's bytes (a folder's entries) could change between the check and ``dlopen`` (``None``: they
    cannot)."""
    info = os.fstat(fd)
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
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
