"""A digest of the model code a loaded model runs, cheap enough for every start and without the compiler.

A precompiled artifact (an AOTInductor package, an ``aot_compile`` artifact) is the graph
warmup traced from the model's Python code; production binds the loaded model's weights to
it and never traces that code again. So a process whose modeling code changed since warmup
(a newer image, a local fix, a monkeypatched layer) would serve the old computation with the
same checkpoint and config. warmup records this digest in each artifact's header and
:mod:`warmcache.artifacts.code_check` recomputes it before loading any artifact.

What it covers, for every module class the model instantiates (``type(m)`` for each of
``model.modules()``) and every base class of it, torch's own classes and ``object`` left out:

* the content (sha256) of the source file that defines the class;
* each function in the class's own ``__dict__`` (methods, static and class methods, a
  property's accessors), named by where it comes from: its module, qualified name and the
  sha256 of the file its code is in, for itself and every function it wraps
  (``__wrapped__``), so a method replaced after import (``LlamaMLP.forward = ...``) counts;
* for each module that defines one of those classes the model instantiates (the modeling
  file), each function among its globals, named the same way: the helpers its forwards
  call (``apply_rotary_pos_emb``, ``eager_attention_forward``) and a global replaced by a
  patch.

Paths never enter it (a fleet's hosts install packages in different places), only
contents and names. A function of Python's own library, or whose file cannot be read (code
built from a string), is named without its file's content: a host's Python patch release
changes no model. An image shipped without the ``.py`` sources reads as changed code.

It does not cover torch's classes (``nn.Linear``, ``nn.Module``: torch's version is in the
toolchain's fingerprint, and Dynamo itself replaces ``nn.Module.__init__`` when it loads),
instance attributes (a forward replaced on one module object, accelerate's hooks),
functions reached only through other modules (transformers' masking and attention
registries), the config (:func:`warmcache.identity.fingerprint.config_hash` covers that) or
the weights (graph inputs). verify's graph digest (:meth:`warmcache.artifacts.aotinductor.AotInductorRoute.prove`)
sees all of those, by exporting the model again.

Imports nothing but the standard library: a served process computes it without torch's
compiler (measured on a loaded 2-core machine: 4 to 18 ms for Qwen3-0.6B, Qwen3-30B-A3B and
gemma-2-2b at real width, built on the meta device; it reads each file once).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
import sysconfig
import types
from collections.abc import Mapping
from typing import Any

#: Bumped when what the digest covers changes: an artifact recorded under another version reads as changed code.
DIGEST_VERSION = 1
#: Python's own library: its functions are named, not hashed (a host's Python patch release changes no model).
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
#: Folders of installed packages, which may lie under the standard library's (``/usr/local/lib/python3.X``).
_INSTALLED = frozenset({"site-packages", "dist-packages"})


def model_code_digest(model: Any) -> str:
    """The sha256 (hex) of the code ``model`` runs, as the module docstring defines it."""
    return _Digest().of(model)


class _Digest:
    def __init__(self) -> None:
        self._files: dict[str, str] = {}

    def of(self, model: Any) -> str:
        leaves = {type(module) for module in model.modules() if not _torchs(type(module))}
        classes = {base for leaf in leaves for base in leaf.__mro__ if base is not object and not _torchs(base)}
        parts: dict[str, Any] = {"version": DIGEST_VERSION}
        for klass in sorted(classes, key=_name):
            parts[_name(klass)] = {
                "file": self._module_file(klass.__module__),
                "functions": {name: self._origin(value) for name, value in _functions(vars(klass))},
            }
        for module_name in sorted({leaf.__module__ for leaf in leaves}):
            module = sys.modules.get(module_name)
            if module is not None:
                parts[f"module {module_name}"] = {name: self._origin(value) for name, value in _functions(vars(module))}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def _origin(self, function: Any) -> list[list[str]]:
        """``[[module, qualname, file digest], ...]`` of ``function`` and of each function it wraps."""
        chain = []
        seen: set[int] = set()
        while function is not None and id(function) not in seen:
            seen.add(id(function))
            code = getattr(function, "__code__", None)
            source = self._file(code.co_filename) if isinstance(code, types.CodeType) else None
            chain.append(
                [
                    str(getattr(function, "__module__", None)),
                    str(getattr(function, "__qualname__", type(function).__qualname__)),
                    source or "",
                ]
            )
            function = getattr(function, "__wrapped__", None)
        return chain

    def _module_file(self, module_name: str) -> str:
        module = sys.modules.get(module_name)
        path = getattr(module, "__file__", None)
        return (self._file(path) if isinstance(path, str) else None) or ""

    def _file(self, path: str) -> str | None:
        """The sha256 of the file at ``path`` (read once per digest); ``"stdlib"`` for Python's own library (its
        files differ between Python releases, which change no model); ``None`` when it cannot be read."""
        if path not in self._files:
            real = os.path.realpath(path)
            if real.startswith(_STDLIB) and not _INSTALLED.intersection(real.split(os.sep)):
                self._files[path] = "stdlib"
                return "stdlib"
            try:
                with open(path, "rb") as handle:
                    self._files[path] = hashlib.sha256(handle.read()).hexdigest()
            except OSError:  # "<string>", "<frozen ...>", a file the image left out
                return None
        return self._files[path]


def _torchs(klass: type) -> bool:
    """Whether ``klass`` is torch's own (``torch.nn.Linear``, ``torch.nn.Module``)."""
    return klass.__module__ == "torch" or klass.__module__.startswith("torch.")


def _name(klass: type) -> str:
    return f"{klass.__module__}.{klass.__qualname__}"


def _functions(namespace: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The Python functions of a class's or module's namespace, under their names (a property's accessors as
    ``name.fget``...), sorted."""
    found = []
    for name, value in namespace.items():
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        if isinstance(value, property):
            found += [(f"{name}.{part}", f) for part in ("fget", "fset", "fdel") if (f := getattr(value, part))]
        elif inspect.isfunction(value) or _wraps_function(value):
            found.append((name, value))
    return sorted(found, key=lambda item: item[0])


def _wraps_function(value: Any) -> bool:
    """Whether ``value`` is a wrapper (``functools.wraps``, ``lru_cache``) around a Python function."""
    if not callable(value) or isinstance(value, type):
        return False
    try:
        return inspect.isfunction(inspect.unwrap(value))
    except (ValueError, AttributeError, TypeError):  # a cycle of __wrapped__, an object that answers anything
        return False
