"""Runtime-guard commands: ``misses`` (what production padded or refused) and ``guard export`` (a snapshot file)."""

from __future__ import annotations

from pathlib import Path

import click

from warmcache.cli._common import db_option, format_table, json_option, open_registry, print_json, sign_option
from warmcache.errors import UsageError
from warmcache.registry.statuses import DONE_STATUSES
from warmcache.runtime.snapshot import SNAPSHOT_FILE, write_snapshot
from warmcache.shapes import WORKLOADS
from warmcache.trust import SigningKey


@click.command("misses")
@click.option("--model", "model_name", default=None, help="Only this model.")
@db_option
@json_option
def misses(model_name: str | None, db_url: str | None, as_json: bool) -> None:
    """Summarise the requests runtime guards padded, clipped, truncated or refused, per shape."""
    with open_registry(db_url, create=False) as registry:
        summary = registry.miss_summary(model_name)
    if as_json:
        print_json(summary)
        return
    rows = [
        (
            m["model"],
            m["workload"],
            m["dtype"],
            m["batch_size"],
            m["seq_len"],
            m["decision"],
            f"{m['padded_batch']}x{m['padded_seq']}" if m["padded_batch"] is not None else "",
            m["count"],
            m["last_seen"],
        )
        for m in summary
    ]
    click.echo(
        format_table(
            ("model", "workload", "dtype", "batch", "seq", "decision", "padded_to", "count", "last_seen"), rows
        )
    )
    click.echo(f"{sum(m['count'] for m in summary)} misses over {len(summary)} shapes")


@click.group("guard")
def guard_group() -> None:
    """Runtime guard helpers."""


@guard_group.command("export")
@click.option("--model", "model_name", required=True, help="The model whose compiled shapes to export.")
@click.option("--workload", type=click.Choice(WORKLOADS), default=None, help="Only this workload (default: all).")
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(path_type=Path),
    help=f"Snapshot file to write (an existing folder gets {SNAPSHOT_FILE}).",
)
@sign_option(
    "Sign the snapshot with this private key (warmcache keys generate): a guard with trusted keys loads "
    "precompiled code only from signed rows."
)
@db_option
@json_option
def export(
    model_name: str,
    workload: str | None,
    out_path: Path,
    signing_key: SigningKey | None,
    db_url: str | None,
    as_json: bool,
) -> None:
    """Write the model's compiled shapes to a JSON snapshot for ShapeGuard.from_snapshot (no database needed).

    Rows of every toolchain are exported: the production process, not this one,
    decides which are stale for its own torch and compiler.
    """
    with open_registry(db_url, create=False, named_for="guard export --sign" if signing_key else None) as registry:
        records = registry.rows(model=model_name, workload=workload, statuses=DONE_STATUSES, with_artifacts=True)
        source = registry.location.display
    if not records:
        raise UsageError(f"model {model_name!r} has no compiled shapes in registry {source}")
    written = write_snapshot(out_path, records, source, signing_key)
    signed_by = signing_key.public.key_id if signing_key else None
    if as_json:
        print_json({"path": str(written), "shapes": len(records), "source": source, "signed_by": signed_by})
    else:
        click.echo(
            f"wrote {len(records)} compiled shapes of {model_name} to {written}"
            + (f" (signed by key {signed_by})" if signed_by else " (unsigned)")
        )
