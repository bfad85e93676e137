"""Precompiled artifacts: a bucket's decode step saved ahead of time, and everything about it in one place.

A route (:class:`warmcache.artifacts.route.PrecompiledRoute`) says how warmup saves its
files, how the runtime loads one, how verify proves them and what trust loading them
needs; :data:`warmcache.artifacts.kinds.ROUTES` lists every route under the registry's
``artifact_kind`` of its files, and that recorded kind is what the loader chooses by.

* ``route.py``: the interface; ``kinds.py``: the table of routes;
* ``aot_compile.py``: ``precompile = true`` (Dynamo's ``aot_compile``);
* ``aotinductor.py``: ``precompile = "aotinductor"`` (weights-less AOTInductor packages), with
  its export (``aoti_export.py``, warmup and verify only), loader (``aoti_loader.py``,
  ``mapped_library.py``), its steps (``package_steps.py``) and the inputs of a packaged
  prefill (``prefill_inputs.py``, ``step_inputs.py``);
* ``format.py``: the file format every route writes and checks before anything in it runs;
* ``capture.py``: the decode call every route saves, captured from warmup's ``generate()``;
* ``dispatch.py``: a model's compiled call served from the rows' files; ``trust.py``: which
  rows may name code to load, and from which folder.

Importing any of it imports neither the compiler nor transformers: a serving process loads
files through it, and the save and proof halves import what they need when run.
"""
