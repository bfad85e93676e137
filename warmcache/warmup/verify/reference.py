"""The reference a served decode is judged against: the model's logits over the served tokens in one forward pass of a
copy of the model at higher precision, and the same with the experts swapped at a mixture of experts' router near-ties.

Apart from :mod:`.agreement` (the judging) because building the reference is its own job: a
copy in another dtype made without a second copy in the model's own (an AOTInductor package
binds the model's own tensors), and forwards the judge may ask for again per routing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from warmcache.warmup.verify.routing import RoutedReference

if TYPE_CHECKING:
    import torch

#: The dtype the reference is computed in, for each dtype a model may run in.
REFERENCE_DTYPE = {"float32": "float64", "float16": "float32", "bfloat16": "float32"}


def reference_logits(
    model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generated: torch.Tensor
) -> torch.Tensor:
    """The model's logits for each generated position, in one forward pass at higher precision (a copy of the model
    in :data:`REFERENCE_DTYPE`): ``[rows, steps, vocab]`` in float64.

    Over the prompt and the generated tokens (all but the last, whose successor nobody
    asked for), positions counted from each row's first unpadded token as ``generate()``
    counts them, so a left-padded row sees what it saw while decoding.
    """
    return _reference_forward(precise_copy(model), prompt_ids, prompt_mask, generated)()


def routed_reference(
    model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generated: torch.Tensor
) -> RoutedReference:
    """:func:`reference_logits` (its ``logits``) and, from the same copy and forward, the references with the experts
    swapped at each router near-tie (its ``alternatives(tolerance)``; :mod:`.routing`)."""
    precise = precise_copy(model)
    rows, steps = generated.shape
    forward = _reference_forward(precise, prompt_ids, prompt_mask, generated)
    return RoutedReference(precise, forward, rows, prompt_ids.shape[1], steps)


def precise_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in its :data:`REFERENCE_DTYPE`."""
    import torch

    return _upcast_copy(model, getattr(torch, REFERENCE_DTYPE[str(model.dtype).removeprefix("torch.")]))


def _reference_forward(
    precise: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generated: torch.Tensor
) -> Callable[[], torch.Tensor]:
    """One forward of ``precise`` over the prompt and the generated tokens: ``[rows, steps, vocab]`` in float64."""
    import torch

    steps = generated.shape[1]
    ids = torch.cat([prompt_ids, generated[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(generated[:, :-1].shape)], dim=1)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)

    def forward() -> torch.Tensor:
        with torch.no_grad(), _padding_zeroed(precise, mask), precise_defaults(precise):
            out = precise(
                input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=steps, use_cache=False
            )
        return out.logits.double()

    return forward


@contextlib.contextmanager
def precise_defaults(precise: torch.nn.Module) -> Iterator[None]:
    """While inside, the dtype of ``precise`` (a :func:`precise_copy`) is torch's default dtype: what a forward of the
    copy runs under (floating tensors its code makes without a dtype are made in it).

    Modeling code that makes a tensor without a dtype gets the default's, float32, beside
    a float64 copy's: transformers' XGLM clamps its scores with ``torch.full((),
    torch.finfo(scores.dtype).min)``, and float64's minimum does not fit a float32 tensor
    ("value cannot be converted to type float without overflow"), so no masked forward of
    a float64 XGLM ran (neither verify's reference nor its cache proof). Measured: a
    float32 XGLM's verify failed with that error at every bucket; under this it passes.
    """
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(cast(torch.dtype, precise.dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _padding_zeroed(precise: torch.nn.Module, mask: torch.Tensor) -> Iterator[None]:
    """While inside, each decoder layer's output is zero at the positions ``mask`` pads.

    A left-padded position sees only padding, and in float64 its attention row is all
    ``-inf``: transformers' eager attention (Gemma 2's, for its softcapping) softmaxes in
    float32, where float64's mask minimum overflows, so the row is NaN, and at the next layer
    its value vector, weighted 0 by every real position, still makes theirs NaN (0 x NaN).
    Nothing at a padded position reaches a real one otherwise (attention masks it, and
    recurrent layers zero it themselves), so zeroing it changes no real logit. Measured:
    gemma-2-2b's float64 reference was NaN for every step of a left-padded row.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    pads = (mask == 0)[..., None]
    if not bool(pads.any()):
        yield
        return

    def zero_padding(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        hidden.masked_fill_(pads, 0)

    layers = [m for m in precise.modules() if isinstance(m, GradientCheckpointingLayer)]
    handles = [layer.register_forward_hook(zero_padding) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _upcast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``model`` whose floating parameters and buffers are ``dtype``, made without a copy in the model's
    own dtype first.

    A copy, never the model converted and back: an AOTInductor package binds the
    model's own parameter tensors, and a buffer the model keeps in float32 (rotary
    ``inv_freq`` in a bfloat16 model) would come back bfloat16. Compiled calls installed
    on the instance stay with the model. Tied weights stay tied (one memo entry).
    """
    import copy

    import torch

    def upcast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(dtype) if tensor.is_floating_point() else tensor.detach().clone()

    memo: dict[int, Any] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = torch.nn.Parameter(upcast(parameter), requires_grad=False)
    for buffer in model.buffers():
        memo[id(buffer)] = upcast(buffer)
    installed = {key: model.__dict__.pop(key) for key in ("get_compiled_call",) if key in model.__dict__}
    try:
        precise = copy.deepcopy(model, memo)
    finally:
        model.__dict__.update(installed)
    precise.config.dtype = dtype
    if dtype == torch.float64 and getattr(precise.config, "_experts_implementation", "eager") not in (None, "eager"):
        # torch._grouped_mm (transformers' default experts kernel) takes no float64; the reference is one eager pass,
        # so the per-expert loop, the same sums, serves it.
        cast(Any, precise).set_experts_implementation("eager")
    return precise
