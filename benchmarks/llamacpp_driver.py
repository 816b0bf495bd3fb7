"""llama.cpp's plain greedy decoding of a GGUF, for benchmarks/engines.py: the anchor a CPU user would
pick. Run with the interpreter of an environment holding llama-cpp-python (built from its sdist on
PyPI; see benchmarks/engines.py), one JSON object per line on stdin and stdout:

    {"model": PATH, "threads": N, "n_ctx": C}                 -> {"llama_cpp": VERSION}
    {"prompt": [ids], "max_tokens": N}                        -> {"tokens": [...], "decode_seconds": S}

`decode_seconds` is the time from the first new token to the last, the phase the other engines'
clocks cover (the prompt's prefill is left out on every side). Nothing here imports the project.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import llama_cpp

    llm = None
    for line in sys.stdin:
        msg = json.loads(line)
        if "model" in msg:
            llm = llama_cpp.Llama(model_path=msg["model"], n_threads=msg["threads"], n_threads_batch=msg["threads"],
                                  n_ctx=msg["n_ctx"], n_batch=512, verbose=False, seed=0)
            reply = {"llama_cpp": llama_cpp.__version__}
        else:
            assert llm is not None, "load a model first"
            llm.reset()
            tokens, first = [], None
            for token in llm.generate(msg["prompt"], top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
                tokens.append(int(token))
                if first is None:
                    first = time.perf_counter()
                if len(tokens) == msg["max_tokens"]:
                    break
            reply = {"tokens": tokens, "decode_seconds": time.perf_counter() - first}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
