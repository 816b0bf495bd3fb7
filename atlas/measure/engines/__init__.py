"""Engine backends: measuring and conformance-testing MTP through an existing serving engine (vLLM),
which runs in its own environment as a subprocess driver speaking JSON lines."""
