"""The compile-cache layouts warmcache knows.

A target owns the flavour of its cache and the cache tools read it: the name lives
with the targets (this module imports nothing from warmcache), and ``cache`` imports
it from here; ``targets`` never imports ``cache``.
"""

from __future__ import annotations

from typing import Literal

CacheFlavor = Literal["inductor", "neuron", "neuron-native"]
