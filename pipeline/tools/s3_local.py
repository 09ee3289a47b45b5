"""A local S3 endpoint: ``moto[server]`` (a dev dependency) on 127.0.0.1, on a free port, for the
tests and the benches that put the files on object storage.

The endpoint checks signatures: its first requests (unauthenticated, see moto's
``INITIAL_NO_AUTH_ACTION_COUNT``) make one IAM user with an access key allowed everything on S3,
and every later request must be signed with that key, so a wrong secret is refused as AWS
refuses it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REGION = "us-east-1"
SETUP_REQUESTS = 3  # create_user, put_user_policy, create_access_key


@dataclass(frozen=True)
class Endpoint:
    url: str
    access_key_id: str
    secret_access_key: str

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point stormlake (and delta-rs, DuckDB) here."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    def client(self):  # -> botocore S3 client
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name=REGION, aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=self.secret_access_key)

    def new_bucket(self, prefix: str = "sl") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload(self, folder: Path, url: str) -> None:
        """Every file under ``folder`` to ``s3://bucket/prefix`` (one PUT each), keeping relative paths."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        client = self.client()
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                key = f"{prefix.strip('/')}/{path.relative_to(folder).as_posix()}".lstrip("/")
                client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

    def keys(self, url: str) -> dict[str, bytes]:
        """Key (relative to the prefix) -> bytes of every object under ``url``."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        client = self.client()
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"][len(prefix):]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(proc: subprocess.Popen, port: int, within_s: float, log: Path, what: str) -> None:
    """Wait until a server ``proc`` started accepts connections on 127.0.0.1:``port``; raise ``what``
    with the end of its ``log`` when it exits first or ``within_s`` pass."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"{what}: {text}") from None
            time.sleep(0.05)


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a local server started for a while (SIGTERM; SIGKILL after 10 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def moto_endpoint(log: Path) -> Iterator[Endpoint]:
    """Start ``moto_server`` on a free port of 127.0.0.1; stop it on leaving."""
    import boto3

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = Path(sys.executable).with_name("moto_server")
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_REQUESTS)}
    with log.open("wb") as out:
        proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(proc, port, 60, log, f"moto_server did not start on {url}")
        iam = boto3.client("iam", endpoint_url=url, region_name=REGION, aws_access_key_id="setup",
                           aws_secret_access_key="setup")
        iam.create_user(UserName="stormlake")
        iam.put_user_policy(UserName="stormlake", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="stormlake")["AccessKey"]
        yield Endpoint(url, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        stop_server(proc)


def s3_settings(endpoint: Endpoint, bucket: str) -> dict[str, str]:
    """Landing, lake and published on ``bucket``, and the AWS variables to reach it."""
    return {**endpoint.env(), "STORMLAKE_LANDING": f"s3://{bucket}/landing", "STORMLAKE_LAKE": f"s3://{bucket}/lake",
            "STORMLAKE_PUBLISH_DIR": f"s3://{bucket}/published"}
