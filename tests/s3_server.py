"""A real S3-compatible server for tests: moto's server on 127.0.0.1 (a
separate process, stopped by PID), and the storage options to reach it.
``S3Server(indexed_list=True)``: the same server, its LIST answered from the
keys under the prefix (tests/moto_indexed.py), as an object store does."""

import contextlib
import os
import subprocess
import sys
import time
import uuid

from mv_assets.dagster.devserver import free_port


class S3Server:
    def __init__(self, indexed_list: bool = False) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        server = ([os.path.join(os.path.dirname(os.path.abspath(__file__)), "moto_indexed.py")] if indexed_list
                  else ["-m", "moto.server"])
        self.proc = subprocess.Popen(
            [sys.executable, *server, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.options = {
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing", "aws_region": "us-east-1",
            "aws_endpoint": self.endpoint, "allow_http": "true",
        }
        deadline = time.time() + 30
        while True:
            try:
                self.client().list_buckets()
                break
            except Exception:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def new_bucket(self) -> str:
        name = f"mvtest-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
