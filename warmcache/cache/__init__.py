"""The compile-cache folders on disk: their layout, where they are, and cleaning them (scan, doctor, prune) safely."""
