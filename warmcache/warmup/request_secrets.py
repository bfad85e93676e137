"""Registry passwords travel to a child process in its environment, never in its request file.

The request file sits in a private temporary folder (0700) that the parent removes
when its children end; a parent killed with ``kill -9`` leaves it behind, and with it
whatever it holds. So each :class:`~warmcache.settings.RegistryLocation` of a request
is written with its password hidden (the URL as messages show it), and the child gets
``{shown URL: URL}`` in ``$WARMCACHE_CHILD_REGISTRY_URLS``: readable by its owner only
(``/proc/PID/environ`` is 0400), inherited by a torchrun's ranks, and gone with the
processes. The child takes it out of its environment once it has read it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TypeVar

from warmcache.settings import RegistryLocation
from warmcache.settings_table import CHILD_REGISTRY_URLS

SECRETS_ENV = CHILD_REGISTRY_URLS.env

R = TypeVar("R")


def without_secrets(request: R) -> tuple[R, dict[str, str]]:
    """``request`` with each registry location's password hidden, and the environment that gives the child them back."""
    hidden: dict[str, RegistryLocation] = {}
    urls: dict[str, str] = {}
    for field in dataclasses.fields(request):  # type: ignore[arg-type]
        location = getattr(request, field.name)
        if isinstance(location, RegistryLocation) and location.display != location.url:
            hidden[field.name] = RegistryLocation(location.display, location.source)
            urls[location.display] = location.url
    if not hidden:
        return request, {}
    return dataclasses.replace(request, **hidden), {SECRETS_ENV: json.dumps(urls)}  # type: ignore[type-var]


def with_secrets(request: R) -> R:
    """The child's side: each hidden registry location whole again (from the environment, which then forgets them)."""
    urls: dict[str, str] = json.loads(os.environ.pop(SECRETS_ENV, "{}"))
    restored = {
        field.name: RegistryLocation(urls[location.url], location.source)
        for field in dataclasses.fields(request)  # type: ignore[arg-type]
        if isinstance(location := getattr(request, field.name), RegistryLocation) and location.url in urls
    }
    return dataclasses.replace(request, **restored) if restored else request  # type: ignore[type-var]
