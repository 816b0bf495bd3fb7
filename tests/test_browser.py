"""The built site in a real browser: serve it with `atlas site serve` on 127.0.0.1, load module 8
in headless Chromium, and check the rendered DOM (after the page's scripts ran) holds the declared
rows and the separate measured section. A screenshot is kept under build/test-artifacts/ (or
$ATLAS_TEST_ARTIFACTS). Skips only when no Chromium binary exists."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from site_helpers import REPO, crawl_mirror, declared_repo_ids, parse_html, site_copy

from atlas.site import evidence, render

CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
     if (found := shutil.which(name))),
    None,
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary (chromium, chromium-browser or google-chrome) on PATH, so the "
    "browser test cannot run here; .ci/run installs Debian's chromium",
)
ARTIFACTS = Path(os.environ.get("ATLAS_TEST_ARTIFACTS") or REPO / "build" / "test-artifacts")
DECLARED_HEADER = ["model", "num_mtp_layers", "key", "revision", "snapshot", "note"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=90,
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("browser-site")
    layout = site_copy(root)  # the course's real module pages
    db = root / "atlas.duckdb"
    crawl_mirror(db)
    evidence.generate(db, layout.evidence / "module-08.evidence.md", layout.evidence / "servable.toml")
    render.build(layout)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "atlas", "site", "serve", "--root", str(root), "--port", str(port)],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    assert r.status == 200
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError(f"`atlas site serve` did not answer on {url}")
                time.sleep(0.2)
        yield url, db
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_module_8_in_chromium_shows_declared_rows_and_a_separate_measured_section(
    served: tuple[str, Path],
) -> None:
    url, db = served
    page_url = url + "modules/module-08/"
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", page_url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = parse_html(dom.stdout)

    declared = [t for t in page.tables if t.header == DECLARED_HEADER]
    assert len(declared) == 1, [t.header for t in page.tables]
    assert sorted(row[0] for row in declared[0].rows) == declared_repo_ids(db)

    # The sortable-tables script ran in the browser (it marks every table it wires up).
    assert ("data-atlas-sortable", "1") in [a for tag, attrs in page.elements if tag == "table" for a in attrs]

    # The measured section: its own heading, after every present-claim table, with either the
    # measured table or the explicit "no measurement yet" notice.
    classes = [(tag, dict(attrs).get("class") or "", dict(attrs).get("id")) for tag, attrs in page.elements]
    measured_heading = next(i for i, (tag, _, ident) in enumerate(classes) if tag == "h2" and ident == "measured")
    measured_box = next(i for i, (tag, cls, _) in enumerate(classes)
                        if tag == "div" and "admonition" in cls.split() and "measured" in cls.split())
    servable_box = next(i for i, (tag, cls, _) in enumerate(classes)
                        if tag == "div" and "admonition" in cls.split() and "servable" in cls.split())
    assert servable_box < measured_heading < measured_box
    text = " ".join(page.text.split())
    measured_tables = [t for t in page.tables if t.header[:4] == ["date", "model", "revision", "hardware"]]
    assert measured_tables or evidence.NO_MEASUREMENT in text

    # Screenshots: the top of the page, and the whole page (a tall window: headless Chromium
    # does not paint a page scrolled to a far anchor reliably).
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, size in (("module-08", "1280,2400"), ("module-08-full", "1280,16000")):
        shot = ARTIFACTS / f"{name}.png"
        shot.unlink(missing_ok=True)
        done = _chromium(f"--window-size={size}", "--hide-scrollbars", f"--screenshot={shot}", page_url)
        assert done.returncode == 0, done.stderr[-2000:]
        assert shot.stat().st_size > 100_000, "a rendered page, not a blank one"
