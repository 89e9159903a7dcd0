"""A counting object-store wrapper for tests and benches: an HTTP proxy on
127.0.0.1 in front of an S3 server (moto's, tests/s3_server.py) that forwards
every request and counts it, by method and by key. Pointing Lance's
``aws_endpoint`` at it counts every request Lance (and the engine's own state
files) makes, exactly: what a real object store would bill and wait for.

    with S3Server() as s3, CountingProxy(s3.endpoint) as proxy:
        options = {**s3.options, "aws_endpoint": proxy.endpoint}
        ...
        with proxy.counting() as seen:
            sensor tick
        assert seen.total <= 5
"""

import contextlib
import http.client
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}


@dataclass
class Seen:
    """Requests seen while counting: ``total``, and by method, by (method, path)."""

    requests: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.requests)

    @property
    def by_method(self) -> Counter:
        return Counter(m for m, _ in self.requests)

    def by_path(self) -> Counter:
        return Counter(f"{m} {p}" for m, p in self.requests)


class CountingProxy:
    def __init__(self, upstream: str) -> None:
        up = urllib.parse.urlsplit(upstream)
        self._host, self._port = up.hostname or "127.0.0.1", up.port or 80
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # quiet  # noqa: A002 (the base class names it)
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                parts = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(parts.query)
                # a listing is named by its prefix: "GET /bucket?prefix=cat/t0.lance/_versions/"
                path = parts.path + (f"?prefix={query['prefix'][0]}" if "prefix" in query else "")
                with proxy._lock:
                    for s in proxy._seen:
                        s.requests.append((self.command, urllib.parse.unquote(path)))
                conn = http.client.HTTPConnection(proxy._host, proxy._port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    # (a HEAD's Content-Length is the object's size: passed on as it is)
                    if k.lower() not in _HOP and (k.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="counting-proxy", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def counting(self):
        seen = Seen()
        with self._lock:
            self._seen.append(seen)
        try:
            yield seen
        finally:
            with self._lock:
                self._seen.remove(seen)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "CountingProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
