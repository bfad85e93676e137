"""What warmcache does to a Hugging Face model around ``generate()`` and ``forward``.

The KV-cache classes a model's layers need, the inputs one decode step takes, the
``CompileConfig`` handed to ``generate()``, and the counter that proves a run did not
compile. These modules sit below the targets, the runtime and warmup, which all use
them; none imports torch at module import time.
"""
