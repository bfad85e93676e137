"""Query commands: ``plan``, ``shapes`` and ``check``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from warmcache.cli._common import (
    count_option,
    db_option,
    format_table,
    json_option,
    manifest_query_options,
    open_registry,
    print_json,
    print_json_array,
    print_result,
)
from warmcache.identity.plan import plan_manifest
from warmcache.identity.support import check_supported
from warmcache.manifest import Manifest, load_manifest
from warmcache.registry.statuses import PLAN_STATUSES, Status
from warmcache.reports.explain import explain_plan
from warmcache.reports.query import CheckRequest, check_request, effective_status, plan_json, shape_json, shapes_summary
from warmcache.shapes import DTYPE_ALIASES, WORKLOADS

if TYPE_CHECKING:
    from warmcache.registry.registry import PlanStatus


@click.command("plan")
@manifest_query_options
def plan(manifest: str, model_name: str | None, db_url: str | None, as_json: bool) -> None:
    """List every shape MANIFEST declares with its registry status."""
    parsed = load_manifest(manifest)
    planned = plan_manifest(parsed, model_name)  # first: a model path that is not there is named by its key
    with open_registry(db_url, parsed, create=False) as registry:
        explained = explain_plan(registry, planned)
    statuses = [e.status for e in explained]
    _check_unwarmed_supported(parsed, statuses)
    if as_json:
        print_json([plan_json(e.status, e.reason) for e in explained])
        return
    rows = [
        (
            s.planned.model.name,
            s.planned.spec.workload,
            s.planned.spec.family.dtype,
            s.planned.spec.batch_size,
            s.planned.spec.seq_len,
            s.planned.spec.family.max_cache_len,
            s.status,
        )
        for s in statuses
    ]
    click.echo(format_table(("model", "workload", "dtype", "batch", "seq", "max_cache_len", "status"), rows))
    counts = Counter(s.status for s in statuses)
    summary = ", ".join(f"{counts[k]} {k}" for k in PLAN_STATUSES if counts[k])
    click.echo(f"{len(statuses)} shapes: {summary or 'none'}")


@click.command("explain")
@manifest_query_options
def explain(manifest: str, model_name: str | None, db_url: str | None, as_json: bool) -> None:
    """Say why each shape MANIFEST declares is not usable here (missing, stale, failed, pending), naming what
    differs."""
    parsed = load_manifest(manifest)
    planned = plan_manifest(parsed, model_name)
    with open_registry(db_url, parsed, create=False) as registry:
        explained = explain_plan(registry, planned)
    _check_unwarmed_supported(parsed, [e.status for e in explained])
    unusable = [e for e in explained if e.reason is not None]
    if as_json:
        print_json([e.as_json() for e in unusable])
        return
    for e in unusable:
        click.echo(f"{e.status.planned.spec.describe()}: {e.reason}")
    click.echo(f"{len(unusable)} of {len(planned)} shapes not usable here")


def _check_unwarmed_supported(parsed: Manifest, statuses: Sequence[PlanStatus]) -> None:
    """Refuse, naming why, each model with a shape not compiled under its config and toolchain that warmcache cannot
    serve.

    A model with a row for every shape passed this check when it was warmed; checking it
    again would import transformers and the model's code (torch: 15 s on 2 cores) to
    answer about a warm manifest from one registry query.
    """
    unwarmed = {s.planned.model.name for s in statuses if s.status in (Status.MISSING, Status.STALE)}
    check_supported(parsed, [m for m in parsed.models if m.name in unwarmed])


@click.command("shapes")
@click.option("--model", "model_name", default=None, help="Only this model.")
@click.option("--workload", type=click.Choice(WORKLOADS), default=None)
@click.option(
    "--status",
    "status",
    type=click.Choice([str(s) for s in PLAN_STATUSES if s != Status.MISSING]),
    default=None,
    help="Only rows with this (effective) status.",
)
@db_option
@json_option
def shapes(model_name: str | None, workload: str | None, status: str | None, db_url: str | None, as_json: bool) -> None:
    """List the shapes in the registry (rows of another toolchain show as stale)."""
    if as_json:
        # Streamed: a registry of 100,000 rows is listed without holding every row in memory.
        with open_registry(db_url, create=False) as registry:
            streamed = (
                r
                for r in registry.iter_rows(model=model_name, workload=workload)
                if status is None or effective_status(r) == status
            )
            print_json_array(shape_json(r) for r in streamed)
        return
    with open_registry(db_url, create=False) as registry:
        records = registry.rows(model=model_name, workload=workload)
    listed = [(r, effective_status(r)) for r in records]
    if status is not None:
        listed = [(r, s) for r, s in listed if s == status]
    rows = [
        (
            r.model_name,
            r.workload,
            r.dtype,
            r.batch_size,
            r.seq_len,
            r.max_cache_len,
            s,
            f"{r.compile_seconds:.1f}" if r.compile_seconds is not None else None,
        )
        for r, s in listed
    ]
    click.echo(
        format_table(("model", "workload", "dtype", "batch", "seq", "max_cache_len", "status", "compile_s"), rows)
    )
    click.echo("\n".join(shapes_summary(listed)))


@click.command("check")
@click.option("--model", "model_name", required=True, help="Model name as in the manifest.")
@click.option("--workload", type=click.Choice(WORKLOADS), default="generate", show_default=True)
@count_option("--batch", "batch_size", required=True, help="Request batch size.")
@count_option("--seq", "seq_len", required=True, help="Prompt (generate) or sequence (train) length.")
@click.option(
    "--dtype", type=click.Choice(sorted(set(DTYPE_ALIASES.values()))), default=None, help="Only shapes of this dtype."
)
@count_option("--max-cache-len", default=None, help="Only shapes compiled for this cache length.")
@click.option("--exact", is_flag=True, help="Padding does not count: the exact shape must be compiled.")
@db_option
@json_option
def check(
    model_name: str,
    workload: str,
    batch_size: int,
    seq_len: int,
    dtype: str | None,
    max_cache_len: int | None,
    exact: bool,
    db_url: str | None,
    as_json: bool,
) -> None:
    """Exit 0 if a request can run without compiling (exactly or padded), 1 if not."""
    with open_registry(db_url, create=False) as registry:
        request = CheckRequest(batch_size, seq_len, exact=exact, dtype=dtype, max_cache_len=max_cache_len)
        result = check_request(registry, model_name, workload, request)
    print_result(result, as_json, result.message)
    raise SystemExit(0 if result.ok else 1)
