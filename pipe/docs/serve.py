"""`pipe docs serve`: the generated site on 127.0.0.1, with the standard library's HTTP server.
The site needs no server (index.html opens from disk); this is for sharing a URL or a browser
that refuses file:// pages."""

from __future__ import annotations

import functools
import http.server
from pathlib import Path
from typing import Callable


LOCAL_NAMES = ("localhost", "127.0.0.1", "[::1]")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves only requests addressed to this machine by name: a page on another site that
    points its own host name at 127.0.0.1 (DNS rebinding) sends its name as Host, and gets 403."""

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name; one line per request is noise here
        pass

    def _local(self) -> bool:
        port = self.server.server_address[1]
        host = (self.headers.get("Host") or "").strip().lower()
        names = {f"{name}:{port}" for name in LOCAL_NAMES} | (set(LOCAL_NAMES) if port == 80 else set())
        if host in names:
            return True
        self.send_error(403, "Forbidden", f"pipe docs serve answers requests to localhost:{port} or 127.0.0.1:{port} only")
        return False

    def do_GET(self):
        if self._local():
            super().do_GET()

    def do_HEAD(self):
        if self._local():
            super().do_HEAD()


def serve(site: Path, port: int, started: Callable[[str], None]) -> None:
    """Serves `site` until Ctrl-C; `started` gets the URL once the port is bound. OSError when
    the port cannot be bound."""
    handler = functools.partial(_Quiet, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        started(f"http://127.0.0.1:{server.server_address[1]}/")
        try:
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
