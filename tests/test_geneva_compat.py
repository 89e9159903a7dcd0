"""Geneva users' code runs unchanged (inline runner, real Lance files, no mocks).

(a) seed 001's materialized-view example, with only the import changed;
(b) a walk of seed 002's ``Table`` methods, each called as Geneva's docs show
    it, with Geneva's parameter names: mapped ones do what they mean here,
    the others are accepted with one ``GenevaCompatWarning`` saying why;
(c) the thin table surface (head, len, checkout / restore, cleanup, compaction,
    drop and alter columns, overwrite, exist_ok, views that are not
    materialized) and internal columns hidden from readers.
"""

import datetime as dt
import json
import os
import time
from datetime import timedelta
from typing import NamedTuple

import lance
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from oracle import count_calls, record_call

import mv_assets as mv
from mv_assets.execution.spark import InlineRunner, set_default_runner


@pytest.fixture
def inline_default():
    """``connect(path)`` with no runner (as Geneva code calls it) runs inline."""
    set_default_runner(InlineRunner())
    yield
    set_default_runner(None)


def _rows(ids):
    return [{"id": i, "x": i, "s": f"s{i}"} for i in ids]


def _table(db, name="t", n=40, fragments=1):
    """A table of ``n`` rows in ``fragments`` fragments (one add each)."""
    step = -(-n // fragments)
    t = db.create_table(name, _rows(range(0, step)), primary_key="id")
    for lo in range(step, n, step):
        t.add(_rows(range(lo, min(n, lo + step))))
    return t


# -- (a) seed 001: the materialized-view example ---------------------------------


def test_seed_001_materialized_view_example_runs_with_only_the_import_changed(tmp_path, inline_default, call_log):
    # The example as the seed prints it, with ``from geneva import`` changed to
    # ``from mv_assets import``. What makes it valid Python is the only other
    # change: the seed's ``pa.json()`` is pyarrow's ``pa.json_()``, the
    # method chain is wrapped in parentheses, the UDF bodies (whisper,
    # ``<expensive stuff>``) are stand-ins that record their calls, its
    # ``uri`` is the parameter ``video_uri`` and its ``raw_table.add(...)``
    # adds rows to ``raw_videos``.
    from mv_assets import connect, udf  # was: from geneva import connect, udf

    db = connect(str(tmp_path / "lancedb"))
    schema = pa.schema([
        pa.field("video_id",   pa.int64(),            nullable=False),  # noqa: E241
        pa.field("video_uri",  pa.string(),           nullable=False),  # noqa: E241
        pa.field("upload_ts",  pa.timestamp("us"),    nullable=False),  # noqa: E241
        pa.field("metadata",   pa.json_(),            nullable=True),  # noqa: E241
    ])
    raw_videos = db.create_table(
        "raw_videos",
        schema=schema,
        primary_key="video_id"
    )

    @udf
    def transcribe(video_uri) -> str:
        record_call(call_log, "transcribe", video_uri)
        return "text of " + video_uri

    @udf(data_type=pa.binary())
    def load_video(video_uri: pa.Array) -> pa.Array:
        record_call(call_log, "load_video", len(video_uri))
        return pa.array([u.encode() for u in video_uri.to_pylist()], pa.binary())

    q = (raw_videos.search(None)
         .shuffle(seed=42)
         .select(
             {
                 "video_uri": "video_uri",
                 "video": load_video,
                 "transcription": transcribe,
             }
         ))

    view_table = db.create_materialized_view("table_view", q)
    assert view_table.count_rows() == 0  # created empty

    def videos(ids):
        return [{"video_id": i, "video_uri": f"s3://v/{i}.mp4", "upload_ts": dt.datetime(2026, 1, 1),
                 "metadata": json.dumps({"i": i})} for i in ids]

    raw_videos.add(videos(range(10)))
    # explicitly copy values from the source table, applying UDF on cols.
    db.refresh("table_view")
    assert count_calls(call_log, "transcribe") == 10

    raw_videos.add(videos(range(10, 13)))  # was: raw_table.add(...)
    db.refresh("table_view")  # only materialize new or modified rows.
    assert count_calls(call_log, "transcribe") == 13  # the 3 new rows only

    rows = {r["video_uri"]: r for r in db.open_table("table_view").to_arrow().to_pylist()}
    assert rows == {f"s3://v/{i}.mp4": {"video_uri": f"s3://v/{i}.mp4", "video": f"s3://v/{i}.mp4".encode(),
                                         "transcription": f"text of s3://v/{i}.mp4"} for i in range(13)}
    # "Materialized views are just tables": add_columns and backfill on the view
    @udf
    def uri_len(video_uri) -> int:
        return len(video_uri)

    view_table.add_columns({"uri_len": uri_len})
    assert view_table.backfill("uri_len").rows_written == 13
    assert sorted(view_table.to_arrow().column("uri_len").to_pylist()) == sorted(len(u) for u in rows)


# -- (b) seed 002: Table's methods with Geneva's names and parameters -------------


def test_add_columns_forms_and_backfill_with_genevas_parameters(db, call_log):
    t = _table(db, n=60, fragments=3)

    @mv.udf(data_type=pa.int64())
    def double(x: int) -> int:
        record_call(call_log, "double", x)
        return x * 2

    @mv.udf(data_type=pa.int64())
    def add(a: int, b: int) -> int:
        return a + b

    class Dimensions(NamedTuple):
        height: int
        width: int

    @mv.udf
    def dimensions(x: int) -> mv.Columns[Dimensions]:
        return Dimensions(x + 10, x + 20)

    t.add_columns({"doubled": double})
    t.add_columns({"total": (add, ["x", "id"])})
    t.add_columns(dimensions)
    t.add_columns(mv.UnpackedUDF(dimensions, prefix="img_"))
    t.add_columns({"label": "cast(null as string)"})

    # backfill(columns, *, udf, where, concurrency, ..., **kwargs) as Geneva's docs call it
    r = t.backfill("doubled", where=None, concurrency=2, min_checkpoint_size=None, max_checkpoint_size=None,
                   batch_checkpoint_flush_interval_seconds=None, job_id="b1", commit_granularity=None,
                   read_version=None, checkpoint_size=None, task_size=None, num_frags=None, skip_frags=0)
    assert (r.status, r.job_id, r.rows_written) == ("DONE", "b1", 60)
    assert t.backfill(["total"]).rows_written == 60  # a single-element list is the column
    assert t.backfill("height").columns == ["height", "width", "img_height", "img_width"]
    assert t.backfill("doubled", where="1=1").rows_written == 60  # Geneva: force reprocessing all rows
    got = {r["id"]: (r["doubled"], r["total"], r["height"], r["img_width"]) for r in t.to_arrow().to_pylist()}
    assert got == {i: (2 * i, 2 * i, i + 10, i + 20) for i in range(60)}
    assert count_calls(call_log, "double") == 120


def test_concurrency_is_the_number_of_tasks_and_task_size_the_rows_per_task(db):
    t = _table(db, n=8000, fragments=8)

    @mv.udf
    def y(x: int) -> int:
        return x + 1

    t.add_columns({"y": y})
    assert t.plan_backfill("y", concurrency=1).total_tasks == 1
    assert t.plan_backfill("y", concurrency=4).total_tasks == 4
    assert t.plan_backfill("y", task_size=1000).total_tasks == 8  # whole fragments of 1,000 rows
    plan = t.plan_backfill("y", num_frags=3, skip_frags=2)  # fragments 2, 3 and 4
    assert (plan.has_work, plan.total_rows_pending) == (True, 3000)
    r = t.backfill("y", num_frags=3, skip_frags=2, concurrency=4)
    assert r.rows_written == 3000
    done = {row["id"] for row in t.to_arrow().to_pylist() if row["y"] is not None}
    assert done == set(range(2000, 5000))
    assert t.backfill("y").rows_written == 5000  # the others are still stale
    assert not t.plan_backfill("y").has_work


def test_commit_granularity_commits_every_n_fragments(db):
    t = _table(db, n=600, fragments=6)

    @mv.udf
    def y(x: int) -> int:
        return -x

    t.add_columns({"y": y})
    before = t.version
    r = t.backfill("y", commit_granularity=2, job_id="granular")
    assert r.rows_written == 600 and r.timings["commits"] == 3
    assert t.version == before + 3  # one commit per group of 2 fragments
    backfills = [v["version"] for v in t.list_versions() if v["version"] > before]
    assert len(backfills) == 3
    # readers saw the first group's values before the rest were computed
    first = lance.dataset(t.uri, version=before + 1).to_table(columns=["id", "y"]).to_pylist()
    assert sum(1 for row in first if row["y"] is not None) == 200
    assert sorted(row["y"] for row in t.to_arrow().to_pylist()) == sorted(-i for i in range(600))
    job = [j for j in t.connection.list_jobs(table_name="t") if j.job_id == "granular"]
    assert len(job) == 1 and job[0].metric("rows") == 600 and job[0].version == t.version


def test_checkpoint_sizes_map_to_checkpoints(db):
    t = _table(db, n=100)

    @mv.udf(checkpoint_size=25)
    def y(x: int) -> int:
        return x

    @mv.udf
    def z(x: int) -> int:
        return x

    t.add_columns({"y": y, "z": z})
    assert t.plan_backfill("y").checkpoint_size == 25  # @udf(checkpoint_size=)
    assert t.plan_backfill("y", checkpoint_size=10).checkpoint_size == 10  # the call's wins
    assert t.plan_backfill("z").checkpoint_size is None  # sized by time
    assert t.plan_backfill("z", checkpoint_size=20).batches == 5
    r = t.backfill("z", batch_size=50)  # Geneva's deprecated alias of checkpoint_size
    assert r.batches == 2 and r.rows_written == 100
    r = t.backfill("z", where="1=1", min_checkpoint_size=40, max_checkpoint_size=40)  # Geneva: fixed size
    assert r.batches == 3
    with pytest.warns(mv.GenevaCompatWarning, match=r"max_checkpoint_size=64\) does not apply here.*sized by time"):
        r = t.backfill("z", where="1=1", max_checkpoint_size=64)
    assert r.batches == 1  # one pass: checkpoints sized by time
    with pytest.raises(ValueError, match="checkpoint_size must be an int >= 1"):
        t.backfill("z", checkpoint_size=0)


def test_batch_checkpoint_flush_interval_checkpoints_results_as_they_come(db, tmp_path):
    t = _table(db, n=300)
    flag = tmp_path / "fail"
    flag.write_text("x")

    def make():
        @mv.udf
        def y(x: int) -> int:
            if x == 250 and os.path.exists(flag):
                raise RuntimeError("boom")
            return x * 3

        return y

    t.add_columns({"y": make()})
    with pytest.raises(mv.UdfError, match="boom"):
        t.backfill("y", batch_checkpoint_flush_interval_seconds=0)  # every slice is checkpointed
    flag.unlink()
    r = t.backfill("y")
    assert r.rows_resumed >= 200 and r.udf_rows_computed + r.rows_resumed == 300
    # by default (10 s of UDF work) a cheap UDF checkpoints nothing before it fails
    t.add_columns({"w": make()})
    flag.write_text("x")
    with pytest.raises(mv.UdfError, match="boom"):
        t.backfill("w")
    flag.unlink()
    assert t.backfill("w").rows_resumed == 0


def test_read_version_timeout_and_the_parameters_that_do_not_apply(db, tmp_path):
    t = _table(db, n=20)

    @mv.udf
    def y(x: int) -> int:
        return x

    t.add_columns({"y": y})
    old = t.version
    t.add(_rows(range(20, 30)))
    with pytest.warns(mv.GenevaCompatWarning, match=rf"read_version={old}\).*latest version \({t.version}\)"):
        r = t.backfill("y", read_version=old)
    assert r.rows_written == 30
    with pytest.raises(ValueError, match=r"read_version must be a version of the table \(1 \.\. "):
        t.backfill("y", read_version=t.version + 5)
    ignored = {
        "intra_applier_concurrency": (4, "one thread"),
        "_admission_check": (True, "no admission control"),
        "_admission_strict": (False, "no admission control"),
        "refresh_status_secs": (0.5, "no job tracker to poll"),
        "blob_read_strategy": ("range", "plain binary"),
        "blob_read_buffer_size": (1 << 20, "plain binary"),
        "_enable_job_tracker_saves": (False, "always"),
        "task_shuffle_diversity": (2, "fragment order"),
    }
    for name, (value, why) in ignored.items():
        with pytest.warns(mv.GenevaCompatWarning, match=rf"backfill\({name}=.*does not apply here.*{why}"):
            t.backfill("y", **{name: value})
    with pytest.raises(TypeError, match="unexpected keyword argument 'concurency'"):
        t.backfill("y", concurency=2)  # a typo is not a Geneva parameter
    # Geneva's defaults change nothing, so they do not warn
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.backfill("y", intra_applier_concurrency=1, _admission_check=None, refresh_status_secs=2.0,
                   blob_read_strategy="auto", _enable_job_tracker_saves=True)

    slow_flag = tmp_path / "slow"
    slow_flag.write_text("x")

    @mv.udf
    def slow(x: int) -> int:
        while os.path.exists(slow_flag):
            time.sleep(0.01)
        return x

    @mv.udf
    def slow_too(x: int) -> int:  # (other code: every row to compute again)
        while os.path.exists(slow_flag):
            time.sleep(0.01)
        return x + 1

    t.add_columns({"slow": slow})
    try:
        with pytest.raises(TimeoutError, match="still running after 0.2s"):
            t.backfill("slow", timeout=timedelta(seconds=0.2), job_id="slowjob")
        assert db.get_job("slowjob").status == "RUNNING"  # the job goes on
    finally:
        slow_flag.unlink()  # (the job's thread ends whatever happened: pytest can exit)
    deadline = time.time() + 60
    while db.get_job("slowjob").status == "RUNNING" and time.time() < deadline:
        time.sleep(0.05)
    job = db.get_job("slowjob")
    assert job.status == "DONE" and job.metric("rows") == 30
    # no job id given: the one the error names is the backfill's, and the only one (a second,
    # empty job was recorded under the id the error named, the backfill under another)
    t.alter_columns({"path": "slow", "udf": slow_too})
    slow_flag.write_text("x")
    try:
        with pytest.raises(TimeoutError, match="still running after 0.2s") as raised:
            t.backfill("slow", timeout=0.2)
    finally:
        slow_flag.unlink()
    named = str(raised.value).split("backfill job ")[1].split(" ")[0]
    deadline = time.time() + 60
    while db.get_job(named).status == "RUNNING" and time.time() < deadline:
        time.sleep(0.05)
    assert db.get_job(named).status == "DONE" and db.get_job(named).metric("rows") == 30
    assert [j.job_id for j in db.list_jobs("t") if j.job_id != "slowjob" and j.column_name == "slow"] == [named]


def test_async_jobs_refresh_column_and_plans(db):
    t = _table(db, n=50)

    @mv.udf
    def y(x: int) -> int:
        return x + 100

    t.add_columns({"y": y})
    job = t.backfill_async("y", concurrency=2, job_id="async1")
    assert job.job_id == "async1" and job.done(timeout=60) and job.status == "DONE"
    assert job.result(timeout=5).rows_written == 50 and job.result().status == "DONE"
    with pytest.raises(ValueError, match="'nope' is not a computed column"):
        t.backfill_async("nope")  # bad input raises before any job starts
    t.update("id < 5", values={"x": 1000})
    plan = t.plan_backfill("y")
    assert (plan.has_work, plan.total_rows_pending, plan.total_tasks) == (True, 5, 1)
    assert t.refresh_column("y").rows_written == 5  # LanceDB's name: stale rows only
    assert t.refresh_column("y", where="id >= 45").rows_written == 5  # with where: those rows again
    assert t.refresh_column_async("y").result(timeout=60).rows_written == 0

    v = db.create_materialized_view("v", t.search(None).where("x < 1000").select({"id": "id", "y": "y"}))
    rplan = v.plan_refresh()
    assert (rplan.has_work, rplan.total_rows_pending, rplan.total_tasks) == (True, 45, 1)
    rjob = v.refresh_async(concurrency=2, job_id="r1")
    result = rjob.result(timeout=60)
    assert (rjob.status, result.status, result.job_id, result.rows_inserted) == ("DONE", "DONE", "r1", 45)
    assert not v.plan_refresh().has_work and v.plan_refresh().total_rows_pending == 0
    t.delete("id = 49")
    t.add(_rows([100, 101]))
    assert v.plan_refresh().total_rows_pending == 3
    with pytest.warns(mv.GenevaCompatWarning, match=r"refresh\(where='id > 3'\).*not implemented"):
        r = v.refresh(where="id > 3", max_rows_per_fragment=1, intra_applier_concurrency=1)
    assert (r.rows_inserted, r.rows_deleted) == (2, 1)
    assert max(f.metadata.physical_rows for f in lance.dataset(v.uri).get_fragments()[-2:]) == 1
    with pytest.warns(mv.GenevaCompatWarning, match=r"refresh_async\(_admission_check=True\)"):
        noop = v.refresh_async(_admission_check=True, job_id="r2").result(timeout=60)
    assert (noop.status, noop.job_id, noop.rows_inserted) == ("DONE", "r2", 0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        v.refresh_async(bogus=1)
    with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
        db.refresh("v", concurrency=0)


def test_jobs_are_listed_from_what_they_left(db):
    t = _table(db, n=30)

    @mv.udf
    def y(x: int) -> int:
        if x == 7:
            raise ValueError("seven")
        return x

    t.add_columns({"y": y})
    with pytest.raises(mv.UdfError, match="seven"):
        t.backfill("y", job_id="failing")
    t.add_columns({"z": y.with_on_error("skip")})
    t.backfill("z", job_id="skipping")
    db.create_materialized_view("v", t.search(None).select(["id", "x"]))
    db.refresh("v", job_id="first-refresh")

    jobs = {j.job_id: j for j in db.list_jobs()}
    assert jobs["failing"].status == "FAILED" and "seven" in jobs["failing"].error
    assert jobs["failing"].job_type == "backfill" and jobs["failing"].column_name == "y"
    assert jobs["skipping"].status == "DONE" and jobs["skipping"].metric("errors") == 1  # skipped rows: DONE
    assert jobs["first-refresh"].job_type == "refresh" and jobs["first-refresh"].metric("rows_inserted") == 30
    assert {j.job_id for j in db.list_jobs(status="FAILED")} == {"failing"}
    assert {j.job_id for j in db.list_jobs(table_name="v")} == {"first-refresh"}
    assert db.get_job("skipping").table_name == "t"
    with pytest.raises(ValueError, match="no-such-job"):  # as Geneva (mv.JobNotFoundError)
        db.get_job("no-such-job")
    # another process (a fresh connection) reads the same records
    again = mv.connect(db.uri, runner=mv.InlineRunner())
    assert {j.job_id: j.status for j in again.list_jobs()} == {j: jobs[j].status for j in jobs}
    with pytest.raises(ValueError, match="status is one of RUNNING, DONE, FAILED"):
        db.list_jobs(status="FINISHED")

    # get_failed_row_addresses: from the stable ids, at the latest version
    addrs = t.get_failed_row_addresses("skipping", "z")
    want = lance.dataset(t.uri).to_table(columns=["x"], with_row_address=True, filter="x = 7")
    assert addrs == want.column("_rowaddr").to_pylist()
    t.compact_files()  # addresses move, ids do not
    assert t.get_failed_row_ids("z") == t.get_failed_row_ids("z", "skipping")
    retried = t.get_failed_row_addresses("skipping", "z")
    assert retried == lance.dataset(t.uri).to_table(columns=["x"], with_row_address=True,
                                                     filter="x = 7").column("_rowaddr").to_pylist()


def test_retry_by_failed_row_addresses_as_genevas_docs_show(db, tmp_path):
    t = _table(db, n=20)
    flag = tmp_path / "fail"
    flag.write_text("x")

    @mv.udf(on_error="skip")
    def y(x: int) -> int:
        if x in (3, 11) and os.path.exists(flag):
            raise RuntimeError("flaky")
        return x

    t.add_columns({"my_col": y})
    t.backfill("my_col", job_id="abc123")
    failed_rows = t.get_failed_row_addresses(job_id="abc123", column_name="my_col")
    assert len(failed_rows) == 2
    flag.unlink()
    row_ids = ",".join(map(str, failed_rows))
    assert t.backfill("my_col", where=f"_rowaddr IN ({row_ids})").rows_written == 2
    assert t.get_failed_row_addresses(job_id="abc123", column_name="my_col") == []
    assert sorted(r["my_col"] for r in t.to_arrow().to_pylist()) == list(range(20))


def test_load_columns_with_genevas_parameters(db, tmp_path):
    t = _table(db, n=10)
    pq.write_table(pa.table({"id": [1, 2, 3], "emb": [1.5, 2.5, 3.5]}), tmp_path / "e.parquet")
    v = t.load_columns(source=str(tmp_path / "e.parquet"), pk="id", columns=["emb"], concurrency=8,
                       enable_job_tracker_saves=True, job_id="load1")
    assert v == t.version
    assert {r["id"]: r["emb"] for r in t.to_arrow().to_pylist() if r["emb"] is not None} == {1: 1.5, 2: 2.5, 3: 3.5}
    assert db.get_job("load1").job_type == "load_columns" and db.get_job("load1").metric("rows") == 3
    with pytest.warns(mv.GenevaCompatWarning, match=r"load_columns\(checkpoint_size=100\).*commits once"):
        t.load_columns(str(tmp_path / "e.parquet"), "id", ["emb"], checkpoint_size=100)
    with pytest.warns(mv.GenevaCompatWarning, match=r"load_columns_async\(commit_granularity=4\)"):
        job = t.load_columns_async(str(tmp_path / "e.parquet"), "id", ["emb"], on_missing="null",
                                   commit_granularity=4)
    assert job.result(timeout=60) == t.version and job.status == "DONE"
    assert sum(1 for r in t.to_arrow().to_pylist() if r["emb"] is not None) == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'refresh_status_secs'"):
        t.load_columns_async(str(tmp_path / "e.parquet"), "id", ["emb"], refresh_status_secs=1.0)


def test_udf_field_metadata_and_view_auto_refresh(db):
    t = _table(db, n=5)

    @mv.udf(field_metadata={"unit": "cm"})
    def height(x: int) -> int:
        return x

    t.add_columns({"h": height})
    assert t.schema.field("h").metadata == {b"unit": b"cm"}
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "h2": height}), auto_refresh=False)
    assert v.schema.field("h2").metadata == {b"unit": b"cm"}
    assert v.refresh_policy == mv.RefreshPolicy.manual()
    w = db.create_materialized_view("w", t.search(None).select(["id"]), auto_refresh=True)
    assert w.refresh_policy == mv.RefreshPolicy.eager()
    with pytest.raises(ValueError, match="auto_refresh=True means refresh_policy 'eager'"):
        db.create_materialized_view("z", t.search(None).select(["id"]), auto_refresh=True,
                                    refresh_policy=mv.RefreshPolicy.manual())
    assert "z" not in db
    with pytest.raises(ValueError, match="field_metadata must be a dict of str -> str"):
        mv.udf(field_metadata={"unit": 3})(lambda x: x)
    with pytest.raises(ValueError, match="checkpoint_size must be a positive int"):
        mv.udf(checkpoint_size=0)(lambda x: x)


def test_update_optimize_and_cleanup_as_genevas_docs_show(db):
    t = _table(db, n=30, fragments=3)
    t.update(where="id < 3", values={"s": "low"})
    t.update(values_sql={"x": "x + 1"}, where="id >= 27")
    assert sorted(r["x"] for r in t.to_arrow().to_pylist() if r["id"] >= 27) == [28, 29, 30]
    assert len(t.list_versions()) == 5
    with pytest.warns(mv.GenevaCompatWarning, match=r"optimize\(delete_unverified=True\).*cleanup_older_than"):
        t.optimize(delete_unverified=True)
    assert len(lance.dataset(t.uri).get_fragments()) == 1  # compacted
    t.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
    assert [v["version"] for v in t.list_versions()] == [t.version]
    assert sorted(r["id"] for r in t.to_arrow().to_pylist()) == list(range(30))


# -- (c) the thin table surface ----------------------------------------------------


def test_internal_columns_are_hidden_unless_asked_for(db):
    t = _table(db, n=5)

    @mv.udf
    def y(x: int) -> int:
        return x

    t.add_columns({"y": y})
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "z": y}), with_no_data=False)
    assert t.schema.names == ["id", "x", "s", "y"] and v.schema.names == ["id", "z"]
    assert v.to_arrow().column_names == ["id", "z"] and v.head(2).column_names == ["id", "z"]
    assert set(v.stored_schema.names) >= {"__source_row_id", "__source_row_version", "__computed__z"}
    full = v.to_arrow(with_internal=True)
    assert "__source_row_id" in full.column_names and "__computed__z" in full.column_names
    assert "__computed__y" in t.to_arrow(with_markers=True).column_names
    assert v.schema.metadata == v.stored_schema.metadata  # (the definition is in it)
    assert len(v) == 5 and v.to_pandas()["z"].tolist() == list(range(5))


def test_head_len_pandas_overwrite_and_exist_ok(db):
    t = db.create_table("t", pd.DataFrame({"id": [1, 2, 3], "x": [1.0, 2.0, 3.0]}), primary_key="id")
    t.add(pd.DataFrame({"id": [4, 5], "x": [4.0, 5.0]}))
    assert len(t) == 5 and t.head(2).to_pylist() == [{"id": 1, "x": 1.0}, {"id": 2, "x": 2.0}]
    with pytest.raises(ValueError, match="primary key 'id': 1 of the new rows already exist"):
        t.add(pd.DataFrame({"id": [5], "x": [0.0]}))
    v = db.create_materialized_view("v", t.search(None).select(["id", "x"]), with_no_data=False)
    t.add([{"id": 9, "x": 9.0}, {"id": 8, "x": 8.0}], mode="overwrite")
    assert sorted(r["id"] for r in t.to_arrow().to_pylist()) == [8, 9]
    r = v.refresh()
    assert r.full and sorted(r["id"] for r in v.to_arrow().to_pylist()) == [8, 9]
    with pytest.raises(ValueError, match="add\\(\\) mode is 'append' or 'overwrite'"):
        t.add([{"id": 10, "x": 1.0}], mode="replace")
    with pytest.warns(mv.GenevaCompatWarning, match=r"add\(on_bad_vectors='drop'\)"):
        t.add([{"id": 10, "x": 1.0}], on_bad_vectors="drop")

    assert db.create_table("t", schema=t.schema, exist_ok=True).version == t.version  # opened, not replaced
    assert db.create_table("t", [{"id": 100, "x": 1.0}], exist_ok=True).count_rows() == 3  # data not added
    with pytest.raises(ValueError, match=r"exists with another schema \(columns \['x'\] differ"):
        db.create_table("t", schema=pa.schema([("id", pa.int64()), ("x", pa.string())]), exist_ok=True)
    with pytest.raises(mv.TableExistsError, match="already exists"):
        db.create_table("t", schema=t.schema)


def test_checkout_restore_and_open_table_at_a_version(db):
    t = _table(db, n=10)
    v1 = t.version
    t.add(_rows(range(10, 15)))
    t.delete("id < 2")
    old = db.open_table("t", version=v1)
    assert old.version == v1 and old.count_rows() == 10 and len(t) == 13
    for write, args in [("add", (_rows([99]),)), ("delete", ("id = 3",)), ("update", ("id = 3", {"x": 0})),
                        ("optimize", ()), ("drop_columns", (["s"],)), ("compact_files", ())]:
        with pytest.raises(ValueError, match=rf"checked out at version {v1} and read-only: {write}\(\) needs"):
            getattr(old, write)(*args)
    with pytest.raises(ValueError, match=rf"checked out at version {v1} and read-only: an index change needs"):
        old.create_scalar_index("id")
    assert t.version == v1 + 2  # nothing was written
    assert not old.list_indices() and bool(db.create_table("empty", schema=t.schema))  # (an empty table is truthy)
    t.checkout(v1)
    assert t.to_arrow().num_rows == 10 and t.search(None).to_arrow().num_rows == 10
    t.checkout_latest()
    assert t.count_rows() == 13
    with pytest.raises(ValueError, match="no version 99|version 99"):
        t.checkout(99)
    assert t.checked_out is None  # a bad checkout changes nothing
    new = old.restore()  # the checked-out version becomes the latest
    assert new == v1 + 3 and old.checked_out is None and sorted(r["id"] for r in t.to_arrow().to_pylist()) == list(
        range(10))
    t.restore(v1 + 1)
    assert t.count_rows() == 15 and t.version == v1 + 4
    with pytest.raises(ValueError, match="restore\\(\\) needs a version"):
        t.restore()


def test_the_column_status_of_a_checked_out_version_is_that_versions(db):
    """A column added after the version checked out: column_status() of that
    version lists the columns it had (it crashed on an internal filter:
    "No field named __computed__z"), and computed_columns() too."""
    t = _table(db, n=10)

    @mv.udf
    def y(x: int) -> int:
        return x * 2

    t.add_columns({"y": y})
    t.backfill("y")
    old = t.version
    t.add_columns({"z": "x + 1"})
    t.checkout(old)
    assert [c.name for c in t.computed_columns()] == ["y"]
    (status,) = t.column_status()
    assert (status["column"], status["rows"], status["current"]) == ("y", 10, 10)
    t.checkout_latest()
    assert [c["column"] for c in t.column_status()] == ["y", "z"]


def test_views_refuse_writes_that_would_break_them(db):
    t = _table(db, n=10)

    @mv.udf
    def y(x: int) -> int:
        return x * 2

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x", "y": y}), with_no_data=False)
    v.add_columns({"w": y})
    v.backfill("w")
    version = v.version
    with pytest.raises(ValueError, match="'v' is a materialized view: its rows are maintained by refresh\\(\\)"):
        v.add(_rows([99]))
    with pytest.raises(ValueError, match="restore\\(\\) is refused"):
        v.restore(1)
    with pytest.raises(ValueError, match=r"columns \['x'\] are part of view 'v'.s query"):
        v.drop_columns(["x"])
    with pytest.raises(ValueError, match="renaming a column or changing its nullability is not supported on a view"):
        v.alter_columns({"path": "x", "rename": "x2"})
    assert v.version == version
    v.drop_columns("w")  # added with add_columns: the view forgets it
    assert v.schema.names == ["id", "x", "y"] and "__computed__w" not in v.stored_schema.names
    t.add(_rows([10, 11]))
    r = v.refresh()
    assert not r.full and r.rows_inserted == 2  # still incremental
    assert sorted(r["y"] for r in v.to_arrow().to_pylist()) == [2 * i for i in range(12)]
    assert v.check() and all(c.passed for c in v.check())
    old = db.open_table("v", version=version)
    assert old.count_rows() == 10 and "w" in old.schema.names  # an older version, read-only
    v.compact_files()
    v.cleanup_old_versions(older_than=timedelta(0))
    assert v.source_version == t.version  # the refresh state survived the cleanup
    assert not v.plan_refresh().has_work


def test_drop_and_alter_columns_of_a_table(db):
    t = _table(db, n=10)

    @mv.udf
    def y(x: int) -> int:
        return x + 1

    t.add_columns({"y": y, "ys": "upper(s)"})
    t.backfill("y")
    v = db.create_materialized_view("v", t.search(None).select(["id", "y"]), with_no_data=False)
    with pytest.raises(ValueError, match=r"cannot drop \['x'\] from 't': computed column 'y' read"):
        t.drop_columns("x")
    with pytest.raises(ValueError, match=r"cannot drop \['y'\] from 't': view 'v' read"):
        t.drop_columns(["y"])
    with pytest.raises(ValueError, match="'id' is the primary key"):
        t.drop_columns(["id"])
    with pytest.raises(ValueError, match="has no columns \\['nope'\\]"):
        t.drop_columns(["nope"])
    with pytest.raises(ValueError, match="maintained by mv_assets"):
        t.drop_columns(["__computed__y"])
    with pytest.raises(ValueError, match="cannot rename 's' of 't': computed column 'ys' read"):
        t.alter_columns({"path": "s", "rename": "s2"})
    with pytest.raises(ValueError, match="'X' differs from the column 'x' of 't' only by case"):
        t.alter_columns({"path": "id", "rename": "X"})  # (readers of x would read it: Lance's SQL folds case)
    t.drop_columns(["ys"])
    assert "ys" not in t.schema.names and "__computed__ys" not in t.stored_schema.names
    assert [c.name for c in t.computed_columns()] == ["y"]
    t.alter_columns({"path": "s", "rename": "label"}, {"path": "x", "nullable": True})
    assert t.schema.names == ["id", "x", "label", "y"] and t.schema.field("x").nullable
    t.add([{"id": 50, "x": 5, "label": "new"}])
    assert t.plan_backfill("y").total_rows_pending == 1  # y still reads x
    t.backfill("y")
    r = v.refresh()
    assert not r.full and sorted(r["y"] for r in v.to_arrow().to_pylist()) == sorted([i + 1 for i in range(10)] + [6])
    with pytest.raises(ValueError, match="changing the type of 'x' is not supported"):
        t.alter_columns({"path": "x", "data_type": pa.int32()})
    with pytest.raises(ValueError, match="'y' is a computed column: it is NULL until computed"):
        t.alter_columns({"path": "y", "nullable": False})
    with pytest.raises(ValueError, match="swap UDFs and rename or relax columns in two calls"):
        t.alter_columns({"path": "y", "udf": y}, {"path": "x", "nullable": True})
    db.drop_table("v")
    t.alter_columns({"path": "y", "rename": "y1"})  # a computed column keeps its values and definition
    assert [c.name for c in t.computed_columns()] == ["y1"] and "__computed__y1" in t.stored_schema.names
    assert not t.plan_backfill("y1").has_work


def test_create_view_is_computed_when_read(db, call_log):
    t = _table(db, n=6)

    @mv.udf
    def y(x: int) -> int:
        record_call(call_log, "y", x)
        return x * 10

    view = db.create_view("cheap", t.search(None).where("x > 2").select({"id": "id", "y": y}))
    assert count_calls(call_log, "y") == 0  # nothing computed when created
    assert view.to_arrow().to_pylist() == [{"id": i, "y": i * 10} for i in (3, 4, 5)]
    t.add(_rows([6]))
    again = db.open_table("cheap", views=True)
    assert isinstance(again, mv.View) and len(again) == 4 and again.schema.names == ["id", "y"]
    assert "cheap" not in db.table_names() and db.view_names() == ["cheap"]
    with pytest.raises(mv.TableNotFoundError, match="no table or view named 'cheap'"):
        db.open_table("cheap")  # Table handles only, unless views=True
    with pytest.raises(mv.TableExistsError, match="already exists"):
        db.create_view("cheap", t.search(None))
    with pytest.raises(mv.TableExistsError, match="'cheap' is a view"):
        db.create_table("cheap", _rows([1]))
    with pytest.raises(ValueError, match="cannot drop 't': views \\['cheap'\\]"):
        db.drop_table("t")
    with pytest.raises(ValueError, match=r"cannot drop \['x'\] from 't': view 'cheap' read"):
        t.drop_columns("x")
    db.drop_table("cheap")
    assert db.view_names() == [] and not os.path.exists(os.path.join(db.uri, "_mv_assets", "views", "cheap.json"))
