"""The code version recorded in every manifest: the package version plus, in a git checkout, the
commit (with "+dirty" when the work tree differs), so a release says exactly which code built it."""

from __future__ import annotations

import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


@cache
def code_version() -> str:
    try:
        base = version("mirai-pipeline")
    except PackageNotFoundError:
        base = "unknown"
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty=+dirty", "--abbrev=12", "--exclude=*"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return base
    return f"{base}+g{commit}" if commit else base
