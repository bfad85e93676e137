"""What :class:`~warmcache.runtime.guard.ShapeGuard` offers a torch program: fitting, generating, priming, training
and the recompile sentinel, each importing torch (and its module) only when called.

The methods take the guard as :class:`~warmcache.runtime.guarded.Guard`, the protocol padding, serving and training
already name, so this mixin needs nothing of the guard's class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warmcache.cache.platform_mark import claim_for_target
from warmcache.targets import target_of

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from warmcache.runtime.guarded import Guard
    from warmcache.runtime.padding import FittedBatch
    from warmcache.runtime.sentinel import SentinelReport
    from warmcache.runtime.serving import PrimeReport
    from warmcache.runtime.training import BucketCollator, GuardCallback


class TorchFacing:
    """The torch-facing helpers of a guard (lazy imports)."""

    def claim_compile_folder(self: Guard) -> None:
        """Refuse to compile where this process's Inductor cache holds another CPU platform's code.

        torch's FX graph key leaves out the vector ISA (:mod:`warmcache.cache.platform_mark`): tracing a
        bucket there, or compiling an unseen shape under ``warn``, would load kernels written for another
        vector width and give wrong numbers, which no policy accepts. The folder is torch's for this
        process (``$TORCHINDUCTOR_CACHE_DIR`` or its default), claimed as a warmup claims it.
        """
        target = target_of(*self.target)
        claim_for_target(target.default_cache_dir(), target)

    def fit(self: Guard, inputs: Any, pad_token_id: int | None = None) -> FittedBatch:
        """Left-pad a generate() batch to its bucket and add dummy rows; see :mod:`warmcache.runtime.padding`.

        :param inputs: ``input_ids`` and the other ``(batch, length)`` tensors of one request.
        :param pad_token_id: what ``input_ids`` are padded with (default 0; the padding is masked out).
        :raises UnseenShapeError: the request fits no bucket and the policy refuses it.
        """
        from warmcache.runtime.padding import fit_generate_inputs

        return fit_generate_inputs(self, inputs, pad_token_id)

    def generate(self: Guard, model: Any, /, **kwargs: Any) -> Any:
        """``model.generate`` on a compiled bucket: fit → generate → unpad; see :mod:`warmcache.runtime.serving`.

        :param model: the Hugging Face model the buckets were compiled for.
        :param kwargs: ``model.generate``'s arguments; the inputs are padded onto a bucket and ``max_new_tokens``
            fitted to its cache.
        :returns: what ``model.generate`` returns, without the padding.
        :raises UnseenShapeError: the request fits no bucket, or changes a compiled setting, and the policy refuses.
        """
        from warmcache.runtime.serving import guarded_generate

        return guarded_generate(self, model, **kwargs)

    def prime(self: Guard, model: Any, **kwargs: Any) -> PrimeReport:
        """Load every compiled bucket once, then run generate() under the strict sentinel; see
        :mod:`warmcache.runtime.serving`.

        :param model: the Hugging Face model the buckets were compiled for.
        :param kwargs: :func:`~warmcache.runtime.serving.prime`'s options (``check_config``, ``precompiled``,
            ``cache_dir``).
        :returns: what was loaded, compiled and hit, per bucket.
        """
        from warmcache.runtime.serving import prime

        return prime(self, model, **kwargs)

    def collator(self: Guard, tokenizer: Any, **kwargs: Any) -> BucketCollator:
        """A training data collator that keeps every batch on a compiled bucket.

        :param tokenizer: whose ``pad_token_id`` pads the batches (or pass ``pad_token_id=``).
        """
        from warmcache.runtime.training import BucketCollator

        return BucketCollator(self, tokenizer, **kwargs)

    def callback(self: Guard) -> GuardCallback:
        """A Trainer callback that checks every batch's shape before its step and counts compiles per step."""
        from warmcache.runtime.training import GuardCallback

        return GuardCallback(self)

    def sentinel(self: Guard, label: str = "guarded region") -> AbstractContextManager[SentinelReport]:
        """Fail (``pad``/``refuse``) or record (``warn``) any compile inside the block.

        :param label: names the region (a shape, a training step) in the error or the log line.
        """
        from warmcache.runtime.sentinel import recompile_sentinel

        return recompile_sentinel(self.policy, label)
