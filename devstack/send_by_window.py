"""How long the send-by check leaves open: from the check's last clock read to the first byte
handed to the socket, for a Stripe refund POST through the real SDK (`python -m devstack.send_by_window`).

A process paused inside that window sends late whatever the check said; everywhere else a late
process sends nothing (activities/payments.py)."""

from __future__ import annotations

import http.server
import socket
import statistics
import threading
import time

from activities import payments
from activities.payments import StripeGateway, send_before


def measure(requests: int = 2000) -> list[float]:
    """Microseconds between the check and the write, one per request."""
    class Ok(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"id": "re_1", "object": "refund", "amount": 100, "status": "succeeded", "metadata": {}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    checked: list[float] = []
    gaps: list[float] = []
    original_check, original_sendall = payments.check_send_by, socket.socket.sendall

    def check(what: str) -> None:
        original_check(what)
        checked.append(time.perf_counter())

    def sendall(sock: socket.socket, data: bytes, *args: object) -> None:
        if checked:
            gaps.append((time.perf_counter() - checked.pop()) * 1e6)
        original_sendall(sock, data, *args)

    payments.check_send_by, socket.socket.sendall = check, sendall
    try:
        gateway = StripeGateway("sk_test_window", f"http://127.0.0.1:{server.server_port}", 5.0, 0)
        for i in range(requests):
            with send_before(time.time() + 60):
                gateway.refund("pi_1", 100, f"key-{i}", {})
    finally:
        payments.check_send_by, socket.socket.sendall = original_check, original_sendall
        server.shutdown()
    return gaps


if __name__ == "__main__":
    gaps = sorted(measure())
    print(f"send-by check -> first byte written, {len(gaps)} refund POSTs: p50 {statistics.median(gaps):.1f} us, "
          f"p99 {gaps[int(len(gaps) * 0.99)]:.1f} us, max {gaps[-1]:.1f} us")
