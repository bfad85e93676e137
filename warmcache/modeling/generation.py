"""How warmcache calls ``generate()``: one definition shared by warmup and the runtime guard.

The decode graph ``generate()`` compiles depends on the effective batch, the
static cache length and the generation settings, so warmup and production must
build the call the same way or production meets a graph warmup never compiled.
Measured on CPU (tiny Qwen3, aot_eager, static cache pinned at 32): prompt
lengths 8 and 16 and left-padded masks shared one decode graph per batch size;
a prompt + max_new_tokens - 1 beyond the pinned length grew the cache and
compiled a new graph. Hence :func:`max_new_tokens_that_fit`.

The static cache is warmcache's :class:`warmcache.modeling.kv_cache.PositionTensorCache`,
handed to generate() as a fresh ``cache=`` object per call (generate() also builds
a fresh static cache per call): transformers' own keeps sliding-window positions
in a Python int and recompiles the decode step at every position.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import CompileConfig, PretrainedConfig

    from warmcache.shapes.workload_settings import GenerateSettings


@functools.cache
def compile_config(backend: str, mode: str, device: str) -> CompileConfig:
    """The ``CompileConfig`` generate() compiles its decode step with: one object per target.

    transformers re-wraps its forward in a new ``torch.compile`` whenever the config
    differs from the last call's, which would retrace every shape; handing warmup and
    the guard the same object per target rules that out.

    ``dynamic=False`` everywhere: a bucketed deployment wants one static graph per
    shape (and Neuron has no dynamic shapes). On CPU, ``_compile_all_devices`` is
    how transformers is told to auto-compile at all.
    """
    from transformers import CompileConfig

    config = CompileConfig(
        backend=backend,
        dynamic=False,
        fullgraph=False,
        # Inductor modes only mean something to Inductor; other backends reject them.
        # transformers annotates ``mode: str`` but hands it to torch.compile, which takes None.
        mode=mode if backend == "inductor" else None,  # type: ignore[arg-type]
    )
    if device == "cpu":
        config._compile_all_devices = True  # type: ignore[assignment]  # a private flag transformers declares as None
    return config


#: New tokens of the calls that load a bucket (warmup, verify, prime): the prefill's token and two decode steps. The
#: first decode call may differ from steady state (cache initialisation; RecurrentGemma's conv state is laid out by
#: its prefill, then by its decode), the second must be the steady graph. Every later step, up to a full cache, must
#: compile nothing.
DECODE_TOKENS = 3


def max_new_tokens_that_fit(prompt_len: int, max_cache_len: int) -> int:
    """The most new tokens a prompt of ``prompt_len`` can generate inside the compiled cache.

    generate() sizes a static cache to ``prompt + max_new_tokens - 1``; past
    ``max_cache_len`` the cache grows and the decode step recompiles.
    """
    return max_cache_len - prompt_len + 1


def prompt_fits(prompt_len: int, max_cache_len: int) -> bool:
    """Whether a prompt of ``prompt_len`` is a bucket of a ``max_cache_len`` family: the prompt plus one new token fit.

    Prefill yields the first new token, so a bucket needs room for a second: that one runs the
    compiled decode step warmup exists to compile. The manifest and ``buckets suggest`` both ask this.
    """
    return max_new_tokens_that_fit(prompt_len, max_cache_len) >= 2


def generate_kwargs(
    settings: GenerateSettings, *, max_new_tokens: int, config: CompileConfig, model_config: PretrainedConfig
) -> dict[str, Any]:
    """Keyword arguments for ``model.generate`` that reproduce a compiled family's graphs.

    Build them per call: a ``static`` family gets a fresh cache object, which one
    generate() call fills.
    """
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": settings.do_sample,
        "num_beams": settings.num_beams,
        "num_return_sequences": settings.num_return_sequences,
        "compile_config": config,
    }
    # Every declared cache implementation ("static", and "hybrid", transformers' deprecated alias
    # of it) is served by warmcache's position-tensor cache.
    from warmcache.modeling.kv_cache import PositionTensorCache

    kwargs["cache"] = PositionTensorCache(model_config, settings.max_cache_len)
    # A checkpoint's generation_config may name its own (e.g. Gemma's "hybrid"); generate()
    # refuses a cache object next to one.
    kwargs["cache_implementation"] = None
    if settings.prefill_chunk_size:
        kwargs["prefill_chunk_size"] = settings.prefill_chunk_size
    return kwargs


def special_token_ids(model: Any, names: tuple[str, ...]) -> set[int]:
    """The ids ``names`` hold in the model's config and generation config: each one id, a list of them, or unset.

    A published config may list several (Gemma 3's ``eos_token_id`` is ``[1, 106]``).
    """
    ids: set[int] = set()
    for source in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        for name in names:
            value = getattr(source, name, None)
            ids.update([value] if isinstance(value, int) else [v for v in value or () if isinstance(v, int)])
    return ids
