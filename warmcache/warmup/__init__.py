"""Warm up and verify: claim each planned shape, compile it through its real workload, record it, prove it."""
