"""Why a GDELT file is refused whole, none of its lines kept: the exceptions, and the two checks
that need the whole file (its line count, its format by field-count vote).

pipeline/gdelt/parse.py makes these checks on what a file's chunks add up to; pipeline/gdelt/ingest.py
quarantines the files refused (docs/data-layout.md, "Parsing GDELT files", "Hostile GDELT files").
"""

from __future__ import annotations

from pipeline.gdelt.schema import KNOWN_FIELD_COUNTS


class RefusedFileError(ValueError):
    """The file as a whole cannot be parsed as the kind asked for; none of its lines is kept."""


class ImplausibleLinesError(RefusedFileError):
    """The file has far more lines than GDELT rows of its size could make (see
    :data:`SHORTEST_ROW_BYTES`)."""


class GdeltFormatError(RefusedFileError):
    """The file is not the GDELT format it was parsed as (wrong feed, wrong version)."""

    def __init__(self, message: str, *, expected: int, detected: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.detected = detected


# The shortest line a row can be: every TAB, the key columns at their narrowest (a 1-digit
# GLOBALEVENTID, 14-digit timestamps) and the newline. A real export line averages ~400 bytes and
# a mentions line ~200 (real files from public repositories, docs/data-layout.md "Why 32 MiB").
SHORTEST_ROW_BYTES: dict[str, int] = {
    "export": 60 + 1 + 14 + 1,  # 60 TABs, GLOBALEVENTID, DATEADDED, \n
    "mentions": 15 + 1 + 14 + 14 + 1,  # 15 TABs, GLOBALEVENTID, EventTimeDate, MentionTimeDate, \n
}


# Below this many lines a file is never refused for its line count: a near-empty real file with a
# few blank lines stays a file of rejects.
_FEW_LINES = 1000


def most_lines(size: int, kind: str) -> int:
    """The most lines a ``kind`` file of ``size`` bytes may have: as many as rows of the shortest
    possible length would make, and never fewer than a few."""
    return max(_FEW_LINES, size // SHORTEST_ROW_BYTES[kind])


def check_line_count(lines: int, size: int, source: str, kind: str) -> None:
    """Raise :class:`ImplausibleLinesError` when a file of ``size`` bytes has ``lines`` lines,
    more than :func:`most_lines`."""
    if lines > most_lines(size, kind):
        raise ImplausibleLinesError(
            f"{source}: {lines:,} lines in {size:,} bytes, {size / lines:.1f} bytes per line on average; "
            f"a GDELT 2.0 {kind} row is at least {SHORTEST_ROW_BYTES[kind]} bytes, so this is not a {kind} file"
        )


def check_format(votes: dict[int, int], kind: str, expected: int, source: str) -> None:
    """Raise :class:`GdeltFormatError` unless ``expected`` is strictly the most common field
    count among the voters (``votes``: field count -> lines, see :func:`_votes`).

    Only decodable, non-blank lines vote, so a handful of broken lines cannot make a file look
    like another format, and a file of nothing but broken lines is left to the rejects."""
    expected_votes = votes.get(expected, 0)
    if 2 * expected_votes > sum(votes.values()):  # a majority: the common case
        return
    ranked = sorted(votes.items(), key=lambda vote: (-vote[1], vote[0]))
    rivals = [(n, c) for n, c in ranked if n != expected]
    if not rivals:
        return
    detected, detected_votes = rivals[0]
    if detected_votes < expected_votes:
        return
    what = KNOWN_FIELD_COUNTS.get(detected, f"no known GDELT format ({detected} fields per line)")
    counts = ", ".join(f"{n} fields ×{c:,}" for n, c in ranked)
    raise GdeltFormatError(
        f"{source}: this is {what}, not {KNOWN_FIELD_COUNTS[expected]} ({expected} columns) "
        f"as expected by parse_{kind} (lines by field count: {counts})",
        expected=expected,
        detected=detected,
    )
