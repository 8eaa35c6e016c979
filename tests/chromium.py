"""Headless Chromium driven through its DevTools protocol, for the tests and bench of `pipe docs`.

Chromium speaks the protocol over a pair of pipes (`--remote-debugging-pipe`: it reads commands
on fd 3 and writes replies and events on fd 4, each a JSON message ending with a NUL byte), so
no WebSocket client and no driver package is needed. Debian's `chromium` package is the browser
(`.ci/run` installs it)."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


class BrowserError(RuntimeError):
    pass


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise BrowserError("chromium is not installed: `apt-get install -y chromium` (Debian's package; .ci/run installs it)")
    return found


class Chromium:
    """One headless browser; `with Chromium() as browser: page = browser.open(url)`."""

    def __init__(self, width: int = 1280, height: int = 800):
        self.profile = tempfile.mkdtemp(prefix="pipe-chromium-")
        to_browser, self._in = os.pipe()  # our writes -> its fd 3
        self._out, from_browser = os.pipe()  # its fd 4 -> our reads
        args = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--hide-scrollbars", "--remote-debugging-pipe", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                "about:blank"]
        # the shell puts the pipes on fds 3 and 4, then execs the browser with its stdin/stdout closed off
        script = 'exec "$@" 3<&0 4>&1 </dev/null >/dev/null'
        self.proc = subprocess.Popen(["sh", "-c", script, "sh", *args], stdin=to_browser, stdout=from_browser, stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._in, self._out):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any) -> dict[str, Any]:
        """Sends one command and returns its result (events that arrive meanwhile are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._in, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out], [], [], left)[0]:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self._out, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited (code {self.proc.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> "Page":
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = Page(self, session)
        page.navigate(url)
        return page


class Page:
    def __init__(self, browser: Chromium, session: str):
        self.browser = browser
        self.session = session

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.browser.call(method, self.session, **params)

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """The value of `expression` once it is truthy (polled)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except BrowserError:  # the page is being replaced by a navigation
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression}")
            time.sleep(0.05)

    def move(self, x: float, y: float) -> None:
        """The mouse pointer moved to (x, y) of the viewport."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def click(self, x: float, y: float) -> None:
        """A real left click at (x, y) of the viewport, as a user's mouse makes it."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        self.call("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=1)
        self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x, y=y, button="left", clickCount=1)

    def press(self, key: str, code: int) -> None:
        """A key pressed and released (`key` as KeyboardEvent.key names it, `code` its key code)."""
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=code)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)
