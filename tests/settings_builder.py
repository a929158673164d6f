"""Settings from flat keyword names, so that a test says only what it changes.

A name is a group's field name (``data_dir``, ``fetch_max_bytes``) or its environment variable
lowercased without ``MIRAI_`` (``release_uri``, ``alert_webhook_url``, ``gdelt_base_url``,
``live_seed``): pipeline/config.py declares both, this maps them to the group.
"""

from __future__ import annotations

import dataclasses

from pipeline.config import Settings, groups


def _flat_names() -> dict[str, tuple[str, str]]:
    names: dict[str, tuple[str, str]] = {}
    for group_name, group in groups().items():
        for env, info in group.env_fields():
            field = next(name for name, f in group.model_fields.items() if f is info)
            for flat in {field, env.lower().removeprefix("mirai_")}:
                assert flat not in names, flat
                names[flat] = (group_name, field)
    return names


FLAT_NAMES = _flat_names()


def make_settings(base: Settings | None = None, /, **flat: object) -> Settings:
    """``base`` (default: the defaults) with the given settings changed."""
    base = base or Settings()
    changes: dict[str, dict[str, object]] = {}
    for name, value in flat.items():
        group_name, field = FLAT_NAMES[name]
        changes.setdefault(group_name, {})[field] = value
    groups_changed = {}
    for group_name, fields in changes.items():
        old = getattr(base, group_name)
        given = {name: getattr(old, name) for name in old.model_fields_set}
        groups_changed[group_name] = type(old)(**{**given, **fields})
    return dataclasses.replace(base, **groups_changed)
