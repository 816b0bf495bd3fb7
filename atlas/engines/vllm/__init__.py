"""vLLM in its own environment (`--engine vllm`): a driver process run as a script by vLLM's
interpreter (driver.py, with its named run-time patch patch_expand.py), its client speaking JSON
lines (client.py) and the engine (engine.py). Nothing here may be imported by the driver: its
transformers pin conflicts with ours."""
