"""A task of a view or table with UDF columns reads, computes and writes at
once (mv_assets.execution.pipeline): the next source batches are read and the
view rows written while the UDF runs, in the task's own thread. Checked here:
the pipeline's semantics (order, bounded read-ahead, failures from either
side, nothing left running), that a real refresh and a real backfill run the
reader and writer threads during the UDF's calls, and that their results equal
an oracle computed with plain pyarrow; a UDF failure part way commits nothing
and leaves no thread behind."""

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import mv_assets as mv
from mv_assets.execution.pipeline import prefetched, write_behind
from mv_assets.execution.stages import ENV as STAGE_TIMINGS
from mv_assets.model.errors import UdfError

WAIT_S = 5.0


def _pipeline_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("mv_assets-read", "mv_assets-write")) and t.is_alive()]


# -- the pipeline ---------------------------------------------------------------


def test_prefetched_reads_ahead_while_the_consumer_works_and_keeps_order():
    produced = []
    second = threading.Event()

    def items():
        for i in range(6):
            produced.append(i)
            if i == 1:
                second.set()
            yield i

    got = []
    for item in prefetched(items(), depth=2):
        if item == 0:  # the consumer holds the first item: the producer goes on meanwhile
            assert second.wait(WAIT_S), "the producer did not read ahead while the consumer worked"
        got.append(item)
    assert got == list(range(6))
    assert max(produced) == 5


def test_prefetched_read_ahead_is_bounded():
    produced = []

    def items():
        for i in range(100):
            produced.append(i)
            yield i

    it = prefetched(items(), depth=2)
    assert next(it) == 0
    time.sleep(0.3)
    # one handed out, two queued, one waiting for room
    assert len(produced) <= 4, produced
    it.close()
    assert not _pipeline_threads()


def test_prefetched_raises_the_producers_error_where_it_happened():
    def items():
        yield 1
        yield 2
        raise KeyError("source gone")

    got = []
    with pytest.raises(KeyError, match="source gone"):
        for item in prefetched(items()):
            got.append(item)
    assert got == [1, 2]
    assert not _pipeline_threads()


def test_prefetched_consumer_failure_stops_the_producer():
    produced = []

    def items():
        for i in range(10_000):
            produced.append(i)
            yield i

    with pytest.raises(RuntimeError, match="model failed"):
        for item in prefetched(items(), depth=2):
            if item == 3:
                raise RuntimeError("model failed")
    assert not _pipeline_threads()
    assert len(produced) < 10, "the producer went on after the consumer failed"


def test_write_behind_writes_while_the_producer_computes():
    first_written = threading.Event()
    written = []

    def write(batches):
        for b in batches:
            written.append(b)
            first_written.set()
        return len(written)

    def computed():
        yield 0
        # the writer took batch 0 while this (the UDF) still works on batch 1
        assert first_written.wait(WAIT_S), "the writer did not run while the producer computed"
        yield 1
        yield 2

    assert write_behind(computed(), write) == 3
    assert written == [0, 1, 2]
    assert not _pipeline_threads()


def test_write_behind_producer_failure_reaches_the_caller_and_stops_the_writer():
    def write(batches):
        return sum(1 for _ in batches)

    def computed():
        yield 0
        raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        write_behind(computed(), write)
    assert not _pipeline_threads()


def test_write_behind_writer_failure_stops_the_producer():
    made = []

    def write(batches):
        next(iter(batches))
        raise OSError("disk full")

    def computed():
        for i in range(10_000):
            made.append(i)
            yield i

    with pytest.raises(OSError, match="disk full"):
        write_behind(computed(), write, depth=2)
    assert len(made) < 10, "the producer went on after the writer failed"
    assert not _pipeline_threads()


def test_write_behind_writer_that_stops_reading_early_is_an_error():
    def write(batches):
        next(iter(batches))
        return "done"  # returns without reading the rest: rows would be lost

    with pytest.raises(RuntimeError, match="stopped reading"):
        write_behind(iter(range(1000)), write, depth=1)


# -- the engine -----------------------------------------------------------------

ROWS = 30_000


def _source(db, rows: int = ROWS):
    rng = np.random.default_rng(3)
    src = db.create_table("src", pa.table({"id": np.arange(rows // 2), "x": rng.random(rows // 2)}))
    src.add(pa.table({"id": np.arange(rows // 2, rows), "x": rng.random(rows - rows // 2)}))
    return src


class Seen:
    """Per call of the UDF: the pipeline threads alive, and the rows."""

    calls: list[tuple[list[str], int]] = []


@mv.udf(data_type=pa.float64(), batch_size=4096)
def scaled(x: pa.Array) -> pa.Array:
    Seen.calls.append((_pipeline_threads(), len(x)))
    time.sleep(0.01)  # a model call: the GIL is free meanwhile
    return pc.multiply(x, 3.0)


def test_refresh_reads_and_writes_while_the_udf_runs_and_equals_the_oracle(db):
    src = _source(db)
    view = db.create_materialized_view("v", src.search(None).where("x > 0.25").select({"id": "id", "y": scaled}))
    Seen.calls = []
    result = view.refresh()
    assert result.udf_rows_computed == {"y": int((src.to_arrow().column("x").to_numpy() > 0.25).sum())}
    threads = {name for names, _ in Seen.calls for name in names}
    assert {"mv_assets-read", "mv_assets-write"} <= threads, threads
    assert max(n for _, n in Seen.calls) <= 4096  # batches of the UDF's batch_size, no slicing
    src_rows = src.to_arrow().filter(pc.greater(src.to_arrow().column("x"), 0.25))
    oracle = {i: x * 3.0 for i, x in zip(src_rows.column("id").to_pylist(), src_rows.column("x").to_pylist(),
                                         strict=True)}
    got = view.to_arrow()
    assert dict(zip(got.column("id").to_pylist(), got.column("y").to_pylist(), strict=True)) == oracle
    assert not _pipeline_threads()
    # an append: only the new rows are computed
    src.add(pa.table({"id": np.arange(ROWS, ROWS + 10_000), "x": np.full(10_000, 0.5)}))
    assert view.refresh().udf_rows_computed == {"y": 10_000}
    assert view.count_rows() == len(oracle) + 10_000


@mv.udf(data_type=pa.float64())
def breaks_late(x: pa.Array) -> pa.Array:
    if pc.any(pc.greater(x, 1000.0)).as_py():
        raise ValueError("cannot score large x")
    return pc.multiply(x, 2.0)


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "stage-timings"])
def test_udf_failure_part_way_commits_nothing_and_leaves_no_thread(db, monkeypatch, timed):
    if timed:  # (the stage clock's threads and timers too: MV_ASSETS_STAGE_TIMINGS)
        monkeypatch.setenv(STAGE_TIMINGS, "1")
    src = db.create_table("src", pa.table({"id": np.arange(40_000), "x": np.arange(40_000, dtype=np.float64)}))
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": breaks_late}))
    before = view.version
    with pytest.raises(UdfError, match="cannot score large x"):
        view.refresh()
    assert view.version == before and view.count_rows() == 0
    assert not _pipeline_threads()


@mv.udf(data_type=pa.float64(), batch_size=2048)
def doubled(x: pa.Array) -> pa.Array:
    Seen.calls.append((_pipeline_threads(), len(x)))
    time.sleep(0.005)
    return pc.multiply(x, 2.0)


def test_backfill_reads_ahead_and_writes_fragments_while_the_udf_runs(db):
    src = _source(db)
    src.add(pa.table({"id": np.arange(ROWS, ROWS + 5000), "x": np.ones(5000)}))
    src.add_columns({"d": doubled})
    Seen.calls = []
    result = src.backfill("d")
    assert (result.udf_rows_computed, result.rows_written) == (ROWS + 5000, ROWS + 5000)
    threads = {name for names, _ in Seen.calls for name in names}
    assert "mv_assets-read" in threads and any(n.startswith("mv_assets-write") for n in threads), threads
    t = src.to_arrow()
    assert t.column("d").to_pylist() == [x * 2.0 for x in t.column("x").to_pylist()]
    assert not _pipeline_threads()


@mv.udf(data_type=pa.float64(), batch_size=4096)
def tripled(x: pa.Array) -> pa.Array:
    return pc.multiply(x, 3.0)


@pytest.mark.spark
def test_a_spark_task_reads_computes_and_writes_at_once_and_equals_the_oracle(spark_db):
    """The same overlapped task in a Spark Python worker (forced onto Spark)."""
    src = _source(spark_db)
    view = spark_db.create_materialized_view("v", src.search(None).select({"id": "id", "y": tripled}))
    result = view.refresh()  # the spark_db runner always runs a Spark job
    assert result.udf_rows_computed == {"y": ROWS}
    t = src.to_arrow()
    want = dict(zip(t.column("id").to_pylist(), (x * 3.0 for x in t.column("x").to_pylist()), strict=True))
    got = view.to_arrow()
    assert dict(zip(got.column("id").to_pylist(), got.column("y").to_pylist(), strict=True)) == want
