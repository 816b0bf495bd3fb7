"""`atlas site serve` on 127.0.0.1: pages as files, a missing page answered with the site's 404.html."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from atlas import AtlasError
from atlas.site.pages import render


@pytest.fixture()
def site(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "index.html").write_text("<h1>home</h1>")
    (tmp_path / "404.html").write_text("<h1>the site's own not-found page</h1>")
    server = render.make_server(tmp_path, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# direct to loopback, whatever proxy the environment names
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str) -> tuple[int, str]:
    try:
        with OPENER.open(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_page_is_served(site: str) -> None:
    assert fetch(site + "/") == (200, "<h1>home</h1>")


def test_a_missing_page_gets_the_sites_404(site: str) -> None:
    assert fetch(site + "/modules/no-such-page/") == (404, "<h1>the site's own not-found page</h1>")


def test_no_built_site_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(AtlasError, match="no built site"):
        render.make_server(tmp_path, 0)
