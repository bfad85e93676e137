"""What the quickstart runs that is not a command: the tiny models it warms (:mod:`warmcache.examples.tiny_model`).

Shipped with the wheel, so the quickstart needs no source tree: ``python -m warmcache.examples.tiny_model DIR``.
Nothing else in ``warmcache`` imports this package.
"""
