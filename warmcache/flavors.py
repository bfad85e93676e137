"""The compile-cache layouts warmcache knows.

A target owns the flavour of its cache and the cache tools read it, so the name
lives below both (this module imports nothing from warmcache): ``targets`` and
``cache`` then never import each other in a circle.
"""

from __future__ import annotations

from typing import Literal

CacheFlavor = Literal["inductor", "neuron", "neuron-native"]
