"""Query commands: ``plan``, ``shapes`` and ``check``."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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
from warmcache.errors import ExitCode
from warmcache.identity.plan import plan_manifest
from warmcache.identity.support import check_supported
from warmcache.manifest import Manifest, load_manifest
from warmcache.registry.statuses import PLAN_STATUSES, Status
from warmcache.registry.usability import effective_status
from warmcache.reports.explain import explain_plan, warmed_models
from warmcache.reports.query import CheckRequest, check_request, plan_json, shape_json, shapes_summary
from warmcache.reports.request import explain_request, require_known_model
from warmcache.settings import REGISTRY
from warmcache.shapes import DTYPE_ALIASES, WORKLOADS

if TYPE_CHECKING:
    from warmcache.registry.registry import PlanStatus

R = TypeVar("R")


@click.command("plan")
@manifest_query_options
def plan(manifest: str, model_name: str | None, db_url: str | None, as_json: bool) -> None:
    """List every shape MANIFEST declares with its registry status."""
    parsed = load_manifest(manifest)
    planned = plan_manifest(parsed, model_name)  # first: a model path that is not there is named by its key
    with open_registry(db_url, parsed, create=False) as registry:
        explained = explain_plan(registry, planned)
        warmed = warmed_models(registry, planned)
    statuses = [e.status for e in explained]
    _check_unwarmed_supported(parsed, statuses, warmed)
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


@dataclass(frozen=True, slots=True)
class AskedRequest:
    """What :func:`request_options` read: the model and workload, and the request ``--batch --seq`` (with ``--dtype
    --max-cache-len --exact``) describe, ``None`` where neither was given."""

    model_name: str | None
    workload: str
    request: CheckRequest | None

    def one(self) -> tuple[str, CheckRequest] | None:
        """The model and its request once ``--model``, ``--batch`` and ``--seq`` are all given, else ``None``."""
        if self.model_name is None or self.request is None:
            return None
        return self.model_name, self.request


def request_options(*, required: bool) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """``--model --workload --batch --seq --dtype --max-cache-len --exact``: one request, as ``check`` and
    ``explain`` take it, handed to the command as one ``asked`` (:class:`AskedRequest`)."""

    def decorate(func: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(func)
        def packed(
            *args: Any,
            model_name: str | None,
            workload: str,
            batch_size: int | None,
            seq_len: int | None,
            dtype: str | None,
            max_cache_len: int | None,
            exact: bool,
            **kwargs: Any,
        ) -> R:
            if (batch_size is None) != (seq_len is None):
                raise click.UsageError("--batch and --seq ask about one request: give both or neither")
            request = (
                None
                if batch_size is None or seq_len is None
                else CheckRequest(batch_size, seq_len, exact=exact, dtype=dtype, max_cache_len=max_cache_len)
            )
            return func(*args, asked=AskedRequest(model_name, workload, request), **kwargs)

        command: Callable[..., R] = packed
        for option in reversed(
            (
                click.option("--model", "model_name", required=required, help=MODEL_HELP),
                click.option("--workload", type=click.Choice(WORKLOADS), default="generate", show_default=True),
                count_option("--batch", "batch_size", required=required, help="Request batch size."),
                count_option(
                    "--seq", "seq_len", required=required, help="Prompt (generate) or sequence (train) length."
                ),
                click.option(
                    "--dtype",
                    type=click.Choice(sorted(set(DTYPE_ALIASES.values()))),
                    default=None,
                    help="Only shapes of this dtype.",
                ),
                count_option("--max-cache-len", default=None, help="Only shapes compiled for this cache length."),
                click.option("--exact", is_flag=True, help="Padding does not count: the exact shape must be compiled."),
            )
        ):
            command = option(command)
        return command

    return decorate


#: check and shapes take no manifest: their ``--db`` help must not send the reader looking for one.
registry_option = click.option(
    "--db",
    "db_url",
    metavar="URL",
    default=None,
    help=f"Registry database URL (default: ${REGISTRY.env}, then {REGISTRY.default}).",
)

MODEL_HELP = "Model name as in the manifest (and the registry's rows)."


@click.command("explain")
@click.argument("manifest", required=False, type=click.Path(dir_okay=False, path_type=str))
@request_options(required=False)
@db_option
@json_option
def explain(manifest: str | None, asked: AskedRequest, db_url: str | None, as_json: bool) -> ExitCode:
    """Say why a shape is not usable here (missing, stale, failed, pending), naming what differs: each shape MANIFEST
    declares (--model: of one model), or one request as check takes it (--model --batch --seq).

    Exits 1 when anything it explains is not usable here, as check does for "not compiled".
    """
    if manifest is None:
        one = asked.one()
        if one is None:
            raise click.UsageError("give a MANIFEST, or --model, --batch and --seq (one request, as check takes it)")
        return _explain_request(db_url, one[0], asked.workload, one[1], as_json)
    if asked.request is not None:
        raise click.UsageError("--batch and --seq ask about one request: give them without a MANIFEST")
    parsed = load_manifest(manifest)
    planned = plan_manifest(parsed, asked.model_name)
    with open_registry(db_url, parsed, create=False) as registry:
        explained = explain_plan(registry, planned)
        warmed = warmed_models(registry, planned)
    _check_unwarmed_supported(parsed, [e.status for e in explained], warmed)
    unusable = [e for e in explained if e.reason is not None]
    if as_json:
        print_json([e.as_json() for e in unusable])
    else:
        for e in unusable:
            click.echo(f"{e.status.planned.spec.describe()}: {e.reason}")
        click.echo(f"{len(unusable)} of {len(planned)} shapes not usable here")
    return ExitCode.NOT_DONE if unusable else ExitCode.OK


def _explain_request(db_url: str | None, model: str, workload: str, request: CheckRequest, as_json: bool) -> ExitCode:
    """``explain --model --batch --seq``: check's decision, and why the request is not usable from the registry's rows
    of its shape (no manifest: nothing reads a model config, nothing imports torch)."""
    with open_registry(db_url, create=False) as registry:
        require_known_model(registry, model)
        result, unusable = explain_request(registry.rows(model=model, workload=workload), model, workload, request)
    if as_json:
        print_json([e.as_json(model) for e in unusable])
    else:
        click.echo(result.message() if result.ok else "\n".join(e.line() for e in unusable))
        click.echo(f"{min(len(unusable), 1)} of 1 shapes not usable here")
    return ExitCode.NOT_DONE if unusable else ExitCode.OK


def _check_unwarmed_supported(parsed: Manifest, statuses: Sequence[PlanStatus], warmed: set[str]) -> None:
    """Refuse, naming why, each model with a shape not compiled under its config and toolchain that warmcache cannot
    serve.

    A model with a compiled row under its config and toolchain (``warmed``) passed this
    check when it was warmed; checking it again would import transformers and the model's
    code (torch: 10 s on 2 cores) to explain a missing bucket from one registry query.
    """
    unwarmed = {s.planned.model.name for s in statuses if s.status in (Status.MISSING, Status.STALE)} - warmed
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
@registry_option
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
@request_options(required=True)
@registry_option
@json_option
def check(asked: AskedRequest, db_url: str | None, as_json: bool) -> ExitCode:
    """Exit 0 if a request can run without compiling (exactly or padded), 1 if not, 2 for a model the registry has
    no row of (naming the nearest known names)."""
    one = asked.one()
    assert one is not None, "click requires --model, --batch and --seq"
    model_name, request = one
    with open_registry(db_url, create=False) as registry:
        require_known_model(registry, model_name)
        result = check_request(registry, model_name, asked.workload, request)
    print_result(result, as_json, result.message)
    return ExitCode.OK if result.ok else ExitCode.NOT_DONE
