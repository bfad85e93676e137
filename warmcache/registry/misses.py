"""The Registry's miss log: the requests runtime guards padded, clipped, truncated or refused.

A guard reports them in batches (:class:`~warmcache.registry.records.MissEvent`,
directly or through the service), each checked against what the table can hold
before anything is written; ``warmcache misses``, ``buckets suggest`` and the
service read them summed per shape and decision.
"""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select

from warmcache.registry.models import ShapeMiss
from warmcache.registry.records import MissEvent
from warmcache.registry.transactional import Transactional


class MissLog(Transactional):
    """Recording and summing shape misses (a base class of :class:`~warmcache.registry.registry.Registry`)."""

    def record_misses(self, events: Sequence[MissEvent]) -> None:
        if not events:
            return
        for event in events:
            event.check_range()
        host = socket.gethostname()
        with self.session() as session:
            session.add_all(
                ShapeMiss(
                    model_name=e.model_name,
                    workload=e.workload,
                    dtype=e.dtype,
                    tp_size=e.tp_size,
                    fsdp_size=e.fsdp_size,
                    batch_size=e.batch_size,
                    seq_len=e.seq_len,
                    decision=e.decision,
                    padded_batch=e.padded_batch,
                    padded_seq=e.padded_seq,
                    count=e.count,
                    host=host,
                )
                for e in events
            )

    def miss_summary(self, model: str | None = None) -> list[dict[str, Any]]:
        """Recorded misses summed per (model, workload, dtype, shape, decision), most frequent first."""
        columns = (
            ShapeMiss.model_name,
            ShapeMiss.workload,
            ShapeMiss.dtype,
            ShapeMiss.batch_size,
            ShapeMiss.seq_len,
            ShapeMiss.decision,
            ShapeMiss.padded_batch,
            ShapeMiss.padded_seq,
        )
        # not "count": a Row is a tuple, and tuple.count is a method
        total = func.sum(ShapeMiss.count).label("requests")
        query = select(*columns, total, func.max(ShapeMiss.recorded_at).label("last_seen")).group_by(*columns)
        if model is not None:
            query = query.where(ShapeMiss.model_name == model)
        with self.session() as session:
            result = session.execute(query.order_by(total.desc(), *columns)).all()
        return [
            {
                "model": r.model_name,
                "workload": r.workload,
                "dtype": r.dtype,
                "batch_size": r.batch_size,
                "seq_len": r.seq_len,
                "decision": r.decision,
                "padded_batch": r.padded_batch,
                "padded_seq": r.padded_seq,
                "count": int(r.requests),
                "last_seen": (
                    r.last_seen.replace(tzinfo=dt.UTC) if r.last_seen.tzinfo is None else r.last_seen
                ).isoformat(),
            }
            for r in result
        ]
