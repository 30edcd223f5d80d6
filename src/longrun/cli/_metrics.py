"""``longrun metrics``: a store's metrics once, in the Prometheus text format; and the endpoint that
``longrun worker --metrics-port`` serves them from.

``metrics_text(store)`` collects (``longrun.metrics``) with the store's fleet tables when the store
has them (read as ``longrun workers`` reads them: made on first use), and renders. The endpoint is
a ``ThreadingHTTPServer`` on 127.0.0.1 in a daemon thread: ``GET /metrics`` answers the text with
the exposition format's content type, anything else 404. It is read-only and holds no secret,
like a node exporter; bound to the loopback address, it reaches only scrapers on this machine
(or a tunnel an operator sets up). ``longrun console`` serves the same text at ``/metrics`` behind
its token.

Not guaranteed: a cheap scrape of a large store (each one loads every task's state).
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import threading
from typing import Any, Callable, TextIO

from ..errors import InvalidInputError, LongrunError
from ..metrics import CONTENT_TYPE, MetricsSnapshot, collect, render
from ..protocols import Store
from ._common import write_json

__all__ = ["CONTENT_TYPE", "MetricsEndpoint", "cmd_metrics", "metrics_text", "snapshot_of", "start_metrics_endpoint"]

log = logging.getLogger("longrun")


def snapshot_of(store: Store, *, ledgers: bool = True) -> MetricsSnapshot:
    """The store's metrics, with its fleet's (workers, queue) when the store can have a fleet;
    without ``ledgers``, those the summary rows answer (``metrics.collect``)."""
    from ..stores.queue import open_queue

    try:
        queue = open_queue(store)
    except InvalidInputError:  # a store no fleet runs on (an in-memory one): its tasks only
        return collect(store, ledgers=ledgers)
    try:
        return collect(store, queue, ledgers=ledgers)
    finally:
        queue.close()


def metrics_text(store: Store) -> str:
    """``snapshot_of(store)`` in the Prometheus text format."""
    return render(snapshot_of(store))


def cmd_metrics(store: Store, as_json: bool, out: TextIO, *, summaries: bool = False) -> int:
    snapshot = snapshot_of(store, ledgers=not summaries)
    if as_json:
        write_json(out, snapshot.to_json())
    else:
        out.write(render(snapshot))
    return 0


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "longrun-metrics"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # a scrape every few seconds is not news

    def do_GET(self) -> None:  # noqa: N802 (the base class's naming)
        server = self.server
        assert isinstance(server, MetricsEndpoint)
        if self.path.split("?", 1)[0] != "/metrics":
            self._send(404, "not found: the metrics are at /metrics\n", "text/plain; charset=utf-8")
            return
        try:
            body = server.text()
        except (LongrunError, OSError) as exc:
            log.warning("metrics endpoint: collecting failed: %s", exc)
            self._send(503, f"collecting the metrics failed: {exc}\n", "text/plain; charset=utf-8")
            return
        self._send(200, body, CONTENT_TYPE)

    def _send(self, status: int, body: str, content_type: str) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


class MetricsEndpoint(http.server.ThreadingHTTPServer):
    """``GET /metrics`` on 127.0.0.1:``port`` (0: any free port; ``port`` says which after binding)."""

    daemon_threads = True

    def __init__(self, text: Callable[[], str], port: int):
        self.text = text
        super().__init__(("127.0.0.1", port), _Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> "MetricsEndpoint":
        """Serve in a daemon thread (it never keeps the process alive)."""
        self._thread = threading.Thread(target=self.serve_forever, name="longrun-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.shutdown()
        self.server_close()


def start_metrics_endpoint(store: Store, port: int) -> MetricsEndpoint:
    """Bind 127.0.0.1:``port`` (``CliError``-worthy ``OSError`` if taken) and serve ``store``'s metrics."""
    return MetricsEndpoint(lambda: metrics_text(store), port).start()
