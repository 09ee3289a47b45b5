"""The test consumer behaves like an HTTP server when a producer dies mid-request."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from tests.consumer import Consumer


def _post(url: str, body: bytes, *, declared: int) -> bytes:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(f"POST {parts.path} HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n"
                  f"Idempotency-Key: r/2026-09-01/summary.json@0123456789abcdef\r\n\r\n".encode() + body)
        if len(body) < declared:
            s.shutdown(socket.SHUT_WR)  # the producer is gone before its body is complete
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
            if len(body) == declared:
                break
        return b"".join(chunks)


def test_a_body_cut_short_is_neither_recorded_nor_answered() -> None:
    with Consumer() as consumer:
        assert _post(consumer.url, b"{\"a\"", declared=2593) == b""
        assert consumer.snapshot() == []
        answer = _post(consumer.url, b"{}", declared=2)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert [p.size for p in consumer.snapshot()] == [2]
