"""The decode call a route saves: captured from warmup's real ``generate()``, as production will make it.

``generate()`` gets its decode callable from ``model.get_compiled_call(config)``
and calls it with exactly ``input_ids``, ``cache`` (the ``StaticCache``),
``position_ids``, ``attention_mask`` (a dict of prebuilt masks),
``logits_to_keep``, ``use_cache`` and ``return_dict``. Warmup captures those
arguments during its real ``generate()`` (:func:`capture_decode_call`) and every
route saves the same call (:class:`warmcache.artifacts.route.PrecompiledRoute`);
verify captures it again to export the model it is given
(:meth:`warmcache.artifacts.aotinductor.AotInductorRoute.prove`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@contextlib.contextmanager
def capture_decode_call(model: PreTrainedModel, *, eager: bool = False) -> Iterator[dict[str, Any]]:
    """While inside, remember the keyword arguments of the first one-token call generate() makes to its compiled
    forward.

    ``eager``: serve that call with the model's own forward instead of compiling it
    (an AOTInductor model's reference path: its production never runs ``torch.compile``).
    """
    captured: dict[str, Any] = {}
    original = model.get_compiled_call

    def spying_get_compiled_call(compile_config: Any) -> Any:
        compiled = model.__call__ if eager else original(compile_config)

        def call(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("input_ids")
            if not captured and ids is not None and ids.shape[-1] == 1:
                captured.update(kwargs)
            return compiled(*args, **kwargs)

        return call

    model.get_compiled_call = spying_get_compiled_call  # type: ignore[method-assign]
    try:
        yield captured
    finally:
        del model.get_compiled_call  # the instance attribute; the class method shows through again
