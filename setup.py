"""The packages the wheel ships, found rather than listed (the metadata is in pyproject.toml).

A hand-kept list once left ``warmcache.store.oci`` out of the wheel, and every command of a
regular install failed on import. ``find_packages`` finds every folder with an ``__init__.py``
(``tests/test_packaging.py`` holds that every folder has one), and ``migrations/`` (top level:
the schema's only source of change) ships as ``warmcache._migrations``, so ``warmcache db
upgrade`` works from any install.
"""

from setuptools import find_packages, setup

MIGRATIONS = "warmcache._migrations"

setup(
    packages=[
        *find_packages(include=["warmcache", "warmcache.*"]),
        MIGRATIONS,
        *(f"{MIGRATIONS}.{name}" for name in find_packages("migrations")),
    ],
    package_dir={MIGRATIONS: "migrations"},
)
