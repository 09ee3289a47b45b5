"""The local S3 endpoint of the tests (pipeline/tools/s3_local.py: ``moto[server]`` on 127.0.0.1),
and the settings that put a test's files on it."""

from __future__ import annotations

from pathlib import Path

from pipeline.tools.s3_local import REGION, Endpoint, free_port, moto_endpoint, s3_settings

__all__ = ["REGION", "Endpoint", "free_port", "moto_endpoint", "s3_settings", "files_on"]


def files_on(where: str, request, monkeypatch, landing: Path) -> dict[str, str]:  # noqa: ANN001
    """Settings putting landing, lake and published ``where`` ("local": none, the home's folders;
    "s3": a fresh bucket of the session's endpoint holding a copy of ``landing``). The AWS
    variables are set in this process too, for the test's own reads."""
    if where == "local":
        return {}
    endpoint: Endpoint = request.getfixturevalue("s3_endpoint")
    bucket = endpoint.new_bucket()
    settings = s3_settings(endpoint, bucket)
    endpoint.upload(landing, settings["STORMLAKE_LANDING"])
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)
    return settings
