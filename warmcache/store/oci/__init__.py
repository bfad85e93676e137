"""The ``oci://`` store: a container registry holds a warmcache snapshot as an OCI image.

An image's layers are the compiled cache files and their indexes (:mod:`.layers`,
:mod:`.image`); :mod:`.client` speaks the distribution API with deadlines and bounds,
:mod:`.push` and :mod:`.repository` publish and fetch, :mod:`.maintenance` lists, collects and
checks, :mod:`.repair` repairs; :mod:`.store` answers the store interface with them. A pulled
tag is also a mountable image: a Kubernetes ``image`` volume (or
``podman run --mount type=image``) shows the cache folder and ``warmcache-guard.json``.
"""
