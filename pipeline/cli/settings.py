"""`mirai settings`: every setting as README.md's table lists it (generated from pipeline/config.py)."""

from __future__ import annotations

import argparse

from pipeline.config import settings_table


def cmd_settings(args: argparse.Namespace) -> int:
    print(settings_table(), end="")
    return 0


def add_settings(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "settings",
        parents=[debug],
        help="every setting: its environment variable, group (Dagster resource), default and meaning",
    )
    p.set_defaults(func=cmd_settings)
