"""policylink.data: the zarr episode store, recording, statistics and normalizer, windowed sampling, and
LeRobot v3.0 interop (each imported on demand; nothing here imports torch at module level)."""
