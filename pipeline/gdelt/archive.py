"""Open GDELT's 15-minute ``.zip`` files without trusting them.

Every GDELT 2.0 zip holds exactly one member, the CSV named after the zip. Downloads go wrong in
ways that look like zips from the outside: a downloader once saved ``lastupdate.txt`` text under a
``.export.CSV.zip`` name, transfers get cut short, bytes get flipped. Each of those is refused here
with a :class:`CorruptArchiveError` that says which of them happened, so the caller can quarantine
the file instead of parsing garbage.
"""

from __future__ import annotations

import io
import zipfile
import zlib

# A zip starts with a local file header; an archive with no members starts with its end record.
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")

# Decompression step: small enough that a zip bomb is stopped within one step of the cap.
_CHUNK_BYTES = 1 << 20

DEFAULT_MAX_UNCOMPRESSED_BYTES = 512 * 2**20


class CorruptArchiveError(ValueError):
    """The bytes are not a sound single-member zip archive."""


def is_zip(data: bytes) -> bool:
    """True when ``data`` starts with a zip signature (says nothing about the rest being sound)."""
    return data[:4] in _ZIP_MAGIC


def open_gdelt_zip(
    data: bytes, *, max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES
) -> tuple[str, bytes]:
    """Return ``(member name, member bytes)`` of a single-member GDELT zip.

    Raises :class:`CorruptArchiveError` when ``data`` is not a zip, is truncated or damaged, fails
    its CRC check, holds zero or several members, or unpacks to more than
    ``max_uncompressed_bytes`` (checked against the declared size first, then while inflating).
    """
    if not is_zip(data):
        raise CorruptArchiveError(f"not a zip archive ({len(data):,} bytes starting {data[:24]!r})")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise CorruptArchiveError(
            f"truncated or damaged zip archive ({len(data):,} bytes): {exc}"
        ) from exc
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
        if member.file_size > max_uncompressed_bytes:
            raise CorruptArchiveError(
                f"member {member.filename!r} declares {member.file_size:,} bytes uncompressed, "
                f"above the cap of {max_uncompressed_bytes:,}"
            )
        return member.filename, _inflate(archive, member, max_uncompressed_bytes)


def _inflate(archive: zipfile.ZipFile, member: zipfile.ZipInfo, cap: int) -> bytes:
    """Read ``member`` chunk by chunk, stopping as soon as the output passes ``cap``.

    The declared size was checked already, but it is just a number in the archive. CPython's
    zipfile currently stops inflating at the declared size (an understated size then fails the
    CRC check), yet that is an implementation detail; counting the bytes actually produced keeps
    the cap a hard memory bound whatever the header says and whatever zipfile does.
    """
    chunks: list[bytes] = []
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
                chunks.append(chunk)
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
    return b"".join(chunks)
