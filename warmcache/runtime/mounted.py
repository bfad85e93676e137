"""Serve a model from a mounted cache with no modeling code: the one call a pod's start makes.

    served = serve_from_mount("/cache", "qwen3", trust=["/keys/warmcache.pub"], weights="/models/qwen3")
    out = served.generate(input_ids, attention_mask=mask, max_new_tokens=32)

The mount is a signed guard snapshot beside its cache entries (``warmcache guard export``).
A start reads and checks the snapshot (signature, this machine's toolchain), maps the
checkpoint's weights (:mod:`warmcache.runtime.mapped_weights`), then loads every bucket's
packaged prefill and decode step, each checked (sha256 against the signed row, fingerprint,
device, CPU capability, every constant's shape and dtype) and bound to the mapped weights.
Requests are fitted to a bucket by the guard (padding, refusals, its telemetry) and run by
:mod:`warmcache.runtime.decode_loop`. Nothing imports transformers, the model's code, the
compiler or the registry's database layer: the start is ``import torch``, the checks, and
the packages' loads.

A snapshot whose buckets lack a packaged prefill (warmed with ``package_prefill = false``,
before prefills were packaged, or a model whose decode takes recurrent state) is refused with one line: serve it with
``ShapeGuard.generate`` over a transformers model, which keeps ``generate()``'s whole surface.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.artifacts.aoti_loader import PackagedDecodeStep, TensorsFor, load_bound
from warmcache.artifacts.aotinductor import AOTINDUCTOR
from warmcache.artifacts.package_steps import DECODE_STEP, PREFILL_STEP
from warmcache.artifacts.route import expected_fingerprint
from warmcache.errors import CacheError, UnseenShapeError, UsageError
from warmcache.runtime.decode_loop import PackagedSteps, Sampling, TokenCallback
from warmcache.runtime.guard import ShapeGuard
from warmcache.runtime.mapped_weights import MappedCheckpoint

if TYPE_CHECKING:
    import torch

    from warmcache.registry.records import ShapeRecord
    from warmcache.runtime.guarded import Policy
    from warmcache.trust import TrustedKeys


@dataclass(frozen=True)
class TokenDefaults:
    """The checkpoint's stop and padding tokens, read from its ``generation_config.json`` and ``config.json``."""

    stop_ids: frozenset[int]
    pad_token_id: int

    @classmethod
    def read(cls, folder: Path) -> TokenDefaults:
        sources = [
            json.loads(p.read_text())
            for p in (folder / "generation_config.json", folder / "config.json")
            if p.is_file()
        ]

        def first(name: str) -> Any:
            return next((s[name] for s in sources if s.get(name) is not None), None)

        eos = first("eos_token_id")
        stop = frozenset([eos] if isinstance(eos, int) else [int(i) for i in eos or ()])
        pad = first("pad_token_id")
        return cls(stop, int(pad) if pad is not None else 0)


@dataclass
class MountedModel:
    """A model served from its packages: the guard's buckets, each with its prefill and decode step."""

    guard: ShapeGuard
    checkpoint: MappedCheckpoint
    tokens: TokenDefaults
    steps: dict[tuple[int, int], PackagedSteps] = field(default_factory=dict)
    #: Seconds the checkpoint's mapping, and the packages' checks, loads and binding took.
    map_seconds: float = 0.0
    load_seconds: float = 0.0

    def servable(self) -> str | None:
        """Why the snapshot's buckets cannot be served from the mount alone (one line), or ``None``: every bucket must
        have AOTInductor packages (Neuron and the Inductor cache need the model's code, see ``ShapeGuard.prime``)."""
        records = self.guard.records
        if records and all(AOTINDUCTOR.entries(r) for r in records):
            return None
        return (
            f"{self.guard.source}: {self.guard.family.describe()} has buckets without AOTInductor packages; a start "
            'from the mount needs precompile = "aotinductor" (serve others with ShapeGuard.generate)'
        )

    @property
    def ready(self) -> bool:
        """Every bucket's packages are loaded and bound."""
        return bool(self.steps) and set(self.steps) == set(self.guard.buckets)

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int | None = None,
        sampling: Sampling | None = None,
        stop_token_ids: Sequence[int] | None = None,
        on_token: TokenCallback | None = None,
    ) -> torch.Tensor:
        """``(batch, length + new)`` tokens, as ``ShapeGuard.generate`` returns them: the request fitted to a bucket
        (left padding, dummy rows, refusals by the guard's policy), generated, and the padding taken off again.

        :param input_ids: the prompts, ``(batch, length)``.
        :param attention_mask: which prompt tokens are real (default: all of them).
        :param max_new_tokens: how many tokens to generate at most (default: as many as the bucket's cache holds).
        :param sampling: greedy or sampled decoding (default: the snapshot's ``do_sample``).
        :param stop_token_ids: a row stops at any of these (default: the checkpoint's ``eos_token_id``).
        :param on_token: called with each step's ``(batch,)`` tokens of the bucket's rows (dummy rows included:
            slice ``[:batch]``).
        :raises UnseenShapeError: the request fits no bucket the mount has packages for.
        """
        from warmcache.runtime.padding import fit_generate_inputs
        from warmcache.runtime.serving import fit_max_new_tokens

        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        fitted = fit_generate_inputs(self.guard, inputs, self.tokens.pad_token_id)
        shape = fitted.shape
        steps = self.steps.get(shape)
        if steps is None:  # policy warn let an unseen shape through: nothing here can compile it
            raise UnseenShapeError(self.guard.unseen_message(fitted.decision, "has no packages to serve it"))
        max_cache_len = self.guard.family.generate.max_cache_len
        new = fit_max_new_tokens(self.guard, fitted, max_new_tokens, max_cache_len)
        stops = frozenset(stop_token_ids) if stop_token_ids is not None else self.tokens.stop_ids
        out = steps.generate(
            fitted.inputs["input_ids"],
            fitted.inputs["attention_mask"],
            new,
            stop_ids=stops,
            pad_token_id=self.tokens.pad_token_id,
            sampling=sampling or Sampling(do_sample=self.guard.family.generate.do_sample),
            on_token=on_token,
        )
        return fitted.unpad(out)

    def load(self, device: str = "cpu") -> None:
        """Check, load and bind every bucket's prefill and decode packages; a refusal raises before any is served.

        :param device: where the packages run (``cpu``, or ``cuda`` for packages built for it).
        """
        start = time.perf_counter()
        trust = self.guard.artifact_trust
        records = self.guard.records
        unservable = self.servable()
        if unservable:
            raise CacheError(unservable)
        _refuse_unservable(self.guard, records)
        trust.require_trusted_rows()
        loaded: dict[str, PackagedDecodeStep] = {}
        for record in records:
            root = trust.root(record, None)
            if root is None:
                raise CacheError(f"row {record.identity}: its packages have no cache folder in the snapshot")
            for entry in AOTINDUCTOR.entries(record):
                trust.confined(root, entry, AOTINDUCTOR)
            by_step = load_steps(root, record, self._bind, device, loaded)
            if PREFILL_STEP not in by_step or DECODE_STEP not in by_step:
                raise CacheError(
                    f"{self.guard.source}: bucket batch={record.batch_size} seq={record.seq_len} has no packaged "
                    f"{PREFILL_STEP if DECODE_STEP in by_step else DECODE_STEP} (warmed with package_prefill = "
                    "false, by an earlier warmcache, or a model whose decode needs its own code); warm it again, or "
                    "serve it with ShapeGuard.generate"
                )
            self.steps[(record.batch_size, record.seq_len)] = PackagedSteps(by_step[PREFILL_STEP], by_step[DECODE_STEP])
        self.guard.primed = True
        self.load_seconds = time.perf_counter() - start

    def _bind(self, package: Path, info: dict[str, Any]) -> dict[str, Any]:
        return self.checkpoint.bind(package, info, str(info.get("device", "cpu")))


def load_steps(
    root: Path, record: ShapeRecord, bind: TensorsFor, device: str, loaded: dict[str, PackagedDecodeStep]
) -> dict[str, PackagedDecodeStep]:
    """The row's packages by the step each computes, checked, loaded and bound (``loaded``: by entry, shared between
    rows: a batch's decode package serves every prompt length)."""
    by_step: dict[str, PackagedDecodeStep] = {}
    for entry in AOTINDUCTOR.entries(record):
        if entry not in loaded:
            steps = (DECODE_STEP, PREFILL_STEP)
            _, step = load_bound(root, entry, expected_fingerprint(record), bind, device, steps)
            assert step is not None  # every step was asked for
            loaded[entry] = step
        by_step[loaded[entry].step] = loaded[entry]
    return by_step


def bind_package_steps(
    root: Path, record: ShapeRecord, tensors: dict[str, torch.Tensor], device: str
) -> tuple[PackagedDecodeStep, PackagedDecodeStep] | None:
    """The row's packaged prefill and decode step bound to ``tensors`` (a state dict) as a mounted start binds the
    checkpoint's, by the names the headers record; ``None`` when the row has no packaged prefill (verify proves it)."""
    checkpoint = MappedCheckpoint(root, tensors)
    by_step = load_steps(root, record, lambda package, info: checkpoint.bind(package, info, device), device, {})
    if PREFILL_STEP not in by_step or DECODE_STEP not in by_step:
        return None
    return by_step[PREFILL_STEP], by_step[DECODE_STEP]


def _refuse_unservable(guard: ShapeGuard, records: list[ShapeRecord]) -> None:
    """One line for packaged rows this path cannot serve: rows of several model configs, beams, several sequences."""
    configs = sorted({r.config_hash for r in records})
    if len(configs) > 1:
        raise UsageError(
            f"{guard.source}: rows of {len(configs)} model configs ({', '.join(configs)}) for {guard.model_name!r}; "
            "a start from the mount serves one"
        )
    family = guard.family.generate
    if family.num_beams != 1 or family.num_return_sequences != 1:
        raise UsageError(
            f"{guard.source}: {guard.family.describe()} decodes with num_beams={family.num_beams}, "
            f"num_return_sequences={family.num_return_sequences}; a start from the mount decodes one sequence per row"
        )


def serve_from_mount(
    mount: str | Path,
    model_name: str,
    *,
    weights: str | Path,
    trust: TrustedKeys | Sequence[str] | str | None = None,
    allow_unsigned: bool = False,
    policy: Policy = "pad",
    load: bool = True,
) -> MountedModel:
    """Start serving ``model_name`` from ``mount`` (a signed snapshot folder) with the checkpoint in ``weights``.

    The snapshot's signature (``trust``, as :meth:`ShapeGuard.from_snapshot` takes it) and toolchain are checked
    first, then the checkpoint is mapped and, with ``load`` (default), every bucket's packages are loaded
    (:meth:`MountedModel.load`; call it yourself to answer health checks meanwhile). Every refusal is one line
    (a :class:`~warmcache.errors.WarmcacheError`) before anything is served.

    :param mount: the snapshot folder (``warmcache-guard.json`` beside its cache entries), e.g. an image volume.
    :param model_name: the model of the snapshot to serve.
    :param weights: the checkpoint folder (safetensors, ``config.json``, ``generation_config.json``); mapped, not
        copied.
    :param trust: the keys the snapshot must be signed by (keys or ``.pub`` files; default
        ``$WARMCACHE_TRUSTED_KEYS``).
    :param allow_unsigned: load the packages of a snapshot no trusted key signed (only without keys).
    :param policy: what a request no bucket holds exactly gets: ``pad``, ``refuse`` or ``warn``.
    :param load: load every bucket's packages before returning.
    :returns: the served model; its :meth:`~MountedModel.generate` answers requests.
    """
    guard = ShapeGuard.from_snapshot(
        mount, model_name, trust=trust, allow_unsigned=allow_unsigned, telemetry_url=None, policy=policy
    )
    folder = Path(weights)
    start = time.perf_counter()
    checkpoint = MappedCheckpoint.open(folder)
    served = MountedModel(guard, checkpoint, TokenDefaults.read(folder), map_seconds=time.perf_counter() - start)
    if load:
        served.load()
    return served
