"""The HF token never leaves the process. A hub or proxy may echo the request's `Authorization`
header in its error text, hub metadata or even a file; every text that came from the network goes
through `text` (bytes through `data`) before it is stored, cached or shown.

URLs are the other way a credential travels: `--endpoint http://user:password@host` is a working
way to reach a hub behind basic auth, and the URL is printed, stored in the snapshot and recorded
in a measurement's command. `text` drops the user info of every URL in the text, so one function
hides tokens and URL credentials alike.

Secrets are registered once (`keep_secret`, by the crawl for its token and by the command line for
$HF_TOKEN) and scrubbed wherever they appear; `Bearer <x>` and `Authorization: <x>` forms are
scrubbed whatever the credential, so a token nobody registered is hidden too.
"""

from __future__ import annotations

import re
import threading

MASK = "[token hidden]"
MIN_SECRET = 8  # shorter strings are no Hub token, and hiding them would garble ordinary text
# The credential after a scheme word, and after an Authorization header name without one.
_CREDENTIAL = r"(?!\[token hidden\])[^\s\"',;}\]]+"
_AUTH = (
    re.compile(r"(?i)(\bbearer\s+)" + _CREDENTIAL),
    re.compile(r"(?i)(\bauthorization\b[\"']?\s*[:=]\s*[\"']?(?:(?:basic|token)\s+)?)(?!(?:bearer|basic|token)\s)" + _CREDENTIAL),
)
# A URL's user info: everything between the scheme's `//` and the last `@` before the path. Greedy on
# purpose: a password with an unescaped `@` or `:` is still hidden whole, not cut at its first `@`.
_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/\s\"'<>]*@")
_secrets: set[str] = set()
_lock = threading.Lock()


def keep_secret(secret: object) -> None:
    """Scrub `secret` from every text from now on (nothing happens for no token: None, False, '')."""
    if isinstance(secret, str) and len(secret.strip()) >= MIN_SECRET:
        with _lock:
            _secrets.add(secret.strip())


def text(value: str) -> str:
    """`value` without any registered secret, without the credential of an auth header and
    without the user info of any URL."""
    if "://" in value and "@" in value:  # the pattern is slow on every config of a crawl
        value = _USERINFO.sub(r"\1", value)
    low = value.lower()
    if "bearer" in low or "authorization" in low:  # the patterns are slow on every config of a crawl
        for pattern in _AUTH:
            value = pattern.sub(lambda m: m.group(1) + MASK, value)
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)  # a longer secret before one inside it
    for secret in secrets:
        value = value.replace(secret, MASK)
    return value


def data(value: bytes) -> bytes:
    """Downloaded bytes without any registered secret (a file that echoes the token)."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        value = value.replace(secret.encode("utf-8"), MASK.encode("utf-8"))
    return value
