"""Lance blob columns (``large_binary`` with ``lance-encoding:blob``: videos, images stored out of
line) read by UDFs and chunkers and written by a view's UDF, as Geneva's blobs page
(docs/geneva/udfs/blobs.mdx) describes them: a scalar parameter annotated ``BlobFile`` gets a file
object, one annotated ``bytes`` (or a batch UDF) the bytes; a UDF declared with the blob
``field_metadata`` writes a blob column that Lance's ``take_blobs`` reads back.

Before, a UDF got Lance's descriptor dicts (``{'kind', 'position', 'size', ...}``) instead of the
bytes, a view's blob UDF column failed its refresh with a cast error, and a table's blob computed
column was committed unreadable (every later scan of it failed). The oracle is plain Python over
the bytes the test wrote, at each step of a history with appends, updates and deletes.
"""

import typing

import lance
import pyarrow as pa
import pytest
from lance.blob import BlobFile

import mv_assets as mv
from mv_assets import udf

BLOB = {"lance-encoding:blob": "true"}
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("text", pa.string()), pa.field("mult", pa.int64()),
                    pa.field("video", pa.large_binary(), metadata=BLOB)])


def _rows(ids, salt: str = "") -> pa.Table:
    videos = [None if i % 5 == 4 else (f"v{i}{salt}-" * (i % 7)).encode() for i in ids]
    return pa.table({"id": list(ids), "text": [f"t{i}" for i in ids], "mult": [i % 3 + 1 for i in ids],
                     "video": videos}, schema=SCHEMA)


def _source(db, name="videos"):
    t = db.create_table(name, _rows(range(0, 12)), primary_key="id")
    t.add(_rows(range(12, 20)))  # two fragments
    return t


def _videos(table) -> dict[int, bytes | None]:
    """id -> the bytes of its video, read with Lance's own blob API (the oracle's input)."""
    ds = lance.dataset(table.uri) if hasattr(table, "uri") else table
    t = ds.to_table(columns=["id"], with_row_id=True)
    ids = t.column("_rowid").to_pylist()
    files = ds.take_blobs("video", ids=ids)
    return {i: (None if f is None else f.readall()) for i, f in zip(t.column("id").to_pylist(), files, strict=True)}


# Geneva's blobs page, as written (the body's "do something interesting" is the length)
@udf
def work_on_udf(blob: BlobFile) -> int:
    assert isinstance(blob, BlobFile)
    data = blob.read()
    # do something intresting.

    return len(data)


@udf(data_type=pa.large_binary(), field_metadata={"lance-encoding:blob": "true"})
def generate_blob(text: str, multiplier: int) -> bytes:
    """UDF that generates blob data by repeating text."""
    return (text * multiplier).encode("utf-8")


@udf(input_columns=["video"])
def head(video: bytes) -> str:
    return video[:3].decode()


@udf(data_type=pa.int64(), input_columns=["video"])
def sizes(video: pa.Array) -> pa.Array:
    return pa.array([None if v is None else len(v) for v in video.to_pylist()], pa.int64())


@udf(input_columns=["video"])
def seek_tail(video: BlobFile) -> str:
    video.seek(-2, 2)  # file semantics: from the end
    return video.read().decode()


def _changes(src):
    yield lambda: None
    yield lambda: src.add(_rows(range(20, 26)))
    yield lambda: src.update(where="id = 3", values={"text": "changed"})  # no video change
    yield lambda: src.merge_insert(_rows([5, 6], salt="new"))  # (by the primary key: new videos)
    yield lambda: src.delete("id < 2")


def test_a_view_reads_blob_columns_as_files_and_bytes_and_writes_blobs(db):
    src = _source(db)
    view = db.create_materialized_view("v", src.search(None).select({
        "id": "id", "video": "video", "n": work_on_udf.with_inputs(["video"]), "head": head, "size": sizes,
        "tail": seek_tail, "made": generate_blob.with_inputs(["text", "mult"]),
    }))
    for change in _changes(src):
        change()
        view.refresh()
        want = _videos(src)
        got = {r["id"]: r for r in view.search(None).select(["id", "n", "head", "size", "tail"]).to_list()}
        assert set(got) == set(want)
        for i, video in want.items():
            row = got[i]
            assert (row["n"], row["size"]) == ((None, None) if video is None else (len(video), len(video))), i
            assert row["head"] == (None if video is None else video[:3].decode()), i
            assert row["tail"] == (None if video is None else video[-2:].decode()), i
        # the view's blob columns: its copy of the source's, and the one its UDF wrote
        assert _videos(view) == want
        ds = lance.dataset(view.uri)
        t = ds.to_table(columns=["id"], with_row_id=True)
        made = ds.take_blobs("made", ids=t.column("_rowid").to_pylist())
        source = {r["id"]: r for r in src.search(None).select(["id", "text", "mult"]).to_list()}
        assert {i: f.readall() for i, f in zip(t.column("id").to_pylist(), made, strict=True)} == {
            i: (r["text"] * r["mult"]).encode() for i, r in source.items()}
    assert all(o.passed for o in view.check("full")), [o for o in view.check("full") if not o.passed]
    ids = view.to_arrow().column("id").to_pylist()  # Geneva's Table.take_blobs(indices, column): positions
    assert [None if f is None else f.readall() for f in view.take_blobs(list(range(len(ids))), "video")] == [
        _videos(src)[i] for i in ids]
    with pytest.raises(ValueError, match="'head' is not a blob column of 'v'.*'video', 'made'"):
        view.take_blobs([0], "head")


def test_a_table_column_reads_a_blob_column(db):
    src = _source(db)
    src.add_columns({"n": work_on_udf.with_inputs(["video"]), "size": sizes})
    for change in _changes(src):
        change()
        src.backfill("n")
        src.backfill("size")
        want = _videos(src)
        got = {r["id"]: (r["n"], r["size"]) for r in src.search(None).select(["id", "n", "size"]).to_list()}
        assert got == {i: (None, None) if v is None else (len(v), len(v)) for i, v in want.items()}


class Clip(typing.NamedTuple):
    index: int
    clip: bytes


@mv.chunker
def clips(video: bytes | None) -> typing.Iterator[Clip]:
    for i in range(0, len(video or b""), 4):
        yield Clip(i // 4, video[i:i + 4])


def test_a_chunker_reads_a_blob_column(db):
    src = _source(db)
    view = db.create_udtf_view("clips", source=src.search(None).select(["id", "video"]), udtf=clips)
    for change in _changes(src):
        change()
        view.refresh()
        got = sorted((r["id"], r["index"], r["clip"]) for r in view.search(None).select(["id", "index", "clip"])
                     .to_list())
        want = sorted((i, k // 4, v[k:k + 4]) for i, v in _videos(src).items() if v for k in range(0, len(v), 4))
        assert got == want
    assert all(o.passed for o in view.check("full")), [o for o in view.check("full") if not o.passed]


def test_a_join_view_copies_and_reads_a_blob_column_of_a_joined_table(db):
    src = _source(db)
    notes = db.create_table("notes", pa.table({"nid": list(range(0, 20, 2)), "note": [f"n{i}" for i in range(0, 20, 2)]}),
                            primary_key="nid")
    view = db.create_materialized_view("j", notes.search(None).join(src, left_on="nid", right_on="id").select(
        {"nid": "nid", "note": "note", "video": "videos.video", "n": (work_on_udf, ["videos.video"])}))
    for change in (lambda: None, lambda: (src.add(_rows(range(20, 22))), notes.add(pa.table({"nid": [20], "note": ["x"]}))),
                   lambda: src.merge_insert(_rows([2], salt="new")), lambda: src.delete("id = 4")):
        change()
        view.refresh()
        want = {i: v for i, v in _videos(src).items() if i in set(notes.to_arrow().column("nid").to_pylist())}
        assert {r["nid"]: r["n"] for r in view.search(None).select(["nid", "n"]).to_list()} == {
            i: None if v is None else len(v) for i, v in want.items()}
        ds = lance.dataset(view.uri)
        t = ds.to_table(columns=["nid"], with_row_id=True)
        files = ds.take_blobs("video", ids=t.column("_rowid").to_pylist())
        assert {i: None if f is None else f.readall() for i, f in zip(t.column("nid").to_pylist(), files,
                                                                        strict=True)} == want
        assert all(o.passed for o in view.check("full")), [o for o in view.check("full") if not o.passed]


def test_a_blob_computed_column_of_a_table_is_refused_before_anything_is_written(db):
    src = _source(db)
    version, schema = src.version, src.schema
    with pytest.raises(ValueError, match="blob column.*cannot be added to rows already written"):
        src.add_columns({"made": generate_blob.with_inputs(["text", "mult"])})
    assert (src.version, src.schema) == (version, schema)
    view = db.create_materialized_view("v", src.search(None).select(["id", "text", "mult"]))
    view.refresh()
    with pytest.raises(ValueError, match="materialized view's select"):
        view.add_columns({"made": generate_blob.with_inputs(["text", "mult"])})
    assert lance.dataset(src.uri).to_table(columns=["video"], blob_handling="all_binary").num_rows == 20


def test_spark_tasks_read_and_write_blobs(spark_db):
    src = _source(spark_db)
    view = spark_db.create_materialized_view("v", src.search(None).select({
        "id": "id", "n": work_on_udf.with_inputs(["video"]), "made": generate_blob.with_inputs(["text", "mult"])}))
    view.refresh()
    src.add(_rows(range(20, 24)))
    view.refresh()
    want = _videos(src)
    got = {r["id"]: r["n"] for r in view.search(None).select(["id", "n"]).to_list()}
    assert got == {i: None if v is None else len(v) for i, v in want.items()}
    ds = lance.dataset(view.uri)
    t = ds.to_table(columns=["id"], with_row_id=True)
    made = ds.take_blobs("made", ids=t.column("_rowid").to_pylist())
    assert sorted(len(f.readall()) for f in made) == sorted(len(f"t{i}") * (i % 3 + 1) for i in range(24))


def test_dagster_shows_a_blob_column_as_bytes_stored_as_a_blob(db):
    import dagster as dg

    from mv_assets.dagster import MvAssetsResource, build_definitions

    src = _source(db)
    db.create_materialized_view("v", src.search(None).select({"id": "id", "video": "video", "n": work_on_udf
                                                              .with_inputs(["video"])}))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    for name in ("videos", "v"):
        schema = defs.get_repository_def().asset_graph.get(dg.AssetKey([name])).metadata["dagster/column_schema"]
        columns = {c.name: c.type for c in getattr(schema, "schema", schema).columns}
        assert columns["video"] == "large_binary (blob)", columns


def test_a_blob_table_written_by_lancedb(tmp_path):
    """The open world: lancedb creates the blob table and keeps writing it; a view over it copies
    and reads the videos."""
    import lancedb

    ldb = lancedb.connect(str(tmp_path / "catalog"))
    written = ldb.create_table("videos", _rows(range(10)), schema=SCHEMA,
                               storage_options={"new_table_enable_stable_row_ids": "true"})
    db = mv.connect(str(tmp_path / "catalog"), runner=mv.InlineRunner())
    src = db.open_table("videos")
    view = db.create_materialized_view("v", src.search(None).select(
        {"id": "id", "video": "video", "n": work_on_udf.with_inputs(["video"])}))
    for change in (lambda: None, lambda: written.add(_rows(range(10, 14))), lambda: written.delete("id = 3")):
        change()
        view.refresh()
        want = _videos(src)
        assert {r["id"]: r["n"] for r in view.search(None).select(["id", "n"]).to_list()} == {
            i: None if v is None else len(v) for i, v in want.items()}
        assert _videos(view) == want
        assert all(o.passed for o in view.check("full"))


def test_a_scan_of_blob_columns_takes_as_many_rows_as_fit_its_budget(db):
    """A scan batch holds every blob byte of its rows: rows per batch = budget // the largest row's
    blob bytes (read from Lance's descriptors), at least 1, and few batches read ahead; scans without
    blob columns keep theirs."""
    from mv_assets.execution.blobs import READ_AHEAD, scan_options

    src = _source(db)
    ds = lance.dataset(src.uri)
    largest = max(len(v or b"") for v in _videos(src).values())
    assert largest > 0
    assert scan_options(ds, ["id", "video"], None, 8192, budget=10 * largest) == {
        "batch_size": 10, "batch_readahead": READ_AHEAD}
    assert scan_options(ds, {"v": "`video`"}, None, 8192, budget=largest // 2)["batch_size"] == 1
    assert scan_options(ds, ["id", "video"], None, 4, budget=10 * largest)["batch_size"] == 4  # never more
    assert scan_options(ds, ["id", "text"], None, 8192, budget=1) == {"batch_size": 8192}  # no blob read
    small = max(len(v or b"") for i, v in _videos(src).items() if i < 3)
    assert scan_options(ds, ["video"], "id < 3", 8192, budget=10 * small)["batch_size"] == 10  # the rows kept
    for fragment in ds.get_fragments():
        assert scan_options(fragment, ["video"], None, 8192, budget=10 * largest)["batch_size"] >= 10


def _batches_in(obj, depth: int = 0):
    """The record batches a callable holds (its closure and partial arguments, a few levels deep)."""
    import functools

    if isinstance(obj, pa.RecordBatch):
        yield obj
    elif depth < 4 and isinstance(obj, functools.partial):
        for a in obj.args:
            yield from _batches_in(a, depth + 1)
    elif depth < 4 and callable(obj):
        for cell in getattr(obj, "__closure__", None) or ():
            yield from _batches_in(cell.cell_contents, depth + 1)


def test_results_waiting_for_a_checkpoint_do_not_hold_their_input_batches(db, monkeypatch):
    """A cheap UDF's results are held in memory for the next checkpoint (by time), with a callable
    giving their rows' identities when saved. That callable held the whole input batch (the
    identity reads only the markers of computed inputs), so a task kept every blob it had read
    until a checkpoint. Now the held callables hold no input column."""
    from mv_assets.execution.tasks import PacedRowStore

    held: list = []
    save = PacedRowStore.save

    def spy(self, ids, vers, ins, values, errors):
        held.append(ins)
        return save(self, ids, vers, ins, values, errors)

    monkeypatch.setattr(PacedRowStore, "save", spy)
    src = _source(db)
    src.add_columns({"size": sizes})
    src.backfill("size")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "n": sizes}))
    view.refresh()
    assert held, "no result was held for a checkpoint"
    kept = [f for ins in held for b in _batches_in(ins) for f in b.schema.names]
    assert kept and not [f for f in kept if f.endswith("video")], kept


def test_a_chunker_writes_its_clips_as_blobs(db):
    """A chunker whose output field is marked for blob encoding: the chunk view stores its clips as
    blobs, which take_blobs reads back, through the source's changes."""
    src = _source(db)
    out = pa.schema([pa.field("k", pa.int32()), pa.field("clip", pa.large_binary(), metadata=BLOB)])

    @mv.chunker(output_schema=out, input_columns=["video"])
    def cut(video):
        for i in range(0, len(video or b""), 4):
            yield {"k": i // 4, "clip": video[i:i + 4]}

    view = db.create_udtf_view("cuts", source=src.search(None).select(["id", "video"]), udtf=cut)
    for change in _changes(src):
        change()
        view.refresh()
        ds = lance.dataset(view.uri)
        t = ds.to_table(columns=[mv.SOURCE_ROW_ID, "k"], with_row_id=True)
        ids = {r["_rowid"]: r["k"] for r in t.to_pylist()}
        clips_by_row = dict(zip(ids, (f.readall() for f in ds.take_blobs("clip", ids=list(ids))), strict=True))
        got = sorted(clips_by_row.values())
        want = sorted(v[k:k + 4] for v in _videos(src).values() if v for k in range(0, len(v), 4))
        assert got == want
        assert all(o.passed for o in view.check("full"))
