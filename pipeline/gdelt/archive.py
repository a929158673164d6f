"""Open GDELT's 15-minute ``.zip`` files without trusting them.

Every GDELT 2.0 zip holds exactly one member, the CSV named after the zip. Downloads go wrong in
ways that look like zips from the outside: a downloader once saved ``lastupdate.txt`` text under a
``.export.CSV.zip`` name, transfers get cut short, bytes get flipped. Each of those is refused here
with a :class:`CorruptArchiveError` that says which of them happened, so the caller can quarantine
the file instead of parsing garbage.

A zip can also be exactly what GDELT's index lists and still be hostile: a few hundred KB that
inflate to hundreds of MB. The member is therefore only ever read as a stream, a chunk at a time,
and refused as soon as it inflates past a cap (:data:`DEFAULT_MAX_UNCOMPRESSED_BYTES`, sized from
real files in docs/data-layout.md, "Hostile GDELT files"). :func:`verify_gdelt_zip` checks a zip
on disk holding one chunk at a time, :func:`stream_gdelt_zip` hands the member over one chunk at a
time (what the parser reads), and :func:`open_gdelt_zip` fills one buffer of at most the cap.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from pipeline.config import DEFAULT_MAX_UNCOMPRESSED_MB

# A zip starts with a local file header; an archive with no members starts with its end record.
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")

# Decompression step: small enough that a zip bomb is stopped within one step of the cap.
_CHUNK_BYTES = 1 << 20

# Sized from real files: see pipeline/config.py and docs/data-layout.md.
DEFAULT_MAX_UNCOMPRESSED_BYTES = DEFAULT_MAX_UNCOMPRESSED_MB * 2**20

# What a zip of one member adds to it at most: headers of a few hundred bytes (local, central,
# end record, zip64 extras). Its data is the member stored, or compressed, which expands data that
# does not compress by far less than 1/64 (deflate: 5 bytes per 64 KiB block; bzip2: ~1%).
_ZIP_SLACK_BYTES = 64 * 2**10


def max_zip_bytes(max_uncompressed_bytes: int) -> int:
    """The most bytes a single-member zip whose member is within ``max_uncompressed_bytes`` can
    take. zipfile ignores bytes before an archive (a self-extractor's stub), so a file of any size
    can verify as a zip of a small member: its size must be bounded on its own. Real GDELT zips
    are ~0.1-2 MB (docs/data-layout.md, "Why 32 MiB"), 17x under this at the default cap."""
    return max_uncompressed_bytes + max_uncompressed_bytes // 64 + _ZIP_SLACK_BYTES


class CorruptArchiveError(ValueError):
    """The bytes are not a sound single-member zip archive (or it inflates past the cap)."""


def is_zip(data: bytes) -> bool:
    """True when ``data`` starts with a zip signature (says nothing about the rest being sound)."""
    return data[:4] in _ZIP_MAGIC


def open_gdelt_zip(data: bytes, *, max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES) -> tuple[str, bytes]:
    """Return ``(member name, member bytes)`` of a single-member GDELT zip.

    Raises :class:`CorruptArchiveError` when ``data`` is not a zip, is truncated or damaged, fails
    its CRC check, holds zero or several members, or unpacks to more than
    ``max_uncompressed_bytes`` (checked against the declared size first, then while inflating).
    The member is written chunk by chunk into one growing buffer whose bytes are returned as they
    are (``BytesIO.getvalue`` hands over its buffer without a copy), so at no point is the member
    held twice.
    """
    if not is_zip(data):
        raise CorruptArchiveError(f"not a zip archive ({len(data):,} bytes starting {data[:24]!r})")
    out = io.BytesIO()
    with _single_member(io.BytesIO(data), f"{len(data):,} bytes", max_uncompressed_bytes) as (archive, member):
        for chunk in _inflate(archive, member, max_uncompressed_bytes):
            out.write(chunk)
    return member.filename, out.getvalue()


def stream_gdelt_zip(data: bytes, *, max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES) -> Iterator[bytes]:
    """The member of a single-member GDELT zip as it inflates, at most :data:`_CHUNK_BYTES` at a
    time; refused as :func:`open_gdelt_zip` refuses it, with the CRC checked once the last chunk
    has been read. Only the chunk in hand is held, whatever the member inflates to.
    """
    if not is_zip(data):
        raise CorruptArchiveError(f"not a zip archive ({len(data):,} bytes starting {data[:24]!r})")
    with _single_member(io.BytesIO(data), f"{len(data):,} bytes", max_uncompressed_bytes) as (archive, member):
        yield from _inflate(archive, member, max_uncompressed_bytes)


def verify_gdelt_zip(path: Path, *, max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES) -> int:
    """Check the zip at ``path`` as :func:`open_gdelt_zip` would, reading it from disk and
    inflating its member one chunk at a time (CRC included); returns the member's size.

    Memory stays at one chunk whatever the member inflates to.
    """
    with open(path, "rb") as fh:
        if not is_zip(head := fh.read(24)):
            raise CorruptArchiveError(f"not a zip archive ({path.stat().st_size:,} bytes starting {head!r})")
        fh.seek(0)
        with _single_member(fh, f"{path.stat().st_size:,} bytes", max_uncompressed_bytes) as (archive, member):
            return sum(len(chunk) for chunk in _inflate(archive, member, max_uncompressed_bytes))


def declared_member_size(data: bytes) -> int | None:
    """The uncompressed size the single member of zip ``data`` declares; None when ``data`` is
    not a readable single-member zip (opening it properly then says why)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError):
        return None
    return members[0].file_size if len(members) == 1 else None


@contextmanager
def _single_member(fh: IO[bytes], what: str, cap: int) -> Iterator[tuple[zipfile.ZipFile, zipfile.ZipInfo]]:
    """The archive in ``fh`` and its only member, after the checks that need no inflating
    (member count, directory, declared size); ``what`` describes ``fh`` in messages."""
    try:
        archive = zipfile.ZipFile(fh)
    except zipfile.BadZipFile as exc:
        raise CorruptArchiveError(f"truncated or damaged zip archive ({what}): {exc}") from exc
    with archive:
        members = archive.infolist()
        if len(members) != 1:
            names = [m.filename for m in members]
            raise CorruptArchiveError(
                f"a GDELT zip holds exactly one member, this one holds {len(members)}: {names[:5]}"
            )
        (member,) = members
        if member.is_dir():
            raise CorruptArchiveError(f"the only member, {member.filename!r}, is a directory")
        if member.file_size > cap:
            raise CorruptArchiveError(
                f"member {member.filename!r} declares {member.file_size:,} bytes uncompressed, above the cap of {cap:,}"
            )
        yield archive, member


def _inflate(archive: zipfile.ZipFile, member: zipfile.ZipInfo, cap: int) -> Iterator[bytes]:
    """``member``'s bytes chunk by chunk, stopping as soon as the output passes ``cap``.

    The declared size was checked already, but it is just a number in the archive. CPython's
    zipfile currently stops inflating at the declared size (an understated size then fails the
    CRC check), yet that is an implementation detail; counting the bytes actually produced keeps
    the cap a hard memory bound whatever the header says and whatever zipfile does. zipfile checks
    the CRC when the stream reaches its end, so a consumer that reads every chunk has checked it.
    """
    produced = 0
    try:
        with archive.open(member) as stream:
            while chunk := stream.read(_CHUNK_BYTES):
                produced += len(chunk)
                if produced > cap:
                    raise CorruptArchiveError(
                        f"member {member.filename!r} inflates past the cap of {cap:,} bytes "
                        f"(declared {member.file_size:,})"
                    )
                yield chunk
    # zipfile reports a CRC mismatch or a bad local header as BadZipFile, a stream cut short as
    # EOFError, garbled deflate data as zlib.error, encryption as RuntimeError and an exotic
    # compression method as NotImplementedError. None of them can come from a sound GDELT zip.
    except zipfile.BadZipFile as exc:
        raise CorruptArchiveError(f"member {member.filename!r} is damaged: {exc}") from exc
    except (EOFError, zlib.error) as exc:
        raise CorruptArchiveError(
            f"member {member.filename!r} is truncated or its compressed data is damaged: {exc}"
        ) from exc
    except (RuntimeError, NotImplementedError) as exc:
        raise CorruptArchiveError(f"member {member.filename!r} cannot be read: {exc}") from exc
