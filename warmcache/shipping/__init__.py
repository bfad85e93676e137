"""Shipping compile caches between machines: which rows and files a manifest ships (shipment), the bundle that
carries them (bundle, bundle_rows, file_list), and checking and installing what arrives (unbundle, install)."""
