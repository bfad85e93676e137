"""What the registry says, as the commands and the service show it.

:mod:`~warmcache.reports.query` answers "is this shape compiled, and if not why",
:mod:`~warmcache.reports.explain` names what changed since a row was recorded, and
:mod:`~warmcache.reports.status` summarises a manifest's progress. They read the
registry and the identity of each shape; they never write.
"""
