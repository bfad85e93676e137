"""The compile-cache folders on disk: their layout, bundles of them, and cleaning them (scan, doctor, prune) safely."""
