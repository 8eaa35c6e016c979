"""`pipe docs serve`: the generated site on 127.0.0.1, with the standard library's HTTP server.
The site needs no server (index.html opens from disk); this is for sharing a URL or a browser
that refuses file:// pages."""

from __future__ import annotations

import functools
import http.server
from pathlib import Path
from typing import Callable


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name; one line per request is noise here
        pass


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
