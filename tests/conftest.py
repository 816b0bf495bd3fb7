"""Shared pytest set-up. Each helper keeps its part in its own marked section."""

from __future__ import annotations

import os
import tempfile

# ---- hub client environment (helper CRAWL) -----------------------------------------------------
# Read by huggingface_hub at import time, so set before any test module imports it: no telemetry
# request to huggingface.co, a throw-away HF_HOME (no user token or cache), never offline mode
# (HF_HUB_OFFLINE blocks the 127.0.0.1 test hub too). No test reaches the network.
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="atlas-tests-hf-home-")
os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.pop("HF_TOKEN", None)
