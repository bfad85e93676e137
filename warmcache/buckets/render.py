"""A suggestion as JSON, a manifest snippet, or a histogram plot (the text table is the CLI's)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from warmcache.buckets.suggest import Suggestion
from warmcache.errors import UsageError
from warmcache.modeling.generation import prompt_fits
from warmcache.shapes import Workload
from warmcache.units import format_count

PLOT_INSTALL_HINT = "pip install 'warmcache[plot]'"


def objective_text(suggestion: Suggestion) -> str:
    """The exact quantity the plan minimises, in words a reviewer can check."""
    n = suggestion.traffic.batch_size
    padded = (
        "E[bucket(L)] - E[L] padded tokens per request"
        if n == 1
        else f"E[bucket(M)] - E[L] padded tokens per request, M = longest of {n} (P(M <= x) = F(x)^{n})"
    )
    if suggestion.compile_cost is None:
        count = len(suggestion.buckets)
        return f"minimise {padded}, with at most {format_count(count, 'bucket')}"
    return (
        f"minimise {suggestion.expected_requests} requests x ({padded}) + {suggestion.compile_cost:g} tokens x buckets"
    )


def as_json(suggestion: Suggestion, source: dict[str, Any], snippet: str | None = None) -> dict[str, Any]:
    lengths = suggestion.traffic.lengths
    return {
        "source": source,
        "lengths": {
            "count": lengths.total,
            "distinct": len(lengths.values),
            "min": lengths.min_length,
            "max": lengths.max_length,
            "mean": lengths.mean_length,
        },
        "batch_size": suggestion.traffic.batch_size,
        "objective": objective_text(suggestion),
        "compile_cost": suggestion.compile_cost,
        "expected_requests": suggestion.expected_requests,
        "buckets": list(suggestion.buckets),
        "unavoidable": {
            "waste_percent": suggestion.unavoidable.waste_percent,
            "padded_tokens_per_request": suggestion.unavoidable.padded_tokens_per_request,
            "padded_tokens_per_batch": suggestion.unavoidable.padded_tokens_per_batch,
        },
        "strategies": [
            {
                "name": s.name,
                "buckets": list(s.buckets),
                "num_buckets": len(s.buckets),
                "waste_percent": s.cost.waste_percent,
                "padded_tokens_per_request": s.cost.padded_tokens_per_request,
                "padded_tokens_per_batch": s.cost.padded_tokens_per_batch,
                "buckets_to_match": s.buckets_to_match,
            }
            for s in suggestion.strategies
        ],
        "planner_seconds": suggestion.planner_seconds,
        "manifest_snippet": snippet,
    }


def manifest_snippet(
    suggestion: Suggestion,
    *,
    model: str,
    workload: Workload,
    batch_sizes: Sequence[int],
    max_cache_len: int | None,
) -> str:
    """A ``[[model.generate]]`` or ``[[model.train]]`` table declaring the suggested buckets.

    Checked here against the manifest's own rules (a prompt plus one new token
    must fit ``max_cache_len``), so the snippet never fails ``warmcache plan``.
    """
    buckets = suggestion.buckets
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise UsageError(f"--batch-sizes: need positive integers, got {list(batch_sizes)}")
    sizes = ", ".join(str(b) for b in sorted(set(batch_sizes)))
    lengths = ", ".join(map(str, buckets))
    cost = suggestion.plan.cost
    lines = [
        f"# warmcache buckets suggest: {len(buckets)} buckets, {cost.waste_percent:.1f}% padding waste "
        f"at batch {suggestion.traffic.batch_size} on {suggestion.traffic.lengths.total} observed lengths.",
        f'# Paste under the [[model]] entry with name = "{model}".',
    ]
    if workload == "generate":
        if max_cache_len is None:
            raise UsageError(
                "--manifest-snippet for generate needs --max-cache-len (the static cache length the "
                "buckets are compiled for)"
            )
        if not prompt_fits(buckets[-1], max_cache_len):
            raise UsageError(
                f"--max-cache-len {max_cache_len}: the longest bucket {buckets[-1]} + 1 new token does "
                f"not fit; raise it to at least {buckets[-1] + 1}"
            )
        lines += [
            "[[model.generate]]",
            f"batch_sizes = [{sizes}]",
            f"prompt_lengths = [{lengths}]",
            f"max_cache_len = {max_cache_len}",
        ]
    else:
        if max_cache_len is not None:
            raise UsageError("--max-cache-len applies to generate only; train shapes have no KV cache")
        lines += ["[[model.train]]", f"batch_sizes = [{sizes}]", f"seq_lengths = [{lengths}]"]
    return "\n".join(lines) + "\n"


def save_plot(suggestion: Suggestion, path: str | Path) -> Path:
    """Histogram of the observed lengths (and of the batch maximum when batched), bucket edges marked."""
    try:
        # A bare Figure renders straight to a file: no pyplot, no GUI backend, no global state.
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(f"--plot needs matplotlib: {PLOT_INSTALL_HINT}") from None

    traffic = suggestion.traffic
    lengths = traffic.lengths
    figure = Figure(figsize=(10, 4.5))
    axes = figure.subplots()
    bins = min(100, len(lengths.values)) or 1
    total = lengths.total
    axes.hist(lengths.values, bins=bins, weights=[c / total for c in lengths.counts], alpha=0.6, label="request length")
    if traffic.batch_size > 1:
        axes.hist(
            lengths.values,
            bins=bins,
            weights=lengths.batch_max_masses(traffic.batch_size),
            histtype="step",
            linewidth=1.5,
            label=f"longest of a batch of {traffic.batch_size}",
        )
    for i, edge in enumerate(suggestion.buckets):
        axes.axvline(edge, color="black", linestyle="--", linewidth=1, label="suggested bucket" if i == 0 else None)
    axes.set_xlabel("length (tokens)")
    axes.set_ylabel("share of requests (or batches)")
    axes.set_title(f"{len(suggestion.buckets)} buckets, {suggestion.plan.cost.waste_percent:.1f}% padding waste")
    axes.legend()
    figure.tight_layout()
    out = Path(path)
    try:
        figure.savefig(out)
    except (OSError, ValueError) as exc:  # ValueError: an image format matplotlib cannot write
        raise UsageError(f"{out}: cannot write the plot: {exc}") from None
    return out
