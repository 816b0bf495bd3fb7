"""Our own loop (engine.py: `--engine atlas`) and transformers' generate pair beside it
(transformers_peer.py: the peer our loop is timed against, and `--engine transformers` alone)."""
