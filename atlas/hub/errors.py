"""What went wrong with one request or repo: the kinds as an enum, and one typed mapping from the
hub's answer (its X-Error-Code first, then its status) to a kind and a message, the way
huggingface_hub's `hf_raise_for_status` maps the same header to its error classes."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, NamedTuple

from huggingface_hub.errors import HFValidationError, NotASafetensorsRepoError, SafetensorsParsingError
from huggingface_hub.utils import httpx

from atlas.hub import redact

# The Hub's X-Error-Message for a disabled repo (asked with a token); the local hub sends the same.
DISABLED_MESSAGE = "Access to this resource is disabled."
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class ErrorKind(StrEnum):
    """How a failed request is taken. The first four are also a repo's `fetch_status` in the
    store; RETRY and UNREACHABLE only decide whether `call` asks again."""

    GATED = "gated"
    MISSING = "missing"
    DISABLED = "disabled"
    ERROR = "error"
    RETRY = "retry"  # a 408/429/5xx: the server may answer next time
    UNREACHABLE = "unreachable"  # no answer at all (timeouts, refused or dropped connections)


REPO_KINDS = frozenset({ErrorKind.GATED, ErrorKind.MISSING, ErrorKind.DISABLED, ErrorKind.ERROR})
# the same answer comes at the same sha every time: a later crawl cannot do better
_PERMANENT_KINDS = frozenset({ErrorKind.MISSING, ErrorKind.DISABLED})


class Classified(NamedTuple):
    kind: ErrorKind
    message: str


class RepoProblem(Exception):
    """A per-repo outcome that is not success, of one of REPO_KINDS.
    `permanent`: asking again at the same sha cannot help (a 404, bad bytes, over a size limit),
    as opposed to a server or network failure that a later crawl may get past."""

    def __init__(self, kind: ErrorKind, message: str, permanent: bool = False, gave_up: bool = False) -> None:
        if kind not in REPO_KINDS:  # a retry or silence is the caller's to handle, never a repo's outcome
            raise ValueError(f"{kind!r} is not a repo's outcome")
        super().__init__(redact.text(message))
        self.kind = kind
        self.permanent = permanent or kind in _PERMANENT_KINDS
        self.gave_up = gave_up  # a bound of the crawl was reached (see Bounds)


def response_of(exc: BaseException | None) -> Any:
    """The HTTP answer behind an exception from the client (also when wrapped), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        response = getattr(exc, "response", None)
        if response is not None and hasattr(response, "status_code"):
            return response
        exc = exc.__cause__ or exc.__context__
    return None


def _repo_not_found(status: int) -> Classified:
    why = "missing, or private without a token" if status == 401 else "missing"
    return Classified(ErrorKind.MISSING, f"repository not found (HTTP {status} RepoNotFound: {why})")


# X-Error-Code -> what the answer means (the status only words the message)
_BY_ERROR_CODE: dict[str, Callable[[int], Classified]] = {
    "GatedRepo": lambda status: Classified(
        ErrorKind.GATED, f"gated (HTTP {status} GatedRepo): needs an HF_TOKEN of an account with access"),
    "RepoNotFound": _repo_not_found,
    "RevisionNotFound": lambda status: Classified(
        ErrorKind.MISSING, f"revision not found (HTTP {status} RevisionNotFound)"),
    "EntryNotFound": lambda status: Classified(
        ErrorKind.MISSING, f"file not found at this revision (HTTP {status} EntryNotFound)"),
}
# statuses without a known error code
_BY_STATUS: dict[int, Classified] = {
    **{status: Classified(ErrorKind.RETRY, f"HTTP {status}") for status in RETRY_STATUS},
    401: Classified(ErrorKind.MISSING, "HTTP 401 without an error code: missing, or private without a token"),
    404: Classified(ErrorKind.MISSING, "not found (HTTP 404)"),
}
# exceptions that carry no HTTP answer, in the order they are tried
_NO_ANSWER: tuple[tuple[tuple[type[BaseException], ...], ErrorKind, str], ...] = (
    ((httpx.TimeoutException, httpx.TransportError, TimeoutError, ConnectionError), ErrorKind.UNREACHABLE, "no answer ({name}: {line})"),
    ((HFValidationError,), ErrorKind.ERROR, "rejected by the hub client: {line}"),
    ((SafetensorsParsingError, NotASafetensorsRepoError), ErrorKind.ERROR, "safetensors header unreadable: {line}"),
)


def classify(exc: BaseException) -> Classified:
    """The kind and message for an exception from the hub client."""
    response = response_of(exc)
    if response is None:
        for types, kind, template in _NO_ANSWER:
            if isinstance(exc, types):
                return Classified(kind, template.format(name=type(exc).__name__, line=first_line(exc)))
        return Classified(ErrorKind.ERROR, f"{type(exc).__name__}: {first_line(exc)}")
    status = response.status_code
    code = response.headers.get("X-Error-Code") or ""
    message = redact.text(response.headers.get("X-Error-Message") or "")  # before it is cut short
    # a disabled repo has no error code of its own; a gated one says GatedRepo whatever the message
    if message == DISABLED_MESSAGE and code != "GatedRepo":
        return Classified(ErrorKind.DISABLED, f"disabled on the Hub (HTTP {status})")
    if code in _BY_ERROR_CODE:
        return _BY_ERROR_CODE[code](status)
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return Classified(ErrorKind.ERROR, f"HTTP {status}{': ' + message[:200] if message else ''}")


def first_line(exc: BaseException) -> str:
    text = redact.text(str(exc))  # before it is cut short: no half token survives
    return text.splitlines()[0][:300] if text else ""
