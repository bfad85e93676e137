"""``warmcache buckets suggest``: choose the lengths to compile from observed traffic."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

import click

from warmcache.buckets import render
from warmcache.buckets.baselines import DEFAULT_POW2_FLOOR
from warmcache.buckets.inputs import (
    LengthLimit,
    Lengths,
    lengths_from_misses,
    model_length_limit,
    read_dataset_lengths,
    read_lengths_file,
)
from warmcache.buckets.suggest import Suggestion, suggest_buckets
from warmcache.buckets.traffic import Traffic
from warmcache.cli._common import (
    count_option,
    db_option,
    format_table,
    is_terminal,
    json_option,
    open_registry,
    print_json,
)
from warmcache.cli.progress import amount_progress
from warmcache.errors import UsageError
from warmcache.shapes import WORKLOADS, Workload

F = TypeVar("F", bound=Callable[..., Any])


@click.group("buckets")
def buckets_group() -> None:
    """Choose bucket lengths from real traffic (minimum padding, exactly)."""


@dataclass(frozen=True, slots=True)
class LengthSource:
    """Where ``buckets suggest`` reads the observed lengths: exactly one of --lengths, --dataset and --from-misses,
    with what each needs."""

    lengths_file: str | None
    column: str | None
    dataset_file: str | None
    field: str
    tokenizer_path: str | None
    from_misses: bool

    def read(self, model_name: str | None, workload: str, limit: LengthLimit | None, db_url: str | None) -> Lengths:
        chosen = [
            name
            for name, on in (
                ("--lengths", self.lengths_file),
                ("--dataset", self.dataset_file),
                ("--from-misses", self.from_misses),
            )
            if on
        ]
        if len(chosen) != 1:
            raise UsageError(
                "give exactly one source of lengths: --lengths, --dataset or --from-misses (got "
                f"{', '.join(chosen) or 'none'})"
            )
        if self.column is not None and self.lengths_file is None:
            raise UsageError("--column applies to --lengths only")
        if self.lengths_file is not None:
            return read_lengths_file(self.lengths_file, column=self.column, limit=limit)
        if self.dataset_file is not None:
            if self.tokenizer_path is None:
                raise UsageError("--dataset needs --tokenizer PATH (the model's own tokenizer decides the lengths)")
            with _progress(f"tokenising {self.dataset_file}") as progress:
                return read_dataset_lengths(
                    self.dataset_file,
                    field=self.field,
                    tokenizer_path=self.tokenizer_path,
                    limit=limit,
                    progress=progress,
                )
        assert model_name is not None
        with open_registry(db_url, create=False) as registry:
            summary = registry.miss_summary(model_name)
            where = registry.location.display
        return lengths_from_misses(summary, registry=where, model=model_name, workload=workload, limit=limit)


def length_source_options(func: F) -> F:
    """The options of :class:`LengthSource`, handed to the command as one ``source`` (its fields are stated once,
    there)."""

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        source = LengthSource(**{f.name: kwargs.pop(f.name) for f in fields(LengthSource)})
        return func(source=source, **kwargs)

    options = (
        click.option(
            "--lengths",
            "lengths_file",
            metavar="FILE",
            help="Observed lengths: one integer a line, or a CSV with --column.",
        ),
        click.option("--column", metavar="NAME", help="The CSV column of --lengths holding the lengths."),
        click.option(
            "--dataset", "dataset_file", metavar="FILE.jsonl", help="A JSONL dataset, tokenised with --tokenizer."
        ),
        click.option(
            "--field", default="text", show_default=True, metavar="NAME", help="The --dataset field holding the text."
        ),
        click.option(
            "--tokenizer",
            "tokenizer_path",
            metavar="PATH",
            help="The model (or tokenizer) folder: tokenises --dataset; its config's "
            "max_position_embeddings is the default --max-length.",
        ),
        click.option(
            "--from-misses",
            is_flag=True,
            help="Use the requests the runtime guard padded or refused (registry misses of --model), each "
            "weighted by its count.",
        ),
    )
    for option in reversed(options):
        command = option(command)
    return cast(F, command)


@buckets_group.command("suggest")
@length_source_options
@click.option(
    "--model",
    "model_name",
    metavar="NAME",
    help="Model name as in the manifest (for --from-misses and --manifest-snippet).",
)
@click.option(
    "--workload",
    type=click.Choice(WORKLOADS),
    default="generate",
    show_default=True,
    help="Which misses to read and which manifest table to print.",
)
@click.option(
    "--max-buckets",
    type=int,
    metavar="K",
    help="Use at most K buckets (default: as many as the powers-of-two ladder from --pow2-floor).",
)
@click.option(
    "--compile-cost",
    type=click.FloatRange(min=0),
    metavar="TOKENS",
    help="Let the cost decide K: one more compiled bucket is worth TOKENS padded tokens over "
    "--expected-requests requests.",
)
@count_option(
    "--expected-requests",
    metavar="R",
    help="Requests the buckets will serve, for --compile-cost (default: the number of observed lengths).",
)
@count_option(
    "--batch",
    "batch_size",
    default=1,
    show_default=True,
    metavar="N",
    help="Requests served per batch: plan on the distribution of the batch's longest member.",
)
@count_option(
    "--pow2-floor",
    default=DEFAULT_POW2_FLOOR,
    show_default=True,
    help="Smallest bucket of the powers-of-two ladder compared against (NxDI's default).",
)
@count_option("--max-length", metavar="L", help="The model's maximum length: longer observed lengths are an error.")
@click.option(
    "--manifest-snippet",
    is_flag=True,
    help="Print a [[model.generate]]/[[model.train]] table for the manifest instead of the report.",
)
@click.option("--batch-sizes", default=None, metavar="1,2,4", help="Batch sizes of the snippet (default: --batch).")
@count_option("--max-cache-len", metavar="M", help="max_cache_len of the generate snippet.")
@click.option(
    "--plot",
    "plot_file",
    metavar="FILE.png",
    help="Also save a histogram with the bucket edges (needs warmcache[plot]).",
)
@db_option
@json_option
def suggest(
    source: LengthSource,
    model_name: str | None,
    workload: str,
    max_buckets: int | None,
    compile_cost: float | None,
    expected_requests: int | None,
    batch_size: int,
    pow2_floor: int,
    max_length: int | None,
    manifest_snippet: bool,
    batch_sizes: str | None,
    max_cache_len: int | None,
    plot_file: str | None,
    db_url: str | None,
    as_json: bool,
) -> None:
    """Propose the bucket lengths with the least expected padding, next to powers of two and even spacing."""
    if max_buckets is not None and max_buckets < 1:
        raise UsageError(f"--max-buckets: K must be >= 1, got {max_buckets}")
    if expected_requests is not None and compile_cost is None:
        raise UsageError("--expected-requests only matters with --compile-cost")
    if source.from_misses and batch_size > 1:
        raise UsageError(
            "--batch does not apply to --from-misses: a recorded miss is a whole request whose "
            "seq_len is already its longest row"
        )
    if (manifest_snippet or source.from_misses) and not model_name:
        raise UsageError(f"{'--from-misses' if source.from_misses else '--manifest-snippet'} needs --model NAME")
    snippet_batches = _parse_batch_sizes(batch_sizes) if batch_sizes is not None else [batch_size]

    limit = LengthLimit(max_length, "--max-length") if max_length is not None else None
    if limit is None and source.tokenizer_path is not None:
        limit = model_length_limit(source.tokenizer_path)
    lengths = source.read(model_name, workload, limit, db_url)

    result = suggest_buckets(
        Traffic(lengths.distribution, batch_size),
        max_buckets=max_buckets,
        compile_cost=compile_cost,
        expected_requests=expected_requests,
        pow2_floor=pow2_floor,
    )
    snippet = None
    if manifest_snippet:
        assert model_name is not None
        snippet = render.manifest_snippet(
            result,
            model=model_name,
            workload=cast(Workload, workload),
            batch_sizes=snippet_batches,
            max_cache_len=max_cache_len,
        )
    if plot_file is not None:
        click.echo(f"wrote {render.save_plot(result, plot_file)}", err=True)

    if as_json:
        print_json(render.as_json(result, lengths.source, snippet))
    elif snippet is not None:
        click.echo(snippet, nl=False)
    else:
        click.echo(report_text(result))


def report_text(result: Suggestion) -> str:
    """The comparison table, with the distribution summary and the exact objective above it."""
    lengths = result.traffic.lengths
    n = result.traffic.batch_size
    header = (
        f"{lengths.total} lengths ({len(lengths.values)} distinct), "
        f"{lengths.min_length}-{lengths.max_length} tokens, mean {lengths.mean_length:.1f}; "
        + ("single requests" if n == 1 else f"batches of {n}")
    )
    if n > 1:
        floor = result.unavoidable
        header += (
            f"\neven with every length compiled, batches of {n} pad "
            f"{floor.padded_tokens_per_request:.1f} tokens per request "
            f"({floor.waste_percent:.2f}% waste) up to their longest member"
        )
    columns = (
        ["strategy", "K", "waste %", "pad tok/request"]
        + (["pad tok/batch"] if n > 1 else [])
        + ["K to match", "buckets"]
    )
    rows = []
    for strategy in result.strategies:
        cost = strategy.cost
        per_batch = [f"{cost.padded_tokens_per_batch:.1f}"] if n > 1 else []
        matched = strategy.buckets_to_match if strategy.buckets_to_match is not None else "never"
        rows.append(
            [
                strategy.name,
                len(strategy.buckets),
                f"{cost.waste_percent:.2f}",
                f"{cost.padded_tokens_per_request:.1f}",
                *per_batch,
                matched,
                _short_list(strategy.buckets),
            ]
        )
    return "\n".join(
        [
            header,
            f"objective: {render.objective_text(result)}",
            "",
            format_table(columns, rows),
            "",
            "K to match: the fewest buckets of that kind that pad no more than the optimal plan.",
            f"suggested buckets: {', '.join(map(str, result.buckets))}",
        ]
    )


def _progress(label: str) -> AbstractContextManager[Callable[[int, int], None]]:
    """A progress bar on a terminal; a plain line every 10% otherwise (CI logs stay readable)."""
    return amount_progress(label, terminal=is_terminal(), steps=10, line=lambda done, total: f"{label}: {done}/{total}")


def _parse_batch_sizes(text: str) -> list[int]:
    sizes = []
    for part in text.split(","):
        try:
            size = int(part)
        except ValueError:
            raise UsageError(f"--batch-sizes: not an integer: {part.strip()!r} in {text!r}") from None
        if size < 1:
            raise UsageError(f"--batch-sizes: must be >= 1, got {size}")
        sizes.append(size)
    return sizes


def _short_list(values: tuple[int, ...], limit: int = 10) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f", ... (+{len(values) - limit})" if len(values) > limit else "")
