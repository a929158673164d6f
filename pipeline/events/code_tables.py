"""The code tables of rules 3 to 5 (pipeline/events/normalize.py) as integer lookups: each CAMEO
country code to a small country id (or ``EXCLUDED``/``UNKNOWN``), each relation code to whether it
is one of MIRAI's level-2 codes. A 3-byte code is its own index into a dense array, read straight
from the Arrow string views where that is known to work, else through polars' Enum cast.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.reference.tables import cameo_to_iso3, country_table, level2_codes

CODE_BYTES = 3
EXCLUDED, UNKNOWN = 254, 255  # country ids of a code the table excludes / does not know


@dataclass(frozen=True)
class CodeMap:
    """One small table of rules 3 to 5: a value for each of some codes, ``values[-1]`` for any
    other string and for null.

    Every CAMEO country and relation code is 3 bytes, so a code can be its own index into an
    array of 2**24 entries (16 MiB): looking up a batch is then one numpy gather instead of a hash
    lookup per row (polars' Enum cast took 5x longer on the benchmark month). That needs each
    value's bytes as an integer, read from the Arrow string views (``_code_keys``); where that
    read is not known to work (``_string_views_readable``), the lookup goes through the Enum cast.
    """

    codes: pl.Series  # String, unique, each CODE_BYTES long
    values: np.ndarray  # len(codes) + 1

    @cached_property
    def dense(self) -> np.ndarray:
        table = np.full(1 << 8 * CODE_BYTES, self.values[-1], dtype=self.values.dtype)
        table[_code_keys(self.codes)] = self.values[:-1]
        return table

    def lookup(self, column: pl.Series) -> np.ndarray:
        if _string_views_readable():
            return self.dense.take(_code_keys(column))
        index = column.cast(pl.Enum(self.codes), strict=False).to_physical()
        return self.values.take(index.fill_null(len(self.codes)).to_numpy())


@dataclass(frozen=True)
class CodeLookups:
    """The country and relation tables of rules 3 to 5.

    ``country`` gives a code the position of its ISO alpha-3 in ``countries``, or ``EXCLUDED``
    for a code the table excludes, or ``UNKNOWN`` for a code it does not know; two codes are the
    same country exactly when their values are equal. ``relation`` is true for MIRAI's level-2
    codes.
    """

    country: CodeMap  # uint8 values
    relation: CodeMap  # bool values
    countries: pl.Series  # ISO alpha-3 codes, sorted


@cache
def code_lookups() -> CodeLookups:
    table = country_table()
    iso = dict(cameo_to_iso3().iter_rows())
    if None in iso.values():  # tests/test_reference.py: only excluded codes lack an ISO code
        raise ValueError("the country table gives no ISO code for a code it does not exclude")
    countries = sorted(set(iso.values()))
    if len(countries) + 2 > 256:
        raise ValueError(f"{len(countries)} countries do not fit the uint8 country ids")
    position = {code: i for i, code in enumerate(countries)}
    codes = table.get_column("cameo_code")
    relations = pl.Series(sorted(level2_codes()), dtype=pl.String)
    for name, column in (("country", codes), ("relation", relations)):
        if not (column.str.len_bytes() == CODE_BYTES).all() or column.n_unique() != len(column):
            raise ValueError(f"every {name} code must be {CODE_BYTES} bytes and listed once for the lookups")
    country_ids = [position[iso[code]] if code in iso else EXCLUDED for code in codes]
    return CodeLookups(
        CodeMap(codes, np.array([*country_ids, UNKNOWN], dtype=np.uint8)),
        CodeMap(relations, np.append(np.ones(len(relations), dtype=bool), False)),
        pl.Series(countries, dtype=pl.String),
    )


def _code_keys(column: pl.Series) -> np.ndarray:
    """Each value's bytes as an integer when it is ``CODE_BYTES`` long, else 0 (which no code has).

    Read from the Arrow string views themselves (Arrow columnar format, "Variable-size Binary
    View Layout": 16 bytes a value, the length as an int32, then strings of up to 12 bytes
    inline), so nothing is copied or hashed. This relies on polars exporting string views and on
    the layout: callers check ``_string_views_readable()`` first. Null values get whatever their
    view holds: callers decide nulls from the column's validity.
    """
    arr = column.to_arrow(compat_level=pl.CompatLevel.newest())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type != pa.string_view():
        arr = arr.cast(pa.string_view())
    # Each view as four u32: the length, then the first 4 bytes (the whole of a short code).
    views = np.frombuffer(arr.buffers()[1], dtype=np.uint32)[4 * arr.offset : 4 * (arr.offset + len(arr))]
    keys = views[1::4] & np.uint32((1 << 8 * CODE_BYTES) - 1)
    keys[views[::4] != CODE_BYTES] = 0
    return keys


@cache
def _string_views_readable() -> bool:
    """Whether ``_code_keys`` reads right here: a little-endian machine, polars 2 (whose
    ``to_arrow(compat_level=newest)`` gives string views) and a probe of every case read back
    as expected. Else the lookups take the public path; tests/test_normalize.py fails on it."""
    if sys.byteorder != "little" or pl.__version__.split(".")[0] != "2":
        return False
    values = ["IRN", "US", "USAF", "", "Ü1", "a much longer string", "ISR", "0\x00A", "CHN"]
    probe = pl.concat([pl.Series(values[:4]), pl.Series(values[4:])], rechunk=False).slice(1)
    expected = [int.from_bytes(b, "little") if len(b) == CODE_BYTES else 0 for b in (v.encode() for v in values[1:])]
    try:
        return _code_keys(probe).tolist() == expected
    except Exception:
        return False
