"""The crawler's error classification (atlas.hub.errors): each hub answer, raised the way the hub
client raises it, maps to the kind the store records; precedence between the error code, the
disabled message and the status is pinned."""

from __future__ import annotations

import pytest
from huggingface_hub.utils import hf_raise_for_status, httpx

from atlas.hub.errors import DISABLED_MESSAGE, ErrorKind, RepoProblem, classify


def raised(status: int, code: str | None = None, message: str | None = None) -> BaseException:
    headers = {k: v for k, v in (("X-Error-Code", code), ("X-Error-Message", message)) if v is not None}
    response = httpx.Response(status, headers=headers, request=httpx.Request("GET", "http://127.0.0.1/api/models/o/m"))
    try:
        hf_raise_for_status(response)
    except Exception as exc:  # the client's own error type for this answer
        return exc
    raise AssertionError(f"HTTP {status} raised nothing")


@pytest.mark.parametrize(("status", "code", "message", "kind"), [
    (401, "GatedRepo", None, ErrorKind.GATED),
    (403, "GatedRepo", DISABLED_MESSAGE, ErrorKind.GATED),  # the code wins over the message
    (403, None, DISABLED_MESSAGE, ErrorKind.DISABLED),
    (404, "RepoNotFound", DISABLED_MESSAGE, ErrorKind.DISABLED),  # the message wins over other codes
    (401, "RepoNotFound", None, ErrorKind.MISSING),  # no token: missing and private look alike, not gated
    (404, "RevisionNotFound", None, ErrorKind.MISSING),
    (404, "EntryNotFound", None, ErrorKind.MISSING),
    (503, "RepoNotFound", None, ErrorKind.MISSING),  # a known code is taken before the status
    (401, None, None, ErrorKind.MISSING),
    (404, None, None, ErrorKind.MISSING),
    (500, "SomethingNew", None, ErrorKind.RETRY),  # an unknown code falls back to the status
    *[(status, None, None, ErrorKind.RETRY) for status in (408, 429, 500, 502, 503, 504)],
    (400, None, "bad expand", ErrorKind.ERROR),
    (403, None, None, ErrorKind.ERROR),
])
def test_each_answer_maps_to_its_kind(status: int, code: str | None, message: str | None, kind: ErrorKind) -> None:
    assert classify(raised(status, code, message)).kind is kind


def test_messages_say_the_status_and_why() -> None:
    assert classify(raised(401, "RepoNotFound")).message == (
        "repository not found (HTTP 401 RepoNotFound: missing, or private without a token)")
    assert classify(raised(404, "RepoNotFound")).message == "repository not found (HTTP 404 RepoNotFound: missing)"
    assert classify(raised(400, None, "x" * 300)).message == "HTTP 400: " + "x" * 200


def test_no_answer_is_unreachable_and_other_exceptions_are_errors() -> None:
    assert classify(httpx.ConnectError("refused")).kind is ErrorKind.UNREACHABLE
    assert classify(TimeoutError("slow")) == (ErrorKind.UNREACHABLE, "no answer (TimeoutError: slow)")
    assert classify(ValueError("odd\nsecond line")) == (ErrorKind.ERROR, "ValueError: odd")


def test_a_repo_problem_is_one_of_the_repo_kinds() -> None:
    assert RepoProblem(ErrorKind.MISSING, "gone").permanent  # the same answer at the same sha
    assert not RepoProblem(ErrorKind.ERROR, "HTTP 503").permanent
    for kind in (ErrorKind.RETRY, ErrorKind.UNREACHABLE):
        with pytest.raises(ValueError):
            RepoProblem(kind, "not an outcome")
