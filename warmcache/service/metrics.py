"""``GET /metrics``: the registry view in Prometheus text format, computed at scrape time.

A custom collector reads the current :class:`~warmcache.service.view.RegistryState`,
so a scrape costs no database query and never disagrees with ``/v1/shapes``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from warmcache.registry.models import utcnow
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.registry.usability import effective_status
from warmcache.service.view import RegistryView

#: Compile-time histogram bucket bounds, seconds (Neuron compiles run to an hour).
COMPILE_SECONDS_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)


class RegistryCollector(Collector):
    def __init__(self, view: RegistryView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("warmcache_registry_up", "1 when the last registry refresh succeeded")
        up.add_metric([], 0 if self.view.error or self.view.state is None else 1)
        yield up
        errors = CounterMetricFamily("warmcache_registry_errors", "Failed registry refreshes and queries since start")
        errors.add_metric([], self.view.errors)
        yield errors
        state = self.view.state
        if state is None:
            return
        age = GaugeMetricFamily("warmcache_registry_loaded_timestamp_seconds", "When the served view was loaded")
        age.add_metric([], state.loaded_at.timestamp())
        yield age

        shapes = GaugeMetricFamily(
            "warmcache_shapes",
            "Registry rows by model, workload and effective status",
            labels=["model", "workload", "status"],
        )
        by_status = Counter((r.model_name, r.workload, effective_status(r)) for r in state.records)
        for (model, workload, status), count in sorted(by_status.items()):
            shapes.add_metric([model, workload, status], count)
        yield shapes

        progress = GaugeMetricFamily(
            "warmcache_warmup_progress", "Fraction of a model's rows compiled for this toolchain", labels=["model"]
        )
        totals = Counter(r.model_name for r in state.records)
        done = Counter(r.model_name for r in state.records if effective_status(r) in DONE_STATUSES)
        for model in sorted(totals):
            progress.add_metric([model], done[model] / totals[model])
        yield progress

        now = utcnow()
        expired = GaugeMetricFamily(
            "warmcache_expired_claims", "Claims whose worker stopped renewing the lease", labels=["model"]
        )
        for model in sorted(totals):
            expired.add_metric(
                [model],
                sum(1 for r in state.records if r.model_name == model and _expired(r.status, r.lease_expires_at, now)),
            )
        yield expired

        misses = CounterMetricFamily(
            "warmcache_misses",
            "Requests guards padded, refused or let through, by decision",
            labels=["model", "workload", "decision"],
        )
        miss_counts: Counter[tuple[str, str, str]] = Counter()
        for m in state.misses:
            miss_counts[(m["model"], m["workload"], m["decision"])] += m["count"]
        for key, count in sorted(miss_counts.items()):
            misses.add_metric(list(key), count)
        yield misses

        histogram = HistogramMetricFamily(
            "warmcache_compile_seconds", "Recorded compile time per shape", labels=["model", "workload"]
        )
        seconds: dict[tuple[str, str], list[float]] = {}
        for r in state.records:
            if r.compile_seconds is not None:
                seconds.setdefault((r.model_name, r.workload), []).append(r.compile_seconds)
        for (model, workload), values in sorted(seconds.items()):
            buckets = [(str(bound), sum(1 for v in values if v <= bound)) for bound in COMPILE_SECONDS_BUCKETS]
            buckets.append(("+Inf", len(values)))
            histogram.add_metric([model, workload], buckets, sum(values))
        yield histogram


def _expired(status: str, lease_expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    return status == Status.COMPILING and lease_expires_at is not None and lease_expires_at < now


def metrics_text(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def metrics_registry(view: RegistryView) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegistryCollector(view))
    return registry
