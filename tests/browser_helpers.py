"""What the browser tests share: the Chromium binary found on PATH (None: those tests skip), the
folder their screenshots go to, and one headless command-line run of Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from site_helpers import REPO

CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
     if (found := shutil.which(name))),
    None,
)
ARTIFACTS = Path(os.environ.get("ATLAS_TEST_ARTIFACTS") or REPO / "build" / "test-artifacts")


def run_chromium(*args: str) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run from the command line (--dump-dom, --screenshot ...), with its
    own throw-away profile."""
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=90,
        )
