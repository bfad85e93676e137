"""What makes a compiled shape the same on every host: the model's config, the toolchain, the plan.

:mod:`~warmcache.identity.fingerprint` hashes a model's config and combines each
target's toolchain factors into one toolchain hash; :mod:`~warmcache.identity.compile_env`
classifies the compiler's environment variables; :mod:`~warmcache.identity.plan` gives
every declared shape its identity; :mod:`~warmcache.identity.support` says which
planned models this machine can compile. Nothing here imports torch on the plan path.
"""
