"""GDELT 2.0 raw files: opening the zips and parsing exports and mentions into typed frames."""

from pipeline.gdelt.archive import CorruptArchiveError, open_gdelt_zip
from pipeline.gdelt.parse import ParsedFile, parse_export, parse_mentions
from pipeline.gdelt.refusals import GdeltFormatError

__all__ = [
    "CorruptArchiveError",
    "GdeltFormatError",
    "ParsedFile",
    "open_gdelt_zip",
    "parse_export",
    "parse_mentions",
]
