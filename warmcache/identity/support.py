"""Which declared models warmcache can serve from compiled graphs, decided from their config at plan time.

A model warmcache cannot compile once per bucket must be refused when the
manifest is planned or warmed, with the reason, not discovered by a request
in production. What is checked, from the config alone (no weights are read):

* generate: every decoder layer is one :class:`warmcache.modeling.kv_cache.PositionTensorCache`
  can hold: full or sliding-window attention, fixed-size recurrent state (``conv``,
  ``linear_attention``: LFM2, Granite-4.0-H, Bamba, Qwen3-Next), both side by side
  (``hybrid``: Falcon-H1), or no cache at all; chunked, indexed, sliding-hybrid and other
  layer kinds keep state it does not model. The model class must take a ``Cache`` object
  at all (pure Mamba models keep their own cache class and do not), and its code must
  decode one token from that cache in one graph per shape (:mod:`warmcache.identity.model_code`).
* both workloads: transformers maps the config to a causal-LM class (warmup loads
  it with ``AutoModelForCausalLM``).

The architectures checked end to end are in docs/measurements/architectures.md's support table
(``tests/support/warmcache_testkit/support_matrix.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from warmcache.errors import ManifestError
from warmcache.identity.model_code import code_problems
from warmcache.manifest import Manifest, ModelSpec


def model_problems(model: ModelSpec) -> list[str]:
    """Why ``model``'s declared workloads cannot be served from compiled graphs (empty: they can)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from warmcache.modeling.kv_cache import unsupported_layer_kinds

    where = f"model {model.name!r} ({model.path})"
    try:
        config: Any = AutoConfig.from_pretrained(model.path, revision=model.revision)
    except (
        Exception
    ) as exc:  # the config is input: transformers' own checks raise anything (ZeroDivisionError for 0 heads)
        return [
            f"{where}: transformers cannot read its config: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        ]
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:  # a key lookup: imports no modeling code
        return [
            f"{where}: {config.model_type!r} has no causal-LM class in transformers "
            "(AutoModelForCausalLM cannot load it)"
        ]
    problems: list[str] = []
    if model.generate:
        kinds = unsupported_layer_kinds(config)
        if kinds:
            problems.append(
                f"{where}: generate: layer kind(s) {', '.join(kinds)} keep state warmcache's static cache "
                "does not hold (supported: full and sliding-window attention, conv and linear-attention/SSM "
                "state, and hybrid layers of full attention beside that state)"
            )
        else:
            model_class: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
            if not model_class._supports_default_dynamic_cache():
                problems.append(
                    f"{where}: generate: {model_class.__name__} takes no Cache object, so its decode step "
                    "cannot run on a static cache"
                )
            else:
                generation_config = _generation_config(model, config)
                problems += [
                    f"{where}: generate: {problem}"
                    for problem in code_problems(
                        config, model_class, generation_config, max(g.settings.max_cache_len for g in model.generate)
                    )
                ]
    return problems


def _generation_config(model: ModelSpec, config: Any) -> Any:
    """The generation config ``from_pretrained`` gives the model: its generation_config.json, else one derived from
    the model config."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model.path, revision=model.revision or "main")
    except OSError:  # no generation_config.json: transformers derives it from config.json
        return GenerationConfig.from_model_config(config)


def check_supported(manifest: Manifest, models: Iterable[ModelSpec] | None = None) -> None:
    """Raise :class:`ManifestError` naming every declared model (or every one of ``models``) that cannot be served,
    and why."""
    problems = [
        f"{manifest.path}: {problem}"
        for model in (manifest.models if models is None else models)
        for problem in model_problems(model)
    ]
    if problems:
        raise ManifestError(problems)
