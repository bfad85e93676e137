"""``POST /v1/plan``: plan a manifest sent by a client without answering questions about the server's disk.

Planning fingerprints each model from its ``config.json``, which the service can
only read from its own disk. Every way that can fail (no such path, not a folder,
no ``config.json``, unreadable, ``/proc/self`` resolving to the server's PID) would
otherwise be a different answer, so a client could probe which server paths
exist. All of them are one answer that names the manifest entry, never the path
as the server resolved it nor why it failed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from warmcache.errors import UsageError
from warmcache.identity.plan import PlannedShape, plan_model
from warmcache.manifest import Manifest, ModelSpec
from warmcache.service.http import ApiError

NOT_CHECKED = (
    "model path not checked by the service (it plans only the models its own manifest names; "
    "run warmcache plan where the model is)"
)


def plan_request(
    manifest: Manifest,
    model_name: str | None,
    served: Collection[tuple[str, str | None]],
    checkpoint: Callable[[], None] | None = None,
) -> list[PlannedShape]:
    """Every shape the posted manifest declares (optionally for one model), or one 400 that says nothing about paths.

    Only a model whose ``(path, revision)`` is ``served`` (named by the service's own
    manifest) is read at all: any other folder, existing or not, gets the same 400 before
    the disk is touched. ``checkpoint`` is called every few milliseconds while planning
    and may raise to stop it."""
    try:
        models = [manifest.model(model_name)] if model_name else list(manifest.models)
    except UsageError as exc:
        raise ApiError(400, str(exc), "model") from None
    planned: list[PlannedShape] = []
    for model in models:
        if (model.path, model.revision) not in served:
            raise _not_checked(manifest, model)
        try:
            planned.extend(plan_model(model, checkpoint))
        except (UsageError, OSError):
            raise _not_checked(manifest, model) from None
    return planned


def _not_checked(manifest: Manifest, model: ModelSpec) -> ApiError:
    """The one answer for every model the service will not or cannot read, naming the manifest entry only."""
    index = manifest.models.index(model)
    return ApiError(400, f"model[{index}] {model.name!r}: {NOT_CHECKED}", f"model[{index}].path")
