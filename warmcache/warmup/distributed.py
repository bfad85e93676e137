"""Warm sharded models under torchrun: every rank compiles, rank 0 alone talks to the registry.

A model declared with ``distributed = { tp_size = …, fsdp_size = … }`` only
produces the graphs production runs when it is loaded the way production loads
it: by ``from_pretrained(distributed_config=DistributedConfig(...))`` in each of
``tp_size × fsdp_size`` processes started by torchrun. So warmcache does not
coordinate ranks itself; it runs under torchrun (re-executing itself with
``python -m torch.distributed.run`` when started outside one) and uses
``torch.distributed`` for the three things the ranks must agree on:

* which spec to run next: rank 0 claims it in the registry and broadcasts its
  identity (one claimant per group of ranks, so the fleet's leases stay per host),
  or ``WAITING`` on each poll while other hosts hold the rest, so no collective
  waits for another host's compile;
* whether it worked: a failure on any rank fails the spec on all of them, since a
  graph compiled on rank 0 alone is useless to a sharded deployment;
* who writes: only rank 0 records results, so a spec is never marked twice.

Coordination tensors are tiny CPU objects, so they always travel over a gloo
group, whatever backend (nccl, neuron) the model's own collectives use.

The agreement covers failures every rank reaches (a load or compile error, the
Trainer refusing a configuration). A rank that dies or raises *inside* one of the
model's collectives leaves the others blocked in it: torch.distributed cannot
recover that in-process, so torchrun tears the group down (or the collective
times out), rank 0's claim is given back or expires, and the spec is claimed again.

What holds on CPU (torch 2.13, transformers 5.24, gloo, 2 ranks): TP=2 loads sharded and ``generate()`` with a static
cache compiles one decode graph per rank (aot_eager, eager and Inductor) with the same tokens as one process; FSDP=2
generates too, in 5 graphs (FSDP hooks break the graph). A compiled TP training step recompiles once, on its second step
(transformers installs gradient hooks lazily on the first forward), then is stable. The ``Trainer`` refuses TP on CPU
(accelerate allows ParallelismConfig only with FSDP2, multi-device or DeepSpeed).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from warmcache.errors import UsageError, error_line
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.manifest import Manifest
from warmcache.warmup.child import CHILD_MODULE
from warmcache.warmup.summary import WarmupOptions, WarmupPlan, WarmupSummary

if TYPE_CHECKING:
    import torch.distributed as torch_dist

    from warmcache.warmup.worker import Worker

T = TypeVar("T")

#: What torchrun (and every launcher compatible with it) sets in each rank's environment.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
#: A rank waits this long for the others; sharded loading and first compiles are slow.
COLLECTIVE_TIMEOUT = dt.timedelta(hours=2)
#: Rank 0 broadcasts this on each poll while it waits for specs other hosts hold, so
#: the followers' collective never outlasts one poll (spec identities are hashes).
WAITING = "warmcache:waiting"


def in_torchrun() -> bool:
    """Whether this process is one rank of a torchrun (or compatible) launch."""
    return all(name in os.environ for name in TORCHRUN_ENV)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_registry_writer() -> bool:
    """Rank 0 claims, renews leases and records results; the other ranks only compile.

    Outside a torchrun every process writes, whatever ``RANK`` says: a Kubeflow
    PyTorchJob pod sets ``RANK`` and ``WORLD_SIZE`` (not ``LOCAL_RANK``) for jobs
    that never start a process group.
    """
    return not in_torchrun() or rank() == 0


def torchrun_command(argv: Sequence[str], nproc: int, module: str = "warmcache") -> list[str]:
    """The command that runs ``python -m MODULE ARGV`` as ``nproc`` ranks on this host.

    ``--standalone`` picks a free rendezvous port, so several warmups on one host
    (a fleet of processes) never fight over torchrun's default port 29500.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        module,
        *argv,
    ]


def child_command(nproc: int) -> list[str]:
    """The command of a warmcache child process (:mod:`warmcache.warmup.child`): one process, or ``nproc`` ranks
    under torchrun."""
    return [sys.executable, "-m", CHILD_MODULE] if nproc == 1 else torchrun_command([], nproc, module=CHILD_MODULE)


def for_this_launch(planned: Sequence[PlannedShape]) -> list[PlannedShape]:
    """Inside a torchrun of N ranks, the specs of models that need N ranks; outside, all of them.

    So ``torchrun --nproc_per_node=2 -m warmcache warmup M`` warms M's 2-rank
    models and nothing else, and its plan and exit code speak for those alone.
    """
    if not in_torchrun():
        return list(planned)
    return [p for p in planned if p.model.world_size == world_size()]


def split_by_world_size(todo: Sequence[PlannedShape]) -> tuple[list[PlannedShape], dict[int, list[PlannedShape]]]:
    """The specs this process warms itself, and those that need a torchrun of N ranks, by N.

    One ``warmcache warmup`` of a manifest mixing single-process and sharded
    models warms each model in the launch it needs.
    """
    here = world_size() if in_torchrun() else 1
    mine = [p for p in todo if p.model.world_size == here]
    others: dict[int, list[PlannedShape]] = {}
    for p in todo:
        if p.model.world_size != here:
            others.setdefault(p.model.world_size, []).append(p)
    return mine, others


@dataclass(frozen=True, slots=True)
class Coordination:
    """What the registry writer tells the other ranks around each claimed spec."""

    announce: Callable[[str | None], object]
    """Called with each claimed spec's identity before it runs."""
    agree: Callable[[str | None], str | None]
    """Called once per spec with this rank's error (or ``None``); returns the error of any rank."""
    wait: Callable[[], object]
    """Called on each poll while nothing is claimable but other hosts still hold specs.

    Waiting for another host's hour-long compile (or its lease to expire) can
    outlast ``COLLECTIVE_TIMEOUT``; a follower blocked in one broadcast all that
    time would time out and torchrun would tear a healthy group down.
    """


ALONE = Coordination(announce=lambda identity: None, agree=lambda error: error, wait=lambda: None)


def coordination() -> Coordination:
    """How the claim loop of this process coordinates: alone, or as rank 0 of a torchrun."""
    if not in_torchrun():
        return ALONE
    return Coordination(
        announce=broadcast_from_writer, agree=agree_on_failure, wait=functools.partial(broadcast_from_writer, WAITING)
    )


@contextmanager
def rank_group(manifest: Manifest, options: WarmupOptions) -> Iterator[bool]:
    """This process as one rank of a torchrun warmup's process group; yields whether it leads (rank 0).

    Rank 0 runs the normal runner inside the block and speaks for the group; the
    other ranks run :func:`follow` there and print nothing (see ``is_registry_writer``).
    When rank 0's block ends without an error it tells the followers it is done; the
    group is shut down either way.
    """
    models = [m for m in manifest.models if m.world_size == world_size()]
    if not models:
        raise UsageError(
            f"{manifest.path}: no model needs {world_size()} ranks; declare distributed = {{ tp_size "
            "= N } or run warmcache warmup without torchrun"
        )
    if options.jobs > 1:
        raise UsageError("--jobs does not combine with torchrun: each rank group warms one spec at a time")
    devices = sorted({m.device for m in models})
    if len(devices) > 1:
        raise UsageError(
            f"{manifest.path}: the {world_size()}-rank models use several devices "
            f"({', '.join(devices)}); warm them in separate manifests"
        )
    init_process_group(devices[0])
    try:
        leads = is_registry_writer()
        yield leads
        if leads:
            broadcast_from_writer(None)  # done: the followers leave their loop
    finally:
        shutdown()


def follow(manifest: Manifest, options: WarmupOptions) -> WarmupSummary:
    """A follower rank's part of the warmup: run what rank 0 announces; its summary is empty (rank 0's is the
    group's)."""
    from warmcache.warmup.worker import Worker

    follow_writer(Worker(manifest, options.cache_dir), for_this_launch(plan_manifest(manifest)))
    return WarmupSummary(WarmupPlan([], options.retry_failed), options.dry_run)


def follow_writer(worker: Worker, planned: Sequence[PlannedShape]) -> None:
    """A non-zero rank: run each spec rank 0 announces, report success or error, until rank 0 says done.

    No registry access and no per-spec file lock: rank 0 holds the lock, and a
    rank waiting on it would deadlock the group's collectives. ``WAITING`` means
    rank 0 is still polling for specs other hosts hold: just listen again.
    """
    by_identity = {p.identity: p for p in planned}
    while (identity := broadcast_from_writer(None)) is not None:
        if identity == WAITING:
            continue
        error: str | None = None
        try:
            spec = by_identity.get(identity)
            if spec is None:
                raise UsageError(
                    f"rank {rank()} does not plan spec {identity}: do all ranks read the same manifest with "
                    "the same toolchain?"
                )
            worker.run(spec)
        except Exception as exc:
            error = error_line(exc)
        agree_on_failure(error)


def init_process_group(device: str) -> None:
    """Join the torchrun job as ``from_pretrained(distributed_config=...)`` would (gloo on CPU).

    Done by warmcache before any model is loaded, because rank 0 broadcasts the
    first claim before anything else happens. On accelerators the job is joined
    by transformers' own routine, so each rank binds its device exactly as in
    production.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device == "cpu":
        dist.init_process_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
        return
    from transformers.distributed.utils import _ensure_torch_distributed

    _ensure_torch_distributed(device)


@functools.cache
def _control_group() -> torch_dist.ProcessGroup | None:
    """A gloo group for coordination objects (``None``: the default group already is gloo)."""
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)


def broadcast_from_writer(value: T) -> T:
    """Every rank gets rank 0's ``value`` (e.g. the identity of the spec rank 0 claimed, or ``None``: done)."""
    import torch.distributed as dist

    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0, group=_control_group())
    return box[0]


def gather_from_ranks(value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank (a collective: all ranks must call it)."""
    import torch.distributed as dist

    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value, group=_control_group())
    return values


def agree_on_failure(local_error: str | None) -> str | None:
    """``None`` if every rank succeeded, else the first failing rank's error, the same on all ranks.

    Every rank must call this once per spec, success or not: it is a collective.
    """
    errors = gather_from_ranks(local_error)
    for index, error in enumerate(errors):
        if error is not None:
            return error if len(errors) == 1 else f"rank {index}: {error}"
    return None


def shutdown() -> None:
    """Leave the process group cleanly (torch warns when a rank exits without it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _control_group.cache_clear()  # its group died with the process group
