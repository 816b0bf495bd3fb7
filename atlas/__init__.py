"""MTP Atlas: hub -> store -> evidence -> site, plus measured self-speculative decoding."""

__version__ = "0.1.0"


class AtlasError(Exception):
    """An expected failure with a message meant for the user (the CLI prints it without a traceback)."""
