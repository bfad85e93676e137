"""``warmcache status``: how far a manifest's warmup is, who is compiling what, what failed."""

from __future__ import annotations

import datetime as dt

import click

from warmcache.cli._common import format_table, manifest_query_options, open_registry, print_json
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.reports.status import STATUS_ORDER, WarmupStatus, warmup_status
from warmcache.units import format_count, format_duration


@click.command("status")
@manifest_query_options
def status(manifest: str, model_name: str | None, db_url: str | None, as_json: bool) -> None:
    """Per model and workload: counts by status, claims in flight, failures and the time left."""
    parsed = load_manifest(manifest)
    planned = plan_manifest(parsed, model_name)
    with open_registry(db_url, parsed, create=False) as registry:
        report = warmup_status(registry, planned)
    if as_json:
        print_json(report.as_json())
    else:
        click.echo(render(report))


def render(report: WarmupStatus) -> str:
    """The text report: a summary table, then claims in flight and failures when there are any."""
    shown = [s for s in STATUS_ORDER if any(g.counts.get(s) for g in report.groups)]
    rows = [
        (
            g.model,
            g.workload,
            g.total,
            *(g.counts.get(s, 0) for s in shown),
            f"{g.median_compile_seconds:.1f}" if g.median_compile_seconds is not None else None,
            format_duration(report.eta_seconds(g)) if g.remaining else None,
        )
        for g in report.groups
    ]
    parts = [format_table(("model", "workload", "total", *shown, "median_s", "eta"), rows)]
    if report.claims:
        parts.append("\nclaims in flight:")
        parts.append(
            format_table(
                ("model", "workload", "batch", "seq", "host", "pid", "since", "lease"),
                [
                    (
                        c.model,
                        c.workload,
                        c.batch_size,
                        c.seq_len,
                        c.host,
                        c.pid,
                        _clock(c.since),
                        "EXPIRED (will be retaken)" if c.lease_expired else f"until {_clock(c.lease_expires_at)}",
                    )
                    for c in report.claims
                ],
            )
        )
    if report.failures:
        parts.append("\nfailures:")
        parts.append(
            format_table(
                ("model", "workload", "batch", "seq", "attempts", "host", "error"),
                [(f.model, f.workload, f.batch_size, f.seq_len, f.attempts, f.host, f.error) for f in report.failures],
            )
        )
    reclaimed = sum(g.reclaimed for g in report.groups)
    if reclaimed:
        parts.append(
            f"\n{format_count(reclaimed, 'shape')} claimed more than once (a worker stopped holding "
            "it and its lease ran out, or a failure was retried)"
        )
    remaining = sum(g.remaining for g in report.groups)
    workers = len(report.live_workers)
    parts.append(
        f"\n{remaining} of {sum(g.total for g in report.groups)} shapes left; "
        f"{format_count(workers, 'live worker')}; eta {format_duration(report.eta_seconds()) if remaining else 'done'}"
    )
    return "\n".join(parts)


def _clock(moment: dt.datetime | None) -> str:
    return moment.astimezone(dt.UTC).strftime("%H:%M:%S") if moment else "-"
