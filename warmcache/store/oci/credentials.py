"""Registry credentials, read where every OCI tool reads them: ``$DOCKER_CONFIG/config.json``, else
``~/.docker/config.json``.

``docker login``, ``skopeo login``, ``oras login``, ``aws ecr get-login-password | docker
login`` and Kubernetes' ``dockerconfigjson`` Secrets all write this one file, so a host or
pod that can pull images can push and pull compile caches with nothing else configured.
The file holds, per registry, an inline ``auth`` (base64 ``user:password``) or names a
credential helper (``credHelpers`` per registry, ``credsStore`` for all), run here as
``docker-credential-<name> get``, as docker runs it. The secret is handed to the transport and
never printed: messages name the registry and the file, nothing from inside it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

from warmcache.errors import UsageError

#: A config file is small; a larger file is not one (and is not read whole).
_MAX_CONFIG_BYTES = 1024 * 1024
#: A credential helper answers at once (it reads a keychain or asks a cloud's token API).
HELPER_SECONDS = 60.0

log = logging.getLogger(__name__)


def docker_config_path() -> Path:
    """``$DOCKER_CONFIG/config.json`` when the variable is set (as docker reads it), else ``~/.docker/config.json``."""
    folder = os.environ.get("DOCKER_CONFIG")
    return Path(folder, "config.json") if folder else Path.home() / ".docker" / "config.json"


def load_docker_config() -> dict[str, Any]:
    """The auth part of the docker config (``auths`` keyed by bare ``host[:port]``, ``credsStore``, ``credHelpers``);
    empty when there is no file.

    Keys written as URLs (``https://host/v1/``, as older ``docker login`` did) are reduced
    to ``host[:port]``, the form the registry is looked up by.
    """
    path = docker_config_path()
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return {"auths": {}, "credsStore": None, "credHelpers": {}}
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the registry credentials file ({exc.strerror or exc})") from None
    try:
        config = json.loads(data) if len(data) <= _MAX_CONFIG_BYTES else None
    except ValueError:
        config = None
    if not isinstance(config, dict):  # never quote the file: it holds secrets
        raise UsageError(
            f"{path}: not a docker config file (a JSON object of at most 1 MiB with 'auths', "
            "'credHelpers' or 'credsStore')"
        )
    store = config.get("credsStore")
    return {
        "auths": {_bare_host(key): value for key, value in _table(config, "auths").items() if isinstance(value, dict)},
        "credsStore": store if isinstance(store, str) else None,
        "credHelpers": {
            _bare_host(key): value for key, value in _table(config, "credHelpers").items() if isinstance(value, str)
        },
    }


def _table(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def _bare_host(key: str) -> str:
    """``https://host:5000/v1/`` → ``host:5000``: docker's own normalisation of an ``auths`` key."""
    for scheme in ("https://", "http://"):
        if key.startswith(scheme):
            key = key[len(scheme) :]
    return key.split("/", 1)[0]


def basic_credentials(host: str) -> str | None:
    """base64 ``user:password`` for ``host`` (``localhost`` and ``127.0.0.1`` stand for each other, as docker
    treats them): the config's inline ``auth``, else its ``credHelpers`` helper, else its ``credsStore``; ``None``
    when none has any."""
    config = load_docker_config()
    for name in _aliases(host):
        inline = config["auths"].get(name, {}).get("auth")
        if isinstance(inline, str) and inline:
            return inline
        for helper in (config["credHelpers"].get(name), config["credsStore"]):
            if helper and (found := _from_helper(helper, name)):
                return found
    return None


def _aliases(host: str) -> list[str]:
    if "localhost" in host:
        return [host, host.replace("localhost", "127.0.0.1")]
    if "127.0.0.1" in host:
        return [host, host.replace("127.0.0.1", "localhost")]
    return [host]


def _from_helper(helper: str, host: str) -> str | None:
    """What ``docker-credential-<helper> get`` gives for ``host``, or ``None`` (a missing or failing helper is a host
    without credentials, as for docker; the reason is a DEBUG line, never the helper's output)."""
    binary = f"docker-credential-{helper}"
    try:
        done = subprocess.run(
            [binary, "get"], input=host.encode(), capture_output=True, check=True, timeout=HELPER_SECONDS
        )
        answer = json.loads(done.stdout)
        user, secret = answer["Username"], answer["Secret"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as exc:
        log.debug("%s: no credentials for %s (%s)", binary, host, type(exc).__name__)
        return None
    return base64.b64encode(f"{user}:{secret}".encode()).decode()
