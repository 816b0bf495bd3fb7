"""A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe` (standard library only),
for the browser tests: open a page at an exact viewport width (a headless window cannot be narrower
than 500 px; device-metrics emulation can), run JavaScript in it after its own scripts ran, and take
full-page screenshots. Messages are JSON, NUL-terminated, on file descriptors 3 (to Chromium) and 4
(from Chromium)."""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


class CdpError(RuntimeError):
    pass


class Chromium:
    def __init__(self, binary: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="atlas-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire() -> None:  # runs in the child: Chromium expects the pipe on fds 3 and 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-quic", "--hide-scrollbars", "--mute-audio",
             f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=wire,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    # ---- protocol --------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise CdpError("Chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise CdpError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise CdpError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self._events.append(answer)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, event in enumerate(self._events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self._events.pop(i)
            self._events.append(self._read_message(deadline))

    # ---- pages -----------------------------------------------------------------------------

    def open(self, url: str, width: int, height: int = 900) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session, target)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
                  session)
        self.send("Page.enable", {}, session)
        self.send("Page.navigate", {"url": url}, session)
        self.wait_event("Page.loadEventFired", session)
        return page

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except CdpError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        self._profile.cleanup()

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    def __init__(self, browser: Chromium, session: str, target: str) -> None:
        self.browser, self.session, self.target = browser, session, target

    def evaluate(self, expression: str) -> Any:
        """Run JavaScript in the page (a Promise is awaited); its JSON-able value."""
        result = self.browser.send("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True,
        }, self.session)
        if "exceptionDetails" in result:
            raise CdpError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        """The whole page, not only the viewport."""
        data = self.browser.send("Page.captureScreenshot",
                                 {"format": "png", "captureBeyondViewport": True}, self.session)
        path.write_bytes(base64.b64decode(data["data"]))

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})
