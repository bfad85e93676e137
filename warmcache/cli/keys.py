"""``warmcache keys generate``: the signing key pair for bundles and store indexes."""

from __future__ import annotations

from pathlib import Path

import click

from warmcache.cli._common import json_option, print_json
from warmcache.trust import generate_key


@click.group("keys")
def keys_group() -> None:
    """Make the Ed25519 key pair that signs bundles (bundle pack --sign) and that hosts trust (--trust)."""


@keys_group.command("generate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@json_option
def generate(path: Path, as_json: bool) -> None:
    """Write a new private key to PATH (readable by you only) and its public key to PATH.pub."""
    public = generate_key(path)
    if as_json:
        print_json(
            {
                "private_key": str(path),
                "public_key_file": f"{path}.pub",
                "public_key": public.text,
                "key_id": public.key_id,
            }
        )
        return
    click.echo(f"{path}: private key (keep it secret; sign with: warmcache bundle pack --sign {path})")
    click.echo(
        f"{path}.pub: public key {public.text} (key {public.key_id}); trust it with --trust {path}.pub or [trust] keys"
    )
