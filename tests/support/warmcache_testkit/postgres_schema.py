"""A throwaway PostgreSQL schema, for tests and benchmarks that need an empty registry.

Each caller gets a registry URL whose ``search_path`` is a new schema, dropped on
exit, so runs share one server (and one database) without seeing each other's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def temporary_schema(url: str, prefix: str = "wc") -> Iterator[str]:
    """Yield ``url`` pointed at a fresh schema; drop the schema (and all in it) afterwards."""
    import sqlalchemy as sa

    from warmcache.settings import RegistryLocation

    base = RegistryLocation.parse(url).url
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        yield f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()
