"""What the agreement criterion reads off a model: its depth and width (the floor grows with them) and the
end-of-sequence ids a decode to the cache's end may not pick."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from warmcache.modeling.generation import special_token_ids

if TYPE_CHECKING:
    import torch


class ModelSize(NamedTuple):
    """What the criterion's floor grows with (:func:`.agreement.floor`)."""

    depth: int
    """Decoder layers."""
    width: int
    """Hidden size."""


def model_size(model: torch.nn.Module) -> ModelSize:
    """The model's text config's depth and width, each 1 where it does not say."""
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: config)()
    return ModelSize(int(getattr(text, "num_hidden_layers", 1) or 1), int(getattr(text, "hidden_size", 1) or 1))


def eos_token_ids(model: torch.nn.Module) -> list[int]:
    """The end-of-sequence ids a decode with ``min_new_tokens`` to the cache's end may not pick, whatever they score."""
    return sorted(special_token_ids(model, ("eos_token_id",)))
