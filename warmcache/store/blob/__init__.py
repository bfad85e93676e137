"""Object stores: an S3 bucket (``s3://bucket/prefix``) or a folder (``file:///path``) holding compiled cache files as
content-addressed blobs and one index object per compiled shape (:mod:`warmcache.store.index`).

:mod:`.backends` opens one, :mod:`.push` publishes to it, :mod:`.source` pulls from it,
:mod:`.maintenance` lists and collects it, :mod:`.scrub` checks and repairs it;
:class:`~warmcache.store.blob.store.BlobStore` answers the store interface with them.
"""
