"""``warmcache serve``: the registry over HTTP (see :mod:`warmcache.service`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import click

from warmcache.cli._common import db_option, registry_location, sign_option
from warmcache.cli.interrupted import note_left
from warmcache.errors import UsageError
from warmcache.manifest import load_manifest
from warmcache.settings import RegistryLocation
from warmcache.trust import SigningKey


@click.command("serve")
@db_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but loopback exposes the registry's reads.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8411, show_default=True)
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The manifest /v1/status reports on.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File holding the bearer token for writes (default: $WARMCACHE_TOKEN; none: writes refused).",
)
@click.option(
    "--refresh",
    "refresh_interval",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds between reloads of the in-memory view.",
)
@sign_option(
    "Sign every /v1/guard answer with this private key: guards with trusted keys load precompiled code "
    "only from signed rows."
)
def serve(
    db_url: str | None,
    host: str,
    port: int,
    manifest: Path | None,
    token_file: Path | None,
    refresh_interval: float,
    signing_key: SigningKey | None,
) -> None:
    """Serve checks, shapes, status, misses and guard snapshots over HTTP, with /metrics and a dashboard at /."""
    try:
        import uvicorn

        from warmcache.service import ServiceConfig, create_app
        from warmcache.service.auth import load_token
        from warmcache.service.server import server_config
    except ImportError as exc:
        raise UsageError(f"warmcache serve needs the 'serve' extra (pip install 'warmcache[serve]'): {exc}") from None
    location = registry_location(
        db_url, load_manifest(manifest) if manifest else None, named_for="serve --sign" if signing_key else None
    )
    token = load_token(token_file)
    app = create_app(
        ServiceConfig(
            location, token=token, manifest=manifest, refresh_interval=refresh_interval, signing_key=signing_key
        )
    )
    if not is_loopback(host):
        click.echo(
            f"warmcache: warning: --host {host} is reachable beyond this machine: anyone who can "
            "connect reads the registry",
            err=True,
        )
    click.echo(startup_line(location, host, port, has_token=token is not None), err=True)
    # uvicorn stops on Ctrl-C, then raises it again: the boundary's one line, exit 130, says the service is down
    note_left(lambda: f"no longer serving {base_url(host, port)}")
    uvicorn.Server(server_config(app, host, port)).run()


def startup_line(location: RegistryLocation, host: str, port: int, *, has_token: bool) -> str:
    """What ``serve`` says as it starts: the registry it serves, and the dashboard's address while it runs (a script
    that stops it right away leaves the address behind, which then leads nowhere)."""
    writes = "need the bearer token" if has_token else "disabled (no token)"
    return (
        f"warmcache serve: registry {location.display}; dashboard {base_url(host, port)} while this runs "
        f"(Ctrl-C stops it); writes {writes}"
    )


def base_url(host: str, port: int) -> str:
    """The URL a browser takes: an IPv6 address goes in brackets (``http://[::1]:8411/``)."""
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
