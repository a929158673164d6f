"""How a split's dataset card writes what it reads from a manifest: a nested optional value (or
"not recorded"), a number with thousands separators, a Markdown table. Shared by card.py and
card_composition.py, so it sits below both.
"""

from __future__ import annotations


def manifest_value(mapping: dict | None, *keys: str, default: str = "not recorded"):
    """A nested optional manifest value, or a placeholder saying it was not recorded."""
    for key in keys:
        if not isinstance(mapping, dict) or mapping.get(key) is None:
            return default
        mapping = mapping[key]
    return mapping


def number_text(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown_table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
