"""Metadata helpers shared by the assets."""

import base64
from pathlib import Path

import dagster as dg


def png_metadata(path: Path) -> dg.MetadataValue:
    """A PNG inline in the asset's metadata: the UI renders Markdown images with a data URI, so
    the figure is visible without access to the data directory."""
    encoded = base64.b64encode(path.read_bytes()).decode()
    return dg.MetadataValue.md(f"![{path.stem}](data:image/png;base64,{encoded})")
