"""Measurement: the self-speculative decoding loop, the engines that time it, its records, workloads and the team model."""
