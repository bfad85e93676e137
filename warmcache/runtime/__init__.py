"""Production's side: the shape guard that keeps requests on compiled buckets, and what it loads."""
