"""Measurement: the self-speculative decoding loop, the runner that times it, its records, workloads and the team model."""
