"""``warmcache serve``: the registry as an HTTP service, with Prometheus metrics and a live dashboard.

A router in another language asks ``/v1/check`` whether a request can run; a guard in a
process without database access builds itself from ``/v1/guard/{model}``
(:meth:`~warmcache.runtime.guard.ShapeGuard.from_url`); an operator watches ``/`` while a
fleet warms up. Every answer reuses the library the CLI uses (the same decision as
``warmcache check``, the same JSON as ``--json``); the service only adds an in-memory view
of the registry (:mod:`.view`), authorisation for writes (:mod:`.auth`) and HTTP.
"""

from warmcache.service.app import ServiceConfig, create_app

__all__ = ["ServiceConfig", "create_app"]
