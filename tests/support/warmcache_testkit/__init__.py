"""What the test suite and the tools under ``tools/`` share: servers (S3, OCI registry, hostile endpoints), manifests,
warmup hosts, model builders at real width and the support matrices.

A development distribution (``warmcache-testkit``, ``tests/support/pyproject.toml``), never in the warmcache wheel:
``pip install -e ./tests/support``. Tests and tools import it by name (``from warmcache_testkit.manifests import ...``),
adding nothing to the import path; the models users build are in :mod:`warmcache.examples`.
"""
