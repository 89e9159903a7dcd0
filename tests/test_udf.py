"""The UDF model: forms, type inference, the checked call path, pickling."""

import os
import subprocess
import sys

import cloudpickle
import pyarrow as pa
import pytest

from mv_assets.model.udf import UDF, dumps_by_value, udf


@udf
def plus_one(x: int) -> int:
    return x + 1


@udf(data_type=pa.float32())
def halve(x: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.divide(pc.cast(x, pa.float32()), 2)


@udf(data_type=pa.int64())
def width(batch: pa.RecordBatch) -> pa.Array:
    return pa.array([batch.num_columns] * batch.num_rows)


@udf(data_type=pa.string())
class Greeter:
    setups = 0

    def __init__(self):
        type(self).setups += 1
        self.prefix = "hi "

    def __call__(self, name: str) -> str:
        return self.prefix + name


def test_forms_are_detected():
    assert plus_one.kind == "scalar" and plus_one.data_type == pa.int64()
    assert halve.kind == "array" and halve.data_type == pa.float32()
    assert width.kind == "batch" and width.input_columns == []
    assert Greeter.stateful and Greeter.kind == "scalar" and Greeter.input_columns == ["name"]


def test_udf_stays_a_plain_callable():
    assert plus_one(41) == 42
    assert Greeter("bo") == "hi bo"


def test_return_annotation_inference():
    @udf
    def f(x: float) -> float:
        return x

    @udf
    def g(x: str) -> list[float]:
        return [1.0]

    assert f.data_type == pa.float64()
    assert g.data_type == pa.list_(pa.float64())


def test_missing_output_type_is_an_error():
    with pytest.raises(ValueError, match="cannot infer the output type"):

        @udf
        def f(x):
            return x


def test_a_return_annotation_without_an_arrow_type_is_named_as_such():
    """It said "add a return annotation" of a UDF that had one."""
    import datetime

    with pytest.raises(ValueError, match=r"return annotation 'datetime' has no Arrow type here.*data_type="):

        @udf
        def ts(x: int) -> datetime.datetime:
            return datetime.datetime(2020, 1, 1)

    @udf(data_type=pa.timestamp("us"))
    def ts2(x: int) -> datetime.datetime:
        return datetime.datetime(2020, 1, 1)

    assert ts2.data_type == pa.timestamp("us")


def test_batched_udf_needs_data_type():
    with pytest.raises(ValueError, match="cannot infer"):

        @udf
        def f(x: pa.Array) -> pa.Array:
            return x


def test_mixed_annotations_rejected():
    with pytest.raises(ValueError, match="mix of Arrow and Python"):

        @udf(data_type=pa.int64())
        def f(x: pa.Array, y: int) -> pa.Array:
            return x


def test_input_columns_length_checked():
    with pytest.raises(ValueError, match="2 parameters"):
        udf(lambda a, b: a, data_type=pa.int64(), input_columns=["x"])


def test_apply_scalar_skips_nulls_and_counts():
    batch = pa.RecordBatch.from_pydict({"x": [1, None, 3]})
    out, computed = plus_one.apply(batch)
    assert out.to_pylist() == [2, None, 4]
    assert computed == 2


def test_apply_validates_output_type():
    @udf
    def bad(x: int) -> float:
        return "nope"

    with pytest.raises(TypeError, match="expected double"):
        bad.apply(pa.RecordBatch.from_pydict({"x": [1]}))


def test_apply_validates_length():
    @udf(data_type=pa.int64())
    def short(x: pa.Array) -> pa.Array:
        return x[:1]

    with pytest.raises(ValueError, match="returned 1 values for a batch of 3"):
        short.apply(pa.RecordBatch.from_pydict({"x": [1, 2, 3]}))


def test_array_and_batch_apply():
    b = pa.RecordBatch.from_pydict({"x": [2, 4], "y": ["a", "b"]})
    assert halve.apply(b)[0].to_pylist() == [1.0, 2.0]
    assert width.apply(b)[0].to_pylist() == [2, 2]


def test_stateful_set_up_once_per_process():
    before = Greeter.func.setups
    b = pa.RecordBatch.from_pydict({"name": ["a", "b"]})
    Greeter.apply(b)
    Greeter.apply(b)
    assert Greeter.func.setups - before <= 1
    assert Greeter.apply(b)[0].to_pylist() == ["hi a", "hi b"]


def test_validate_inputs():
    schema = pa.schema([("x", pa.string())])
    with pytest.raises(ValueError, match="expects int but column 'x' is string"):
        plus_one.validate_inputs(schema, "out")
    with pytest.raises(ValueError, match="reads column 'x', which the source does not have"):
        plus_one.validate_inputs(pa.schema([("y", pa.int64())]), "out")
    plus_one.validate_inputs(pa.schema([("x", pa.int32())]), "out")
    plus_one.validate_inputs(pa.schema([("x", pa.dictionary(pa.int8(), pa.int64()))]), "out")  # (its values count)

    @udf
    def shout(s: str) -> str:
        return s.upper()

    for t in (pa.dictionary(pa.int32(), pa.string()), pa.string_view(), pa.large_string()):
        shout.validate_inputs(pa.schema([("s", t)]), "out")
    with pytest.raises(ValueError, match="expects str"):
        shout.validate_inputs(pa.schema([("s", pa.dictionary(pa.int32(), pa.int64()))]), "out")


def test_fingerprint_tracks_code():
    @udf
    def f(x: int) -> int:
        return x + 1

    g = UDF(f.func, version=None)
    assert f.fingerprint == g.fingerprint

    @udf
    def f(x: int) -> int:  # noqa: F811 - same name, new code
        return x + 2

    assert f.fingerprint != g.fingerprint
    assert udf(f.func, version="v1").fingerprint == udf(f.func, version="v1").fingerprint


_INSTANCE_UDFS = """
import functools
import pyarrow as pa
import mv_assets as mv

class Scale:
    def __init__(self, f):
        self.f = f
    def __call__(self, x: float) -> float:
        return x * self.f

def times(f, x):
    return x * f

FACTOR = float(__import__("os").environ["FACTOR"])
scaled = mv.udf(Scale(FACTOR), input_columns=["x"])
partial = mv.udf(functools.partial(times, FACTOR), data_type=pa.float64(), input_columns=["x"])
print(scaled.fingerprint, partial.fingerprint, scaled.data_type)
"""


def test_instances_and_partials_have_the_same_fingerprint_in_every_process(tmp_path):
    """A callable instance or a functools.partial as a UDF was fingerprinted
    by its repr, which holds its address: a view declared in code saw the
    column altered at every load and computed every row again. Now: its
    class's (or function's) code and its values; the return type is read
    from the instance's ``__call__``."""
    (tmp_path / "views_mod.py").write_text(_INSTANCE_UDFS)

    def fingerprints(factor: str) -> list[str]:
        out = subprocess.run([sys.executable, "views_mod.py"], capture_output=True, text=True, cwd=str(tmp_path),
                             check=True, env={**os.environ, "FACTOR": factor})
        return out.stdout.split()

    first, again, other = fingerprints("2.0"), fingerprints("2.0"), fingerprints("3.0")
    assert first == again
    assert first[2] == "double"  # (from Scale.__call__'s annotation)
    assert other[0] != first[0] and other[1] != first[1]


def test_pickle_by_value_runs_in_a_process_that_cannot_import_this_file(tmp_path):
    blob = dumps_by_value(plus_one)
    path = tmp_path / "udf.pkl"
    path.write_bytes(blob)
    code = (
        "import cloudpickle, sys; u = cloudpickle.loads(open(sys.argv[1], 'rb').read()); "
        "print(u(1), u.fingerprint)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=str(tmp_path), check=True
    )
    assert out.stdout.split() == ["2", plus_one.fingerprint]


def test_spec_round_trip():
    spec = Greeter.to_spec()
    back = UDF.from_spec(spec)
    assert back.fingerprint == Greeter.fingerprint
    assert back("x") == "hi x"
    assert cloudpickle.loads(cloudpickle.dumps(back)).name == "Greeter"


def test_udfs_pickled_under_the_old_module_path_still_load():
    import pickle

    import mv_assets as mv

    # a protocol-0 reference to the class as views stored before the layered tree pickled it
    assert pickle.loads(b"cmv_assets.udf\nUDF\n.") is mv.UDF


def test_resource_hints_are_accepted_stored_shown_and_said_unscheduled(tmp_path):
    """Geneva's @udf(num_cpus=, num_gpus=, memory=): accepted (no TypeError),
    outside the fingerprint, stored with the view (read back without
    unpickling), shown by describe(), and a refresh on a runner that cannot
    schedule them (inline here; Spark: tests/test_gpu_scheduling.py) says so
    rather than failing."""
    import warnings

    import mv_assets as mv

    def triple(x: float) -> float:
        return x * 3

    assert mv.udf(triple, num_gpus=1).fingerprint == mv.udf(triple).fingerprint  # hints: not the code

    @mv.udf(num_cpus=2, num_gpus=0.5, memory=1 << 30)
    def embed(x: float) -> float:
        return x * 2

    @mv.udf
    def embed_plain(x: float) -> float:
        return x * 2

    assert (embed.num_cpus, embed.num_gpus, embed.memory) == (2.0, 0.5, 1 << 30)
    assert embed.to_spec()["resources"] == {"num_cpus": 2.0, "num_gpus": 0.5, "memory": 1 << 30}
    assert "resources" not in embed_plain.to_spec()
    with pytest.raises(ValueError, match="UDF 'f': num_gpus must be a number >= 0, got -1"):
        mv.udf(lambda x: x, name="f", data_type=pa.float64(), num_gpus=-1)
    with pytest.raises(ValueError, match="UDF 'f': num_cpus must be a positive number, got 0"):
        mv.udf(lambda x: x, name="f", data_type=pa.float64(), num_cpus=0)
    with pytest.raises(ValueError, match=r"UDF 'f': memory must be a positive int \(bytes\), got '1G'"):
        mv.udf(lambda x: x, name="f", data_type=pa.float64(), memory="1G")

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("t", pa.table({"id": [1, 2, 3], "x": [1.0, 2.0, 3.0]}), primary_key="id")
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": embed}))
    again = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())  # a fresh process's view of it
    (col,) = [c for c in again.describe()["v"].columns if c["name"] == "y"]
    assert col["udf"]["resources"] == {"num_cpus": 2.0, "num_gpus": 0.5, "memory": 1 << 30}
    with pytest.warns(UserWarning, match=r"view 'v': resource hints \{'y': .*'num_gpus': 0.5.*\} are not scheduled: "
                                         "the inline runner runs them one after another in this process; its tasks "
                                         "run as CPU tasks"):
        again.refresh("v")
    assert sorted(again.open_table("v").to_arrow().column("y").to_pylist()) == [2.0, 4.0, 6.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        db.create_materialized_view("w", src.search(None).select({"id": "id", "y": embed_plain}))
        db.refresh("w")  # no hints: nothing said


def _scaler(factor: float):
    """A factory of stateful UDFs: one class's code, a captured value per UDF."""

    class Scale:
        def __init__(self):
            self.factor = factor  # set-up reads what the factory captured (a model path, say)

        def __call__(self, x: float) -> float:
            return x * self.factor

    return udf(Scale, data_type=pa.float64(), input_columns=["x"])


def test_stateful_udfs_of_one_code_with_different_captured_values_keep_their_own_instances(db):
    """The same class code capturing different values: each UDF computes with
    its own set-up (they once shared one instance, keyed by the code alone)."""
    src = db.create_table("src", pa.table({"id": [1, 2, 3], "x": [1.0, 2.0, 3.0]}))
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "double": _scaler(2.0),
                                                                      "triple": _scaler(3.0)}))
    view.refresh()
    rows = sorted(view.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [(r["double"], r["triple"]) for r in rows] == [(2.0, 3.0), (4.0, 6.0), (6.0, 9.0)]


def _multiplier(factor: float):
    @udf
    def times(x: float) -> float:
        return x * factor

    return times


def test_udfs_of_one_code_with_different_captured_values_are_computed_each(db):
    src = db.create_table("src", pa.table({"id": [1, 2], "x": [1.0, 2.0]}))
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "a": _multiplier(10.0),
                                                                      "b": _multiplier(100.0)}))
    view.refresh()
    rows = sorted(view.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [(r["a"], r["b"]) for r in rows] == [(10.0, 100.0), (20.0, 200.0)]


def _counted_model(log: str):
    """A stateful UDF class whose set-ups are counted in the file ``log`` (its
    globals travel by value with its pickle: a file is seen by every copy)."""

    @udf
    class Model:
        def __init__(self, scale: float = 2.0) -> None:
            with open(log, "a") as fh:
                fh.write(f"{scale}\n")
            self.scale = scale

        def __call__(self, x: float) -> float:
            return x * self.scale

    return Model


def _setups(log) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_stateful_udf_is_set_up_once_however_it_was_loaded(db, tmp_path):
    """The user's UDF object and the same UDF loaded from the view's stored
    definition are one instance: set up once per process (it was set up
    again after the first refresh, and both instances stayed in memory)."""
    log = tmp_path / "setups"
    model = _counted_model(str(log))
    src = db.create_table("src", pa.table({"id": [1, 2], "x": [1.0, 2.0]}))
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": model}))
    view.refresh()
    assert _setups(log) == ["2.0"]
    src.add(pa.table({"id": [3], "x": [3.0]}))
    view.refresh()
    assert _setups(log) == ["2.0"]
    loaded = UDF.from_spec(model.to_spec())
    assert loaded.instance_key() == model.instance_key()
    assert sorted(r["y"] for r in view.to_arrow().to_pylist()) == [2.0, 4.0, 6.0]


def test_a_stateful_udf_registered_as_an_instance_with_init_arguments(db, tmp_path):
    """Geneva registers a stateful UDF as an instance of the decorated class:
    ``Model()`` (it raised: __call__() missing an argument), ``Model(scale=10.0)``."""
    log = tmp_path / "setups"
    model = _counted_model(str(log))
    plain, tenfold = model(), model(scale=10.0)
    assert isinstance(plain, UDF) and isinstance(tenfold, UDF)
    assert plain.instance_key() != tenfold.instance_key()
    src = db.create_table("src", pa.table({"id": [1, 2], "x": [1.0, 2.0]}))
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "a": plain, "b": tenfold}))
    view.refresh()
    rows = sorted(view.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [(r["a"], r["b"]) for r in rows] == [(2.0, 10.0), (4.0, 20.0)]
    assert sorted(_setups(log)) == ["10.0", "2.0"]
    assert model(3.0) == 6.0  # called with __call__'s arguments it is still the function


def test_a_model_unused_longer_than_the_keep_time_is_let_go(monkeypatch):
    """A process that lives long (a Spark worker the daemon keeps) lets go of
    the stateful UDF instances it has not used for $MV_ASSETS_PYTHON_WORKER_KEEP_S,
    such as a column's model since redefined; those in use stay; 0 keeps all."""
    from mv_assets.model import udf as udf_module

    monkeypatch.setattr(UDF, "_instances", {})
    monkeypatch.setattr(UDF, "_last_used", {})
    monkeypatch.setenv("MV_ASSETS_PYTHON_WORKER_KEEP_S", "100")
    made: list[str] = []

    @udf(data_type=pa.int64(), version="kept")
    class Kept:
        def __init__(self) -> None:
            made.append("kept")

        def __call__(self, x: int) -> int:
            return x

    @udf(data_type=pa.int64(), version="stale")
    class Stale:
        def __init__(self) -> None:
            made.append("stale")

        def __call__(self, x: int) -> int:
            return x

    def age(udf_obj, seconds: float) -> None:  # as if unused that long (no sleeping: a busy machine's clock)
        UDF._last_used[udf_obj.instance_key()] -= seconds

    monkeypatch.setattr(udf_module, "_SWEEP_S", float("inf"))  # first, only the explicit call lets go
    kept, stale = Kept._instance(), Stale._instance()
    age(Kept, 200)
    age(Stale, 200)
    assert Kept._instance() is kept  # used again: its idle time starts over
    assert UDF.drop_unused_instances() == [Stale.instance_key()]
    assert Kept._instance() is kept and made == ["kept", "stale"]
    assert Stale._instance() is not stale and made == ["kept", "stale", "stale"]  # set up again when asked

    monkeypatch.setattr(udf_module, "_SWEEP_S", 0.0)  # every call looks: the sweep runs from the call path
    age(Stale, 200)
    Kept._instance()
    assert set(UDF._instances) == {Kept.instance_key()}

    for keep in ("0", "-3", "soon"):  # nothing is let go
        monkeypatch.setenv("MV_ASSETS_PYTHON_WORKER_KEEP_S", keep)
        Stale._instance()
        age(Stale, 200)
        assert UDF.drop_unused_instances() == [] and Stale.instance_key() in UDF._instances
