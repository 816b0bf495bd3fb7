"""The Hub side of the data flow: the watch list, the crawler, and a local hub that serves the bundled mirror."""

import os

# Set before any module of this package imports huggingface_hub, which reads it once at import.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
