"""What a model's own code asks of its decode step that one compiled graph per bucket on a static cache cannot give.

The layer kinds a config declares (:mod:`warmcache.identity.support`) do not tell
everything: some families' Python code decides at every step what the graph is.
Found by the family sweep (docs/measurements/architectures.md), each of these
compiled at warmup and then failed there with an ``IndexError`` or a new graph per
step; asked here of the model's config and code, before anything compiles:

* a tensor's values read as Python numbers (``.tolist()``, ``.item()``) in a module's
  ``forward``: torch.compile specialises the graph on them, so every step whose values
  differ compiles again (JetMoE's expert split sizes). A forward transformers dispatches to
  an experts kernel (``use_experts_implementation``) is not the module's own code and is
  not read;
* a forward that adds layers to the cache object it is handed (``cache.layers += ...``:
  Dory's looped layers keep a copy per loop), which writes past a cache sized one layer
  per decoder layer;
* a forward that wraps the cache it is handed in a cache object of its own
  (``EncoderDecoderCache(cache, DynamicCache(...))``: BLT's local decoder writes its keys
  into the second, dynamic one while its mask is built from the static one), unless a
  config flag that is off here guards the wrapping (GPT-2's ``add_cross_attention``);
* ``use_cache`` off in the generation config (MPT's default): generate() then feeds the
  whole sequence at every step and writes it into the cache again;
* no attention layer at all while the model asks the cache for its length
  (``get_seq_length``), which transformers' cache answers only from an attention layer;
* GPT-Neo's ``local`` layers, whose window follows the number of cached keys (a static
  cache's length) rather than the position, past a ``max_cache_len`` beyond the window.

The model is built on the meta device (no memory, no weights) to learn which module
classes it instantiates, so a multimodal module's vision code does not count against
its text decoder. Helper methods a forward calls are not read: the check names what
the sweep found, and warmup's per-shape compile count stands behind it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from typing import Any

#: Tensor methods that turn values into Python numbers the compiled graph specialises on.
VALUE_READS = frozenset({"tolist", "item"})
#: Layer kinds that keep attention keys: the kinds transformers' ``Cache.get_seq_length`` reads.
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "hybrid"})


def code_problems(config: Any, model_class: Any, generation_config: Any, max_cache_len: int) -> list[str]:
    """Why ``model_class``'s decode step, built from ``config``, cannot be one static graph per bucket (empty: it
    can). ``generation_config`` is the one generate() will use; ``max_cache_len`` the largest declared."""
    from warmcache.modeling.kv_cache import get_layer_types_and_kwargs

    problems = []
    window = _window_placed_by_key_count(config)
    if window is not None and max_cache_len > window:
        problems.append(
            f"its 'local' attention layers (GPT-Neo's) place their {window}-token window by the number of keys "
            "the cache returns, which a static cache (transformers' own too) makes max_cache_len, not the position; "
            f"max_cache_len {max_cache_len} > window_size {window} would attend outside the window (keep "
            f"max_cache_len <= {window})"
        )
    if generation_config.use_cache is False:  # None (a config without the key) is generate()'s default: on
        problems.append(
            "use_cache is false in its generation config (the model config's default when there is no "
            "generation_config.json), so generate() feeds the whole sequence at every step instead of one token "
            'from the cache; set "use_cache": true in config.json or generation_config.json'
        )
    try:
        classes = _module_classes(config, model_class)
    except Exception as exc:  # noqa: BLE001 - the config is input: transformers' own checks raise anything
        return [
            *problems,
            f"transformers cannot build {model_class.__name__} from it: {type(exc).__name__}: {_one_line(exc)}",
        ]
    forwards = dict(_forward_trees(classes))
    reads = sorted(f"{name} ({call})" for name, tree in forwards.items() for call in _value_reads(tree))
    if reads:
        problems.append(
            f"{', '.join(reads)} reads tensor values as Python numbers in its forward, so torch.compile would "
            "compile a new graph whenever they change (every decode step)"
        )
    growers = sorted(name for name, tree in forwards.items() if _grows_cache_layers(tree))
    if growers:
        problems.append(
            f"{', '.join(growers)}.forward adds layers to the cache object it is given (per-loop copies), past "
            "the one layer per decoder layer warmcache's static cache holds"
        )
    wrappers = sorted(name for name, tree in forwards.items() if _wraps_given_cache(tree, config))
    if wrappers:
        problems.append(
            f"{', '.join(wrappers)}.forward wraps the cache it is given in a cache object of its own, whose "
            "keys live outside warmcache's static cache (transformers' own static cache fails the same way)"
        )
    kinds, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    askers = sorted(name for name, tree in forwards.items() if _calls(tree, "get_seq_length"))
    if askers and not ATTENTION_KINDS.intersection(kinds):
        problems.append(
            f"no layer keeps attention (layer kinds: {', '.join(sorted(set(kinds)))}) but {askers[0]}.forward asks "
            "the cache for its length, which transformers' cache answers only from an attention layer"
        )
    return problems


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _window_placed_by_key_count(config: Any) -> int | None:
    """GPT-Neo's local window: its attention masks with rows of a fixed ``bias`` buffer sliced at
    ``key_length - query_length``, so the window follows the number of keys, not the token's position (on a dynamic
    cache the two are the same). A config property, named: the window is in the family's own attention code, which
    no layer kind of transformers' cache API reports."""
    text = config.get_text_config(decoder=True)
    if "local" in (getattr(text, "attention_layers", None) or ()) and isinstance(
        getattr(text, "window_size", None), int
    ):
        return int(text.window_size)
    return None


def _module_classes(config: Any, model_class: Any) -> set[type]:
    """The module classes ``model_class`` instantiates for ``config``, built on the meta device."""
    import torch

    with torch.device("meta"):
        model = model_class._from_config(config)
    return {type(module) for module in model.modules()}


def _forward_trees(classes: set[type]) -> Iterator[tuple[str, ast.AST]]:
    """Each class's own ``forward``, parsed; one transformers dispatches to an experts kernel, one the class inherits
    from another module (torch's) and one without source are left out."""
    for klass in classes:
        forward = getattr(klass, "forward", None)
        if not inspect.isfunction(forward) or _dispatched(forward):
            continue
        own = inspect.unwrap(forward)  # under transformers' argument decorators (deprecate_kwarg, ...)
        if own.__code__.co_filename != inspect.getfile(klass):  # inherited from torch or a base elsewhere
            continue
        try:
            source = textwrap.dedent(inspect.getsource(own))
        except (OSError, TypeError):  # built without source (a compiled extension): nothing to read
            continue
        yield klass.__name__, ast.parse(source)


def _dispatched(forward: Any) -> bool:
    """Whether transformers replaced ``forward`` by its experts-kernel dispatch (``use_experts_implementation``):
    the class's own loop then runs only when the config asks for the ``eager`` experts."""
    while forward is not None:
        if forward.__code__.co_qualname.startswith("use_experts_implementation."):
            return True
        forward = getattr(forward, "__wrapped__", None)
    return False


def _method_calls(tree: ast.AST) -> Iterator[ast.Attribute]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node.func


def _value_reads(tree: ast.AST) -> list[str]:
    return sorted({f".{call.attr}()" for call in _method_calls(tree) if call.attr in VALUE_READS})


def _calls(tree: ast.AST, method: str) -> bool:
    return any(call.attr == method for call in _method_calls(tree))


def _grows_cache_layers(tree: ast.AST) -> bool:
    """``cache.layers += ...``, ``cache.layers = ...`` or ``cache.layers.append/extend/insert(...)``."""

    def is_cache_layers(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "layers"
            and isinstance(node.value, ast.Name)
            and node.value.id in ("cache", "past_key_values")
        )

    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
            if any(is_cache_layers(target) for target in targets):
                return True
    return any(
        call.attr in ("append", "extend", "insert") and is_cache_layers(call.value) for call in _method_calls(tree)
    )


#: The names a forward receives generate()'s cache under.
_GIVEN_CACHE = ("cache", "past_key_values")


def _wraps_given_cache(tree: ast.AST, config: Any) -> bool:
    """``SomeCache(cache, ...)`` (a call of a ``...Cache`` class with the given cache among its arguments), outside any
    ``if`` whose test reads a ``config.<flag>`` that is off for ``config``."""

    def wraps(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.endswith("Cache")
            and any(isinstance(a, ast.Name) and a.id in _GIVEN_CACHE for a in node.args)
        )

    def visit(node: ast.AST) -> bool:
        if isinstance(node, ast.If) and _off_flag(node.test, config):
            return any(visit(child) for child in node.orelse)  # the body never runs for this config
        return wraps(node) or any(visit(child) for child in ast.iter_child_nodes(node))

    return visit(tree)


def _off_flag(test: ast.AST, config: Any) -> bool:
    """Whether ``test`` reads ``config.<flag>`` (or ``self.config.<flag>``) as a conjunct, with the flag off here."""
    conjuncts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for part in conjuncts:
        if (
            isinstance(part, ast.Attribute)
            and isinstance(part.value, ast.Attribute | ast.Name)
            and (part.value.attr if isinstance(part.value, ast.Attribute) else part.value.id) == "config"
            and not getattr(config.get_text_config(decoder=True), part.attr, getattr(config, part.attr, True))
        ):
            return True
    return False
