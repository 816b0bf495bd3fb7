"""Engine backends, one module each: our own loop (atlas_engine), transformers' generate pair
(transformers_engine) and vLLM in its own environment as a subprocess driver speaking JSON lines
(vllm_engine, vllm_client, vllm_driver, convert). The `_engine` suffix is there because
vllm_driver.py runs as a script from this folder: a module named vllm.py or transformers.py here
would shadow the real packages in vLLM's interpreter."""
