"""MTP Atlas: hub -> store -> evidence -> site, plus measured self-speculative decoding."""

__version__ = "0.1.0"


class AtlasError(Exception):
    """An expected failure with a message meant for the user (the CLI prints it without a traceback)."""


class Interrupted(AtlasError):
    """Ctrl-C (SIGINT) stopped a command; the message says what was and was not written. Exit 130."""

    exit_code = 130


def is_interrupt(exc: BaseException) -> bool:
    """A Ctrl-C however it surfaced: Python's KeyboardInterrupt, DuckDB's while a query ran (the
    Python client raises a plain RuntimeError 'Query interrupted', or its InterruptException), or
    pydantic's while one of our serializers ran (it raises a PydanticSerializationError, a ValueError
    that names the exception in its text and chains nothing)."""
    return (isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "InterruptException"
            or (type(exc) is RuntimeError and str(exc).strip() == "Query interrupted")
            or (type(exc).__name__ == "PydanticSerializationError" and "`: KeyboardInterrupt:" in str(exc)))
