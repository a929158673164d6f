"""What the `mirai` commands share: the argument types, the parser class, the error a command
raises to stop (``CommandError``) and the one line an unexpected error is reported as.

The underscore names are the package's own: its modules import them, nothing outside does."""

from __future__ import annotations

import argparse
import importlib
import re
from datetime import date

# problem_line imports requests, botocore and pipeline.http when an error is reported, not at start:
# they would add ~45 ms to every `mirai --help`.


def day_arg(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, got {text!r}") from exc


def share_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from exc
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1] of GDELT's events per slot, got {text}")
    return value


def count_arg(minimum: int, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from exc
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"expected {bounds}, got {value}")
        return value

    return parse


port_arg = count_arg(0, 65535)


def month_arg(text: str) -> date:
    try:
        return date.fromisoformat(f"{text}-01" if len(text) == 7 else text).replace(day=1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid month {text!r}: expected YYYY-MM") from exc


def release_name_arg(text: str) -> str:
    """``latest`` or a real month YYYY-MM (2024-13 is refused here, not reported as unpublished)."""
    if text == "latest":
        return text
    if len(text) != 7:
        raise argparse.ArgumentTypeError(f"invalid month {text!r}: expected latest or YYYY-MM")
    return f"{month_arg(text):%Y-%m}"


class CommandError(Exception):
    """A command cannot run as asked: main() prints the message as one line and exits with ``status``."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def testbed_module(module: str):
    """A module of testbed/, the demo's and tests' stand-ins (GDELT mirror, news sites, S3 server):
    it ships with the source checkout, not with the library (the Docker image has none)."""
    try:
        return importlib.import_module(f"testbed.{module}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("testbed", f"testbed.{module}"):
            raise
        raise CommandError(
            "this command needs testbed/ (the generated mirror, news sites and S3 server), "
            "which ships with the source checkout, not with this install"
        ) from None


def check_ordered(start: date | None, end: date | None, start_flag: str, end_flag: str) -> None:
    if start is not None and end is not None and end < start:
        raise CommandError(f"{end_flag} {end} is before {start_flag} {start}: nothing to do", status=2)


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (what is wrong, where to read the usage), not the
    usage block followed by the error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` shows the usage)\n")


def problem_line(exc: Exception) -> str:
    """One line naming what went wrong, for the errors a user meets (no network, no S3 server, no
    credentials, a missing file); anything else is named by its type and message."""
    import requests
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    from pipeline.http import TransientHTTPError

    if isinstance(exc, requests.ConnectionError):
        url = exc.request.url if exc.request is not None else "the server"
        reason = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
        return f"cannot reach {url}: {reason.group(0) if reason else exc} (no network, or the server is down?)"
    if isinstance(exc, (requests.RequestException, TransientHTTPError)):
        return f"network error: {exc}"
    if isinstance(exc, EndpointConnectionError):
        return (
            f"cannot reach the S3 endpoint: {exc} (is the server running? `mirai serve-release` serves the "
            "demo's; MIRAI_S3_ENDPOINT_URL names the endpoint)"
        )
    if isinstance(exc, NoCredentialsError):
        return f"S3: {exc}: set them in the standard AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
    if isinstance(exc, (BotoCoreError, ClientError)):
        return f"S3: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}"
