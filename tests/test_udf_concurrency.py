"""At most ``max_concurrency`` calls of a UDF at once in a process, whatever
the task threads feeding it (``@udf(max_concurrency=k)``; by default no bound).

A bound on what calls hold at once (a large model's activations on one GPU),
while the other threads read and write. Checked with real refreshes, inline
on threads and on Spark task threads: the bound holds and is reached, the
values equal the oracle, a failing call gives its slot back, and no thread is
left behind."""

import os
import threading
import time
import typing
import warnings

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tables import fragmented

import mv_assets as mv
from mv_assets.execution.spark import InlineRunner, SparkRunner


class Spans:
    """Calls' (start, end, thread), one file each in a folder (the UDF is
    pickled into the view's definition: no object of this process reaches
    it), and the most that overlapped."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def record(self, t0: float) -> None:
        name = f"call-{os.getpid()}-{threading.get_ident()}-{t0!r}-{time.time()!r}"
        open(os.path.join(self.folder, name), "w").close()

    def calls(self) -> list[tuple[int, int, float, float]]:
        out = []
        for n in os.listdir(self.folder):
            _, pid, thread, t0, t1 = n.split("-")
            out.append((int(pid), int(thread), float(t0), float(t1)))
        return out

    @property
    def threads(self) -> set[int]:
        return {c[1] for c in self.calls()}

    @property
    def most(self) -> int:
        """The most calls of one process that overlapped in time."""
        most = 0
        for pid in {c[0] for c in self.calls()}:
            events = sorted(e for c in self.calls() if c[0] == pid for e in ((c[2], 1), (c[3], -1)))
            now = 0
            for _, d in events:  # an end sorts before a start at the same instant: touching is not overlapping
                now += d
                most = max(most, now)
        return most


def _source(db, fragments: int, rows: int):
    return fragmented(db, fragments, rows, seed=5)


def _model(spans: Spans, seconds: float, **kwargs) -> mv.UDF:
    folder = spans.folder

    @mv.udf(data_type=pa.float64(), batch_size=250, **kwargs)
    def double(x: pa.Array) -> pa.Array:
        t0 = time.time()
        time.sleep(seconds)  # the device working, the GIL free
        Spans(folder).record(t0)
        return pc.multiply(x, 2.0)

    return double


def _equal_to_oracle(view, src) -> None:
    got = view.to_arrow().sort_by("id")
    want = src.to_arrow().sort_by("id")
    assert got.column("id").equals(want.column("id"))
    assert got.column("y").to_pylist() == [x * 2.0 for x in want.column("x").to_pylist()]


def _refresh(tmp_path, udf: mv.UDF, threads: int, fragments: int = 12):
    db = mv.connect(str(tmp_path / "catalog"), runner=InlineRunner(threads=threads))
    src = _source(db, fragments=fragments, rows=1000)
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": udf}))
    before = threading.active_count()
    result = view.refresh()
    assert threading.active_count() == before  # every task thread gone
    _equal_to_oracle(view, src)
    return result


def test_calls_beyond_the_bound_wait_while_the_other_threads_go_on(tmp_path, call_log):
    spans = Spans(call_log)
    result = _refresh(tmp_path, _model(spans, 0.05, max_concurrency=2), threads=6)
    assert result.tasks >= 6
    assert len(spans.threads) >= 3  # the tasks ran on several threads ...
    assert spans.most == 2  # ... two calls at once, never more


@pytest.mark.parametrize("gpus", [0, 1])
def test_by_default_a_udf_takes_every_call_at_once(tmp_path, call_log, gpus):
    """No bound, with or without num_gpus: on an H100 a bound of 4 calls was
    slower than none at 8 and 16 threads, for an I/O-bound and a GPU-bound
    model alike (docs/performance.md)."""
    spans = Spans(call_log)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the inline runner runs a GPU UDF's tasks as CPU ones, and says so
        _refresh(tmp_path, _model(spans, 0.2, num_gpus=gpus), threads=6)
    assert spans.most > 4


def test_the_bound_changes_no_value_and_computes_nothing_again(tmp_path, call_log):
    spans = Spans(call_log)
    bound, free = _model(spans, 0.0, max_concurrency=1), _model(spans, 0.0)
    assert bound.fingerprint == free.fingerprint  # how calls are scheduled is not what they compute
    assert bound.instance_key() == free.instance_key()
    assert (bound.call_limit(), free.call_limit()) == (1, 0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_bound_is_refused_when_the_udf_is_declared(bad):
    with pytest.raises(ValueError, match="max_concurrency must be a positive int"):
        mv.udf(lambda x: x, data_type=pa.float64(), max_concurrency=bad)


def _refresh_in_time(view, seconds: float = 60.0):
    """``view.refresh()`` on a thread, failing the test rather than hanging if it never ends."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = view.refresh()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the refresh waited for a slot nobody gave back"
    return out


def test_a_call_that_raises_gives_its_slot_back(tmp_path, call_log):
    spans = Spans(call_log)
    fail = str(tmp_path / "model-fails")  # (a file: the refresh calls the view's stored copy of the UDF)
    open(fail, "w").close()

    @mv.udf(data_type=pa.float64(), batch_size=100, max_concurrency=1, version="raises")
    def double(x: pa.Array) -> pa.Array:
        t0 = time.time()
        time.sleep(0.01)
        Spans(call_log).record(t0)
        if os.path.exists(fail) and pc.any(pc.greater(x, 0.9)).as_py():
            raise RuntimeError("the model failed")
        return pc.multiply(x, 2.0)

    db = mv.connect(str(tmp_path / "catalog"), runner=InlineRunner(threads=4))
    src = _source(db, fragments=6, rows=200)
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": double}))
    out = _refresh_in_time(view)
    assert isinstance(out.get("error"), mv.UdfError), out
    os.remove(fail)  # the model mended: every slot is free again, the next refresh computes the rest
    out = _refresh_in_time(view)
    assert "error" not in out, out
    _equal_to_oracle(view, src)
    assert spans.most == 1

    def flaky(x: pa.Array) -> pa.Array:  # under "skip" a failing batch is re-run row by row, each a call
        t0 = time.time()
        time.sleep(0.001)
        Spans(call_log).record(t0)
        if len(x) > 1 and pc.any(pc.greater(x, 0.5)).as_py():
            raise RuntimeError("a bad row")
        return pc.multiply(x, 2.0)

    view2 = db.create_materialized_view(
        "v2", src.search(None).select({"id": "id", "y": mv.udf(flaky, data_type=pa.float64(), batch_size=100,
                                                              max_concurrency=1, on_error="skip")}))
    out = _refresh_in_time(view2)
    assert "error" not in out, out
    _equal_to_oracle(view2, src)
    assert spans.most == 1


def test_spark_task_threads_share_the_bound_of_their_worker(tmp_path, spark_runner, call_log):
    """Each Spark task runs 3 refresh tasks on threads of its worker; the
    UDF, pickled into the view's definition, takes one call at a time in
    each worker."""
    spark_runner.session()  # the suite's session (one SparkContext a process)
    runner = SparkRunner(master=spark_runner.master, local_below_rows=0, task_threads=3)
    db = mv.connect(str(tmp_path / "catalog"), runner=runner)
    src = _source(db, fragments=12, rows=200)

    @mv.udf(data_type=pa.float64(), batch_size=100, max_concurrency=1, version="spark-bound")
    def double(x: pa.Array) -> pa.Array:
        t0 = time.time()  # recorded inline: the Spark workers cannot import this test module
        time.sleep(0.05)
        name = f"call-{os.getpid()}-{threading.get_ident()}-{t0!r}-{time.time()!r}"
        open(os.path.join(call_log, name), "w").close()
        return pc.multiply(x, 2.0)

    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": double}))
    result = view.refresh()
    assert result.runner == "spark", result
    _equal_to_oracle(view, src)
    spans = Spans(call_log)
    calls = spans.calls()
    assert len(calls) >= 24
    assert any(len({c[1] for c in calls if c[0] == pid}) > 1 for pid in {c[0] for c in calls})  # threads fed a worker
    assert spans.most == 1, "two calls at once in a worker"


def _lazy_model(folder: str, fail_flag: str | None = None) -> mv.UDF:
    """A stateful UDF that loads its model in its first call, as Geneva's examples do
    (``if not self.is_loaded: self.setup()``): each load leaves a file, a slow one."""

    @mv.udf(data_type=pa.float64(), batch_size=50, version="lazy")
    class Lazy:
        def __init__(self) -> None:
            self.factor = None

        def __call__(self, x: pa.Array) -> pa.Array:
            if self.factor is None:
                open(os.path.join(folder, f"load-{os.getpid()}-{threading.get_ident()}-{time.time()!r}"), "w").close()
                time.sleep(0.3)  # the other threads' first calls arrive meanwhile
                if fail_flag is not None and os.path.exists(fail_flag):
                    raise RuntimeError("the weights are not there yet")
                self.factor = 2.0
            t0 = time.time()
            time.sleep(0.02)
            Spans(os.path.join(folder, "spans")).record(t0)
            return pc.multiply(x, self.factor)

    return Lazy


def _loads(folder: str) -> int:
    return sum(1 for n in os.listdir(folder) if n.startswith("load-"))


def test_a_model_loaded_in_the_first_call_is_loaded_once_by_many_threads(tmp_path):
    """The task threads share one instance; its first call runs alone, the others wait for it, then
    every thread calls it at once (before, each thread's first call loaded the model again)."""
    folder = tmp_path / "calls"
    (folder / "spans").mkdir(parents=True)
    result = _refresh(tmp_path, _lazy_model(str(folder)), threads=4)
    assert _loads(str(folder)) == 1
    assert result.udf_rows_computed["y"] == result.rows_inserted > 0  # every row, once
    assert Spans(str(folder / "spans")).most > 1  # after the first call, no longer one at a time


def test_a_first_call_that_raises_leaves_the_next_call_first(tmp_path):
    """The first call failed (the load raised): no thread waits for ever, the refresh fails with the
    UDF's error, and the next refresh's first call loads again, alone."""
    folder = tmp_path / "calls"
    (folder / "spans").mkdir(parents=True)
    flag = tmp_path / "not-yet"
    flag.write_text("1")
    db = mv.connect(str(tmp_path / "catalog"), runner=InlineRunner(threads=4))
    src = _source(db, fragments=8, rows=400)
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": _lazy_model(str(folder),
                                                                                                  str(flag))}))
    before = threading.active_count()
    out = _refresh_in_time(view)
    assert isinstance(out.get("error"), mv.UdfError) and "not there yet" in str(out["error"]), out
    failed_loads = _loads(str(folder))
    assert failed_loads >= 1
    flag.unlink()
    out = _refresh_in_time(view)
    assert "error" not in out, out
    assert _loads(str(folder)) == failed_loads + 1
    assert threading.active_count() == before
    _equal_to_oracle(view, src)


def test_a_chunker_loading_its_model_in_the_first_call_loads_it_once_by_many_threads(tmp_path):
    folder = str(tmp_path)

    class Piece(typing.NamedTuple):
        k: int

    @mv.chunker
    class Split:
        def __init__(self) -> None:
            self.n = None

        def __call__(self, x: float) -> typing.Iterator[Piece]:
            if self.n is None:
                open(os.path.join(folder, f"load-{threading.get_ident()}-{time.time()!r}"), "w").close()
                time.sleep(0.3)
                self.n = 2
            for k in range(self.n):
                yield Piece(k)

    db = mv.connect(str(tmp_path / "catalog"), runner=InlineRunner(threads=4))
    src = _source(db, fragments=8, rows=2000)
    view = db.create_udtf_view("pieces", source=src.search(None).select(["id"]), udtf=Split)
    result = view.refresh()
    assert result.tasks > 1  # tasks on several threads
    assert _loads(folder) == 1
    assert view.count_rows() == 2 * src.count_rows()
