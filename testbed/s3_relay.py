"""SeaweedFS with only its S3 API on the host's network: ``weed server`` runs in a network namespace
of its own, and this process relays one host TCP port to the S3 gateway's Unix socket.

``python -m testbed.s3_relay --listen 127.0.0.1:PORT --socket DIR/s3.sock --hold P1,P2,... -- weed server ...``

SeaweedFS's master, volume server and filer trust whoever reaches their ports: the master hands a
write token to any caller of /dir/assign, and the filer's gRPC API creates entries for anyone. Inside
a namespace of their own those ports are not reachable from the host at all; the S3 gateway, which
checks signatures and the bucket policy, is reached through its ``-s3.localSocket`` in a private
directory. Where the kernel refuses the namespace (no CAP_SYS_ADMIN and no unprivileged user
namespaces), weed runs on the host's loopback as before, its filer and volume server still guarded
by the JWT keys testbed/s3.py gives them, its gRPC ports and the master's HTTP API by mutual TLS;
the first line written to ``DIR/isolation`` says which.

weed also names gRPC Unix sockets after its ports (/tmp/seaweedfs-<service>-grpc-<port>.sock), in
the host's /tmp whatever the network namespace, with the mode the umask leaves: weed runs with
umask 077, so only its own user can connect to them (under a loose umask, another user reached
the master's and filer's gRPC that way). Ports inside the namespace reserve nothing on the host, so
this process keeps the given ports (``--hold``) bound on the host's loopback for its lifetime: no
other server started here picks the same numbers and the same socket names.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

# unshare(2) flags and the interface ioctls of linux/sockios.h.
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_CHUNK = 1 << 18
# A port to hold was taken meanwhile (the caller chose it free, something bound it since): the
# caller starts again with other internal ports (EX_TEMPFAIL, sysexits.h).
PORT_TAKEN_EXIT = 75


def enter_network_namespace() -> str:
    """Move this (single-threaded) process into a new network namespace with its loopback up;
    return what was done, or raise OSError. Root needs no user namespace; anyone else gets one in
    which it is root, mapped to its own uid only (user_namespaces(7))."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWNET) != 0:
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"unshare(network): {os.strerror(ctypes.get_errno())}")
        for name, line in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            Path(f"/proc/self/{name}").write_text(line)
    # A new namespace's loopback is down and has no 127.0.0.1 until it is brought up.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))
    return "network namespace: only the S3 port reaches the host"


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _relay(client: socket.socket, upstream_path: str) -> None:
    with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        try:
            upstream.connect(upstream_path)
        except OSError:  # weed not serving yet (or any more): the client sees the connection close
            return
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()


def serve(listener: socket.socket, upstream_path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay, args=(client, upstream_path), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.s3_relay")
    parser.add_argument("--listen", required=True, help="host:port on the host's network")
    parser.add_argument("--socket", required=True, help="the S3 gateway's -s3.localSocket")
    parser.add_argument("--hold", default="", help="comma-separated ports to keep bound on the host")
    parser.add_argument("--shared-network", action="store_true", help="no namespace: weed on the host's loopback")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    host, port = args.listen.rsplit(":", 1)

    listener = socket.create_server((host, int(port)), backlog=128)
    held = []
    for number in filter(None, args.hold.split(",")):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", int(number)))
        except OSError as exc:
            print(f"s3_relay: port {number} is taken ({exc.strerror}); start again with others", flush=True)
            return PORT_TAKEN_EXIT
        held.append(s)
    try:
        if args.shared_network:
            raise OSError(0, "asked for the shared network")
        isolation = enter_network_namespace()
    except OSError as exc:
        for s in held:  # weed binds these itself on the host's loopback now
            s.close()
        isolation = (
            f"none ({exc.strerror}): weed's other ports listen on 127.0.0.1, filer and volume behind JWTs, "
            "gRPC and the master behind mutual TLS"
        )
    Path(args.socket).with_name("isolation").write_text(isolation + "\n")
    print(f"s3_relay: {args.listen} -> {args.socket}; isolation: {isolation}", flush=True)

    # The caller signals the whole process group: weed drains on SIGTERM and this process relays
    # until it has exited, then exits with its status.
    signal.signal(signal.SIGTERM, lambda *_: None)
    os.umask(0o077)  # weed's files and Unix sockets: its own user's only
    weed = subprocess.Popen(command)
    threading.Thread(target=serve, args=(listener, args.socket), daemon=True).start()
    return weed.wait()


if __name__ == "__main__":
    sys.exit(main())
