"""The catalog's summaries (storage.summaries): what a new process remembers
of each dataset so an unchanged table costs one listing. Whatever the file
says, the status and the description equal what the datasets say: an entry
is used only while its table's newest manifest is the very object it was read
from, and a view is always opened."""

import json

import lance
import pyarrow as pa
import pytest

import mv_assets as mv
from mv_assets.api.describe import describe_dataset
from mv_assets.storage import objects
from mv_assets.storage.summaries import manifest_version, newest_manifest


def _catalog(uri: str, **kwargs) -> mv.Connection:
    db = mv.connect(uri, runner=mv.InlineRunner(), **kwargs)
    t = db.create_table("src", pa.table({"id": [1, 2, 3], "x": [10, 20, 30]}), primary_key="id")
    db.create_materialized_view("v", t.search(None).where("x > 10").select({"id": "id", "y": "x * 2"})).refresh()
    return db


def _truth(db: mv.Connection) -> tuple[dict, dict]:
    """The status and the description read from the datasets alone (no summaries)."""
    objects.remove(db.layout.summaries())
    status = {r["name"]: r for r in db.status().to_pylist()}
    described = {n: describe_dataset(n, db.table_uri(n)) for n in db.table_names()}
    return status, described


def _looked_twice(db: mv.Connection) -> None:
    """The first look remembers each dataset's kind, the second each table's newest manifest."""
    db.describe()
    db.describe()


def _entries(db: mv.Connection) -> dict:
    return json.loads(objects.get_bytes(db.layout.summaries()) or b"{}").get("datasets", {})


@pytest.mark.parametrize("v2", [True, False], ids=["v2-names", "v1-names"])
def test_the_newest_manifest_listed_is_the_version_lance_opens(tmp_path, v2):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"a": [0]}), uri, enable_v2_manifest_paths=v2)
    for i in range(1, 12):  # past 9 and 10: V1 names do not sort as numbers do
        lance.write_dataset(pa.table({"a": [i]}), uri, mode="append")
        newest = newest_manifest(uri)
        assert newest is not None and newest.version == lance.dataset(uri).version == i + 1
    assert manifest_version("18446744073709551612.manifest") == 3
    assert manifest_version("12.manifest") == 12
    assert manifest_version("d12.manifest") is None and manifest_version("12.manifest.tmp") is None
    assert newest_manifest(str(tmp_path / "nothing.lance")) is None


def test_a_table_written_by_another_tool_is_described_as_it_is_now(tmp_path):
    db = _catalog(str(tmp_path / "cat"))
    _looked_twice(db)  # learns src as it is
    assert "manifest" in _entries(db)["src"] and _entries(db)["v"] == {"kind": "view"}
    kept = objects.get_bytes(db.layout.summaries())
    lance.dataset(db.table_uri("src")).add_columns({"z": "x + 1"})  # pylance: a new manifest, a new column
    objects.put_bytes(db.layout.summaries(), kept)  # (and the old summaries, as a slower writer would leave them)
    assert ("z", "int64") in db.describe()["src"].schema
    status = {r["name"]: r for r in db.status().to_pylist()}
    assert (status, db.describe()) == _truth(db)


def test_a_table_dropped_and_made_a_view_is_a_view_whatever_the_summaries_say(tmp_path):
    """A slower process writing the summaries it read before the change back
    (last writer wins) cannot hide the view: the entry names a manifest that
    is gone."""
    db = _catalog(str(tmp_path / "cat"))
    db.create_table("other", pa.table({"id": [1], "x": [5]}), primary_key="id")
    _looked_twice(db)
    kept = objects.get_bytes(db.layout.summaries())
    assert "manifest" in _entries(db)["other"]
    db.drop_table("other")
    db.create_materialized_view("other", db.open_table("src").search(None).select({"id": "id", "w": "x"})).refresh()
    objects.put_bytes(db.layout.summaries(), kept)
    assert sorted(r["name"] for r in db.status().to_pylist()) == ["other", "v"]
    assert db.describe()["other"].is_view
    assert _entries(db)["other"] == {"kind": "view"}


@pytest.mark.parametrize("versions", [1, 3])  # fewer than, and as many as, the view reflects
def test_a_source_created_again_is_seen_by_the_status_with_summaries_from_before(tmp_path, versions):
    import shutil

    db = _catalog(str(tmp_path / "cat"))
    reflected = db.open_view("v").status().source_version
    _looked_twice(db)  # the summaries know src at the version the view reflects
    uri = db.table_uri("src")
    shutil.rmtree(uri)  # another tool drops it and creates it again, as many commits as before
    lance.write_dataset(pa.table({"id": [7], "x": [70]}), uri, enable_stable_row_ids=True)
    for i in range(versions - 1):
        lance.write_dataset(pa.table({"id": [8 + i], "x": [80]}), uri, mode="append")
    if versions == reflected:
        assert lance.dataset(uri).version == reflected
    (row,) = db.status().to_pylist()
    assert not row["valid"] and "created again" in row["last_error"] and row["versions_behind"] == versions
    assert {r["name"]: r for r in db.status().to_pylist()} == _truth(db)[0]


def test_damaged_summaries_are_ignored_and_written_again(tmp_path):
    db = _catalog(str(tmp_path / "cat"))
    truth = _truth(db)
    for junk in (b"\x00garbage", b'{"format": 1, "datasets": {"src": {"kind": "table", "manifest": 3}}}',
                 b'{"format": 99}'):
        objects.put_bytes(db.layout.summaries(), junk)
        assert ({r["name"]: r for r in db.status().to_pylist()}, db.describe()) == truth
        assert ({r["name"]: r for r in db.status().to_pylist()}, db.describe()) == truth
        assert "manifest" in _entries(db)["src"]  # rewritten whole


def test_a_catalog_whose_summaries_cannot_be_written_reads_as_before(tmp_path, monkeypatch):
    """Read-only credentials: the file is never written, so every dataset is
    opened as before there were summaries (no listing of our own first), and
    every answer is the datasets' own."""
    db = _catalog(str(tmp_path / "cat"))
    truth = _truth(db)
    objects.remove(db.layout.summaries())
    monkeypatch.setattr(objects, "put_bytes", lambda *a, **k: (_ for _ in ()).throw(PermissionError("read-only")))
    listed: list[str] = []
    real = objects.stamped
    monkeypatch.setattr(objects, "stamped", lambda uri: listed.append(uri) or real(uri))
    for _ in range(3):
        assert ({r["name"]: r for r in db.status().to_pylist()}, db.describe()) == truth
    assert objects.get_bytes(db.layout.summaries()) is None and listed == []


def test_an_unchanged_table_is_not_opened_and_a_changed_one_is(tmp_path, monkeypatch):
    """Counted on a local disk too: the status opens the view, and its source
    only when the source moved since the summaries were written."""
    db = _catalog(str(tmp_path / "cat"))
    _looked_twice(db)
    opened: list[str] = []
    real = objects.dataset

    def counting(uri, *args, **kwargs):
        opened.append(uri.rstrip("/").rsplit("/", 1)[-1])
        return real(uri, *args, **kwargs)

    monkeypatch.setattr(objects, "dataset", counting)
    db2 = mv.connect(db.uri, runner=mv.InlineRunner())  # a new connection: nothing of the first one's
    (row,) = db2.status().to_pylist()
    assert row["versions_behind"] == 0 and "src.lance" not in opened and "v.lance" in opened
    monkeypatch.setattr(objects, "dataset", real)
    db.open_table("src").add(pa.table({"id": [4], "x": [40]}))
    monkeypatch.setattr(objects, "dataset", counting)
    opened.clear()
    (row,) = db2.status().to_pylist()
    assert row["versions_behind"] == 1 and row["stale_count"] == 1 and "src.lance" in opened


def test_the_summaries_on_an_object_store(s3_server):
    uri = f"s3://{s3_server.new_bucket()}/cat"
    db = _catalog(uri, storage_options=s3_server.options)
    assert {r["name"]: r for r in db.status().to_pylist()} == _truth(db)[0]
    _looked_twice(db)
    assert "manifest" in _entries(db)["src"]
    db.open_table("src").delete("id = 2")
    (row,) = db.status().to_pylist()
    assert row["versions_behind"] == 1 and row["stale_count"] == 1
    assert {r["name"]: r for r in db.status().to_pylist()} == _truth(db)[0]
