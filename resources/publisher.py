"""Delivery targets of the present phase (contract section 6): the publish location and a webhook.

The publish location is a folder (target ``file``) or an ``s3://bucket/prefix`` (target ``s3``),
written through :mod:`resources.storage`.

A target only performs the side effect; the runner wraps every delivery in a receipt
(PENDING committed before, DELIVERED after), so a target may be asked to deliver the same
artifact again after a crash, always under the same artifact id and ``Idempotency-Key``.
The key is the artifact id, or ``<artifact id>#<generation>`` when the same bytes become the
current revision again after another one (a partition's inputs went A -> B -> A).
"""

from __future__ import annotations

import hashlib
import http.client
import random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from resources.errors import DeliveryExhausted, DeliveryRejected
from resources.storage import Storage, open_storage

CONTENT_TYPES = {
    "summary.json": "application/json",
    "clusters.geojson": "application/geo+json",
    "report.html": "text/html; charset=utf-8",
}
#: The artifacts present delivers, in the order it renders them.
ARTIFACT_KINDS = tuple(CONTENT_TYPES)


@dataclass(frozen=True)
class Artifact:
    region_id: str
    day: str
    kind: str
    data: bytes

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def artifact_id(self) -> str:
        return f"{self.region_id}/{self.day}/{self.kind}@{self.content_hash[:16]}"

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.kind]


class Target(Protocol):
    name: str

    def ref(self, artifact: Artifact) -> str: ...

    def shown_ref(self, artifact: Artifact) -> str:
        """Where the artifact goes, as printed, logged and kept in its receipt (no secret)."""

    def deliver(self, artifact: Artifact, *, supersedes: str | None,
                idempotency_key: str | None = None) -> dict[str, Any]: ...


class FileTarget:
    """Writes ``<publish_dir>/<region>/<day>/<kind>`` whole: in a folder a temporary name, fsync,
    rename and fsync of the folder (target ``file``); on S3 one PUT of the object (target ``s3``)."""

    def __init__(self, publish_dir: Path | str | Storage):
        self.storage = open_storage(publish_dir)
        self.name = self.storage.kind

    @staticmethod
    def rel(artifact: Artifact) -> str:
        return f"{artifact.region_id}/{artifact.day}/{artifact.kind}"

    def ref(self, artifact: Artifact) -> str:
        return self.storage.url(self.rel(artifact))

    def shown_ref(self, artifact: Artifact) -> str:
        return self.ref(artifact)

    def deliver(self, artifact: Artifact, *, supersedes: str | None,
                idempotency_key: str | None = None) -> dict[str, Any]:
        final = self.storage.put(self.rel(artifact), artifact.data, durable=True)
        return {"path": final, "bytes": len(artifact.data)}


class WebhookTarget:
    """POSTs each artifact with the contract's headers; retries 5xx, 429 and timeouts."""

    name = "webhook"

    def __init__(self, url: str, *, timeout_s: float = 10.0, max_tries: int = 5, backoff_s: float = 0.5):
        self.url = url
        self.shown = shown_url(url)
        self.timeout_s = timeout_s
        self.max_tries = max(1, max_tries)
        self.backoff_s = backoff_s

    def ref(self, artifact: Artifact) -> str:
        return self.url

    def shown_ref(self, artifact: Artifact) -> str:
        return self.shown

    def headers(self, artifact: Artifact, supersedes: str | None,
                idempotency_key: str | None = None) -> dict[str, str]:
        h = {
            "Content-Type": artifact.content_type,
            "Idempotency-Key": idempotency_key or artifact.artifact_id,
            "X-Stormlake-Artifact-Id": artifact.artifact_id,
            "X-Stormlake-Region": artifact.region_id,
            "X-Stormlake-Day": artifact.day,
            "X-Stormlake-Kind": artifact.kind,
            "X-Stormlake-Content-SHA256": artifact.content_hash,
        }
        if supersedes:
            h["X-Stormlake-Supersedes"] = supersedes
        return h

    def deliver(self, artifact: Artifact, *, supersedes: str | None,
                idempotency_key: str | None = None) -> dict[str, Any]:
        headers = self.headers(artifact, supersedes, idempotency_key)
        last = ""
        for attempt in range(1, self.max_tries + 1):
            req = urllib.request.Request(self.url, data=artifact.data, headers=headers, method="POST")
            retry_after: float | None = None
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    resp.read()
                    return {"status": resp.status, "tries": attempt}
            except urllib.error.HTTPError as exc:
                code = exc.code
                exc.close()
                if code == 409:  # the consumer already has this delivery (its Idempotency-Key)
                    return {"status": 409, "tries": attempt}
                if code == 429 or 500 <= code <= 599:
                    last = f"HTTP {code}"
                    ra = exc.headers.get("Retry-After") if exc.headers else None
                    if ra and ra.strip().isdigit():
                        retry_after = min(float(ra), 30.0)
                else:
                    raise DeliveryRejected(
                        f"webhook {self.shown} answered HTTP {code} for {artifact.artifact_id}; not retried"
                    ) from None
            except TimeoutError:
                last = f"timed out after {self.timeout_s:g} s"
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, (TimeoutError, socket.timeout)):
                    last = f"timed out after {self.timeout_s:g} s"
                else:
                    last = f"{reason.__class__.__name__}: {reason}"
            if attempt < self.max_tries:
                delay = self.backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random())
                time.sleep(retry_after if retry_after is not None else delay)
        raise DeliveryExhausted(
            f"webhook {self.shown} did not accept {artifact.artifact_id} after {self.max_tries} tries ({last})"
        )


def shown_url(url: str) -> str:
    """The webhook URL as stormlake prints, logs and records it: scheme, host, port and path; a
    user name, password, query or fragment (where tokens go) is left out, marked ``…``.

    Example:
        >>> shown_url("https://hook:S3CRET@consumer.example:8443/in?token=T0KEN#x")
        'https://consumer.example:8443/in?…'
        >>> shown_url("http://127.0.0.1:9000/hook")
        'http://127.0.0.1:9000/hook'
        >>> shown_url("garbage")
        '(STORMLAKE_WEBHOOK_URL, not a URL)'
    """
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "(STORMLAKE_WEBHOOK_URL, not a URL)"
    if not parts.scheme or not parts.hostname:
        return "(STORMLAKE_WEBHOOK_URL, not a URL)"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    hidden = "?…" if parts.query or parts.fragment else ""
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}{parts.path}{hidden}"


def build_targets(publish_dir: Path | str, webhook_url: str | None, *, timeout_s: float = 10.0,
                  max_tries: int = 5, backoff_s: float = 0.5) -> list[Target]:
    targets: list[Target] = [FileTarget(publish_dir)]
    if webhook_url:
        targets.append(WebhookTarget(webhook_url, timeout_s=timeout_s, max_tries=max_tries, backoff_s=backoff_s))
    return targets
