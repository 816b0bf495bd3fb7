"""llama.cpp's llama-server from the pinned build (`--engine llamacpp`): the build and its carried
patches (build.py, patches/), the server (server.py), the GGUF files made by llama.cpp's own converter
(gguf.py, convert.py run as a script, draftvocab.py), pass costs (bench.py), the conformance suite's
driver (conformance.py) and the engine itself (engine.py)."""
