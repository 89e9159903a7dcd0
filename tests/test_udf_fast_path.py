"""The scalar UDF fast path (issue 48): ``UDF.apply`` decides per batch what a
row needs beyond the call (NULL inputs, NumPy arguments, retries, skips,
Arrow values and NamedTuples returned) and maps the function over the
argument columns. Each Geneva option is run here through the fast path (the
row-by-row path patched out of ``apply``) and through the general path
(``_apply_scalar(fast=False)``, which checks each row on its own, as ``apply``
did before): values, rows computed, error records, failures, calls made and
retry waits must be equal, and equal to a plain-Python expectation."""

import functools
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pytest

import mv_assets as mv
from mv_assets.model import udf as udf_module
from mv_assets.model.chunker import chunker
from mv_assets.model.udf import UDF


@pytest.fixture
def waits(monkeypatch):
    """The waits between retries, recorded instead of slept."""
    seen: list[float] = []
    monkeypatch.setattr(udf_module, "_sleep", seen.append)
    return seen


def _errors(found):
    return [(e.index, e.error_type, e.message, e.attempts) for e in found]


def _both(u: UDF, batch, monkeypatch, calls: list | None = None):
    """``u`` over ``batch`` by ``apply`` (its fast path: the row-by-row path
    refused meanwhile) and by the general path; both must agree on values,
    rows computed, error records and calls made. Returns the fast result and
    its error records."""
    fast_errors: list = []
    with monkeypatch.context() as m:
        m.setattr(UDF, "_scalar_rowwise", lambda *a, **k: pytest.fail("apply ran the row-by-row path"))
        fast, fast_n = u.apply(batch, fast_errors)
    fast_calls = list(calls) if calls is not None else None
    if calls is not None:
        calls.clear()
    general_errors: list = []
    general, general_n = u._apply_scalar(batch, general_errors, fast=False)
    assert fast.type == general.type == u.data_type
    assert fast.to_pylist() == general.to_pylist()
    assert fast_n == general_n
    assert _errors(fast_errors) == _errors(general_errors)
    if calls is not None:
        assert fast_calls == calls
    return fast, fast_n, fast_errors


def _failures(u: UDF, batch, monkeypatch, calls: list | None = None) -> mv.UdfError:
    """The UdfError the fast and the general path raise (equal: row, type,
    message, attempts; and the calls made)."""
    with monkeypatch.context() as m:
        m.setattr(UDF, "_scalar_rowwise", lambda *a, **k: pytest.fail("apply ran the row-by-row path"))
        with pytest.raises(mv.UdfError) as fast:
            u.apply(batch)
    fast_calls = list(calls) if calls is not None else None
    if calls is not None:
        calls.clear()
    with pytest.raises(mv.UdfError) as general:
        u._apply_scalar(batch, [], fast=False)
    f, g = fast.value, general.value
    assert (f.row_index, f.rows, f.error_type, f.message, f.attempts) == (
        g.row_index, g.rows, g.error_type, g.message, g.attempts)
    if calls is not None:
        assert fast_calls == calls
    return f


NAMES = ["a", "bb", None, "dddd", "", "ffffff", None, "h"]
XS = [1.0, None, 3.0, 4.0, 5.0, None, 7.0, 8.0]


def _names_xs():
    return pa.record_batch({"name": pa.array(NAMES, pa.string()), "x": pa.array(XS, pa.float64())})


# -- the plain scalar UDF ----------------------------------------------------


def test_plain_scalar_udf_equals_the_plain_loop(monkeypatch):
    calls = []

    @mv.udf
    def f(name: str, x: float) -> float:
        calls.append(name)
        return len(name) + x

    rng = np.random.default_rng(1)
    names = [f"n{i}" * (i % 5) for i in range(2000)]
    xs = rng.random(2000)
    batch = pa.record_batch({"name": names, "x": xs})
    out, n, errors = _both(f, batch, monkeypatch, calls)
    assert out.to_pylist() == [len(a) + b for a, b in zip(names, xs.tolist(), strict=True)]
    assert n == 2000 and errors == []


def test_skip_nulls_gives_null_without_a_call(monkeypatch):
    calls = []

    @mv.udf
    def f(name: str, x: float) -> float:
        calls.append((name, x))
        return len(name) + x

    out, n, _ = _both(f, _names_xs(), monkeypatch, calls)
    want = [None if a is None or b is None else len(a) + b for a, b in zip(NAMES, XS, strict=True)]
    assert out.to_pylist() == want
    assert n == sum(v is not None for v in want) == len(calls)
    assert all(a is not None and b is not None for a, b in calls)


def test_without_skip_nulls_the_function_sees_none(monkeypatch):
    calls = []

    @mv.udf(skip_nulls=False)
    def f(name: str | None, x: float | None) -> float | None:
        calls.append(name)
        return None if name is None else len(name) + (x or 0.0)

    out, n, _ = _both(f, _names_xs(), monkeypatch, calls)
    assert out.to_pylist() == [None if a is None else len(a) + (b or 0.0) for a, b in zip(NAMES, XS, strict=True)]
    assert n == len(NAMES) == len(calls)


def test_an_all_null_and_an_empty_batch(monkeypatch):
    @mv.udf
    def f(x: float) -> float:
        return x + 1

    out, n, _ = _both(f, pa.record_batch({"x": pa.nulls(5, pa.float64())}), monkeypatch)
    assert out.to_pylist() == [None] * 5 and n == 0
    out, n, _ = _both(f, pa.record_batch({"x": pa.array([], pa.float64())}), monkeypatch)
    assert out.to_pylist() == [] and n == 0


def test_a_table_of_several_chunks(monkeypatch):
    """A Table's columns are chunked: the NULL mask and the values spread back follow them."""
    @mv.udf
    def f(x: int) -> int:
        return x * 3

    t = pa.concat_tables([pa.table({"x": pa.array(c, pa.int64())}) for c in ([1, None, 3], [None], [5, 6, None])])
    out, n, _ = _both(f, t, monkeypatch)
    assert out.to_pylist() == [3, None, 9, None, 15, 18, None] and n == 4


def test_a_udf_of_no_parameter_runs_row_by_row():
    @mv.udf
    def seven() -> int:
        return 7

    out, n = seven.apply(pa.record_batch({"x": [1, 2, 3]}))
    assert out.to_pylist() == [7, 7, 7] and n == 3


def test_a_stateful_udf(monkeypatch):
    @mv.udf
    class Prefix:
        def __init__(self, prefix: str = "p:"):
            self.prefix = prefix

        def __call__(self, name: str) -> str:
            return self.prefix + name

    batch = pa.record_batch({"name": pa.array(NAMES, pa.string())})
    out, _, _ = _both(Prefix(prefix="q:"), batch, monkeypatch)  # Geneva: an instance
    assert out.to_pylist() == [None if v is None else "q:" + v for v in NAMES]


# -- on_error: skip, fail, retries, Geneva's matchers -------------------------


def _raising(values: dict, calls: list, **options):
    """A UDF of ``x`` raising ``values[x]`` (an exception instance, or a list
    of them raised by the first calls of that row)."""
    @mv.udf(**options)
    def f(x: int) -> int:
        calls.append(x)
        todo = values.get(x)
        if isinstance(todo, list):
            if sum(c == x for c in calls) <= len(todo):
                raise todo[sum(c == x for c in calls) - 1]
            return x * 10
        if todo is not None:
            raise todo
        return x * 10

    return f


def _ints(*values):
    """A batch of these ints, as column ``x`` and as column ``n``."""
    ints = pa.array(values, pa.int64())
    return pa.record_batch({"x": ints, "n": ints})


def test_on_error_skip_records_rows_by_their_batch_position(monkeypatch):
    """NULL rows before the failing ones are left out of the map: the error
    records still name the failing rows' positions in the batch."""
    calls: list = []
    f = _raising({3: ValueError("three"), 6: KeyError("six")}, calls, on_error="skip")
    out, n, errors = _both(f, _ints(None, 1, None, 3, 4, None, 6, 7), monkeypatch, calls)
    assert out.to_pylist() == [None, 10, None, None, 40, None, None, 70]
    assert n == 5
    assert _errors(errors) == [(3, "ValueError", "three", 1), (6, "KeyError", "'six'", 1)]
    assert calls == [1, 3, 4, 6, 7]


def test_on_error_fail_names_the_row_and_calls_no_row_after_it(monkeypatch):
    calls: list = []
    f = _raising({4: RuntimeError("boom")}, calls)
    failure = _failures(f, _ints(None, 1, None, 3, 4, 5, 6), monkeypatch, calls)
    assert (failure.row_index, failure.rows, failure.error_type, failure.attempts) == (4, 1, "RuntimeError", 1)
    assert "boom" in failure.message
    assert calls == [1, 3, 4]  # (the general path's, equal to the fast path's): no row after the failing one


def test_retries_then_success_skip_or_fail(monkeypatch, waits):
    calls: list = []
    flaky = {2: [ConnectionError("once")], 3: [ConnectionError("a"), ConnectionError("b")],
             5: [ConnectionError("1"), ConnectionError("2"), ConnectionError("3")], 6: ValueError("no retry")}
    policy = mv.OnError(retry_on=(ConnectionError,), attempts=3, backoff_s=0.5, backoff_factor=2.0, then="skip")
    f = _raising(flaky, calls, on_error=policy)
    out, n, errors = _both(f, _ints(1, 2, 3, None, 5, 6, 7), monkeypatch, calls)
    assert out.to_pylist() == [10, 20, 30, None, None, None, 70] and n == 6
    assert _errors(errors) == [(4, "ConnectionError", "3", 3), (5, "ValueError", "no retry", 1)]
    assert waits == [0.5, 0.5, 1.0, 0.5, 1.0] * 2  # row 2 once, row 3 twice, row 5 twice; each path
    assert calls == [1, 2, 2, 3, 3, 3, 5, 5, 5, 6, 7]  # (the general path's calls, equal to the fast path's)
    calls.clear()
    failing = _raising(flaky, calls, on_error=mv.OnError(retry_on=(ConnectionError,), attempts=3, backoff_s=0))
    failure = _failures(failing, _ints(1, 2, 3, None, 5, 6, 7), monkeypatch, calls)
    assert (failure.row_index, failure.error_type, failure.attempts) == (4, "ConnectionError", 3)
    assert calls == [1, 2, 2, 3, 3, 3, 5, 5, 5]


def test_geneva_matchers(monkeypatch, waits):
    calls: list = []
    flaky = {1: [ConnectionError("blip")], 2: [ConnectionError("x"), ConnectionError("y")], 3: ValueError("bad"),
             4: [TimeoutError("slow")]}
    matchers = [mv.Retry(ConnectionError, TimeoutError, max_attempts=2, backoff="linear"), mv.Skip(ValueError)]
    f = _raising(flaky, calls, on_error=matchers)
    out, n, errors = _both(f, _ints(0, 1, 2, 3, 4, 5), monkeypatch, calls)
    assert out.to_pylist() == [0, 10, None, None, 40, 50] and n == 6
    assert _errors(errors) == [(2, "ConnectionError", "y", 2), (3, "ValueError", "bad", 1)]
    assert waits == [1.0, 1.0, 1.0] * 2
    calls.clear()
    out, _, errors = _both(_raising(flaky, calls, on_error=mv.skip_on_error()), _ints(0, 1, 2, 3), monkeypatch, calls)
    assert out.to_pylist() == [0, None, None, None] and [e[0] for e in _errors(errors)] == [1, 2, 3]
    out, _, errors = _both(_raising({1: [KeyError("k")]}, [], on_error=[*mv.retry_all(max_attempts=2)]),
                           _ints(0, 1), monkeypatch)
    assert out.to_pylist() == [0, 10] and errors == []
    failure = _failures(_raising({1: KeyError("k")}, [], on_error=[mv.Retry(ConnectionError), mv.Skip(ValueError)]),
                        _ints(0, 1), monkeypatch)
    assert (failure.row_index, failure.error_type) == (1, "KeyError")
    failure = _failures(_raising({1: ValueError("v")}, [], on_error=mv.fail_fast()), _ints(0, 1), monkeypatch)
    assert (failure.row_index, failure.error_type) == (1, "ValueError")


def test_a_udf_raising_stop_iteration_is_a_failing_row_with_its_own_exception(monkeypatch):
    """``map`` takes a StopIteration the function raises for its end and drops
    it; the fast path notices the missing rows and calls that row once more for
    its exception, so its class and message decide what ``on_error`` does, as
    on the general path (which calls it once)."""
    calls: list = []
    f = _raising({2: StopIteration("exhausted")}, calls, on_error="skip")
    fast_errors: list = []
    fast, n = f.apply(_ints(1, 2, 3), fast_errors)
    assert calls == [1, 2, 2, 3]  # (row 2 called once more for its exception)
    calls.clear()
    general_errors: list = []
    general, _ = f._apply_scalar(_ints(1, 2, 3), general_errors, fast=False)
    assert calls == [1, 2, 3]
    assert fast.to_pylist() == general.to_pylist() == [10, None, 30] and n == 3
    assert _errors(fast_errors) == _errors(general_errors) == [(1, "StopIteration", "exhausted", 1)]

    class Exhausted(StopIteration):
        pass

    matched = _raising({2: Exhausted("no more frames")}, [], on_error=[mv.Skip(StopIteration, match="no more")])
    errors: list = []
    assert matched.apply(_ints(1, 2, 3), errors)[0].to_pylist() == [10, None, 30]
    assert _errors(errors) == [(1, "Exhausted", "no more frames", 1)]
    unmatched = _raising({2: StopIteration("other")}, [], on_error=[mv.Skip(StopIteration, match="no more")])
    with pytest.raises(mv.UdfError) as failed:
        unmatched.apply(_ints(1, 2, 3))
    assert (failed.value.row_index, failed.value.error_type, failed.value.message) == (1, "StopIteration", "other")


# -- arguments: NumPy arrays, struct fields, adapters -------------------------


def test_ndarray_parameters(monkeypatch):
    seen = []

    @mv.udf
    def total(vals: np.ndarray, scale: float) -> float:
        seen.append(type(vals))
        return float(np.sum(vals)) * scale

    lists = [[1.0, 2.0], None, [], [4.0], [5.0, 6.0, 7.0]]
    batch = pa.record_batch({"vals": pa.array(lists, pa.list_(pa.float64())), "scale": [1.0, 2.0, 3.0, None, 0.5]})
    out, n, _ = _both(total, batch, monkeypatch)
    assert out.to_pylist() == [3.0, None, 0.0, None, 9.0] and n == 3
    assert set(seen) == {np.ndarray}

    @mv.udf(skip_nulls=False)
    def length(vals: np.ndarray | None) -> int:
        return -1 if vals is None else int(vals.shape[0])

    out, _, _ = _both(length, batch, monkeypatch)
    assert out.to_pylist() == [2, -1, 0, 1, 3]


def test_struct_field_inputs(monkeypatch):
    info = pa.array([{"vals": [1, 2], "tag": "a"}, None, {"vals": None, "tag": "c"}, {"vals": [4], "tag": None}],
                    pa.struct([("vals", pa.list_(pa.int32())), ("tag", pa.string())]))
    batch = pa.record_batch({"info": info})

    @mv.udf(data_type=pa.string(), input_columns=["info.vals", "info.tag"])
    def label(vals: np.ndarray, tag: str) -> str:
        return f"{tag}:{int(np.sum(vals))}"

    u = label.bound_to(batch.schema, struct_paths=True)
    out, n, _ = _both(u, batch, monkeypatch)
    assert out.to_pylist() == ["a:3", None, None, None] and n == 1


class Wrapped:
    def __init__(self, value):
        self.value = value


def test_parameter_adapters(monkeypatch):
    """A parameter whose annotation has an adapter (a blob's bytes as a
    BlobFile) gets the adapted value, NULLs staying None."""
    monkeypatch.setitem(udf_module.PARAM_ADAPTERS, f"{Wrapped.__module__}.{Wrapped.__qualname__}", Wrapped)

    @mv.udf
    def size(data: Wrapped) -> int:
        assert isinstance(data, Wrapped)
        return len(data.value)

    out, _, _ = _both(size, pa.record_batch({"data": pa.array([b"ab", None, b""], pa.binary())}), monkeypatch)
    assert out.to_pylist() == [2, None, 0]


# -- results: NamedTuples, structs, dicts, Arrow values, None, coercion -------


class Dims(NamedTuple):
    height: int
    width: int


class Swapped(NamedTuple):  # the same fields in another order: taken by name
    width: int
    height: int


def test_namedtuple_outputs_of_a_multi_column_udf(monkeypatch):
    @mv.udf
    def dims(n: int) -> mv.Columns[Dims]:
        if n % 3 == 0:
            return Swapped(width=n + 20, height=n + 10)
        if n % 3 == 1:
            return {"height": n + 10, "width": n + 20}
        return Dims(n + 10, n + 20)

    out, _, _ = _both(dims, _ints(0, 1, 2, None, 4, 5), monkeypatch)
    want = [None if n is None else {"height": n + 10, "width": n + 20} for n in (0, 1, 2, None, 4, 5)]
    assert out.to_pylist() == want
    # only NamedTuples of the other order: Arrow would take them by position, silently
    out, _, _ = _both(dims, _ints(0, 3, None), monkeypatch)
    assert out.to_pylist() == [{"height": 10, "width": 20}, {"height": 13, "width": 23}, None]


def test_struct_outputs_as_dicts_and_tuples(monkeypatch):
    point = pa.struct([("x", pa.int64()), ("y", pa.float64())])

    @mv.udf(data_type=point)
    def as_dict(n: int) -> dict:
        return {"x": n, "y": n / 2} if n != 2 else None

    @mv.udf(data_type=point)
    def as_tuple(n: int) -> tuple:
        return (n, n / 2)

    out, _, _ = _both(as_dict, _ints(1, 2, 3), monkeypatch)
    assert out.to_pylist() == [{"x": 1, "y": 0.5}, None, {"x": 3, "y": 1.5}]
    out, _, _ = _both(as_tuple, _ints(1, 2), monkeypatch)
    assert out.to_pylist() == [{"x": 1, "y": 0.5}, {"x": 2, "y": 1.0}]


def test_arrow_values_returned(monkeypatch):
    """Arrow values (Geneva's stateful example returns ``pa.array(...)``) are
    taken as Python and cast to the declared type, mixed with Python values."""
    @mv.udf(data_type=pa.list_(pa.float32()))
    def embed(n: int) -> list:
        if n == 0:
            return pa.array([1.5, 2.5])  # float64 values into a float32 list
        if n == 1:
            return pa.chunked_array([[3.0], [4.0]])
        if n == 2:
            return None
        return [float(n)]

    out, _, _ = _both(embed, _ints(0, 1, 2, 3), monkeypatch)
    assert out.to_pylist() == [[1.5, 2.5], [3.0, 4.0], None, [3.0]]

    @mv.udf(data_type=pa.float32())
    def scalar(n: int) -> float:
        return (pa.scalar(n + 0.5), pa.scalar(n, pa.int64()), pa.scalar(None, pa.float64()), n * 1.0)[n % 4]

    out, _, _ = _both(scalar, _ints(0, 1, 2, 3, 4), monkeypatch)
    assert out.to_pylist() == [0.5, 1.0, None, 3.0, 4.5]

    @mv.udf
    def same_type(n: int) -> float:
        return pa.scalar(n * 1.5)

    out, _, _ = _both(same_type, _ints(1, 2), monkeypatch)
    assert out.to_pylist() == [1.5, 3.0]


def test_none_returns_and_coercion_to_the_declared_type(monkeypatch):
    @mv.udf
    def f(n: int) -> float:
        return None if n % 2 else n  # ints into float64

    out, n, _ = _both(f, _ints(0, 1, 2, 3), monkeypatch)
    assert out.to_pylist() == [0.0, None, 2.0, None] and n == 4

    @mv.udf(data_type=pa.int32())
    def narrow(n: int) -> int:
        return np.int64(n)  # a NumPy integer into int32

    out, _, _ = _both(narrow, _ints(7, None), monkeypatch)
    assert out.to_pylist() == [7, None]


def test_wrong_results_raise_the_same_error(monkeypatch):
    @mv.udf
    def bad(n: int) -> float:
        return "nope" if n == 1 else 1.0

    with monkeypatch.context() as m:
        m.setattr(UDF, "_scalar_rowwise", lambda *a, **k: pytest.fail("apply ran the row-by-row path"))
        with pytest.raises(TypeError) as fast:
            bad.apply(_ints(0, 1))
    with pytest.raises(TypeError) as general:
        bad._apply_scalar(_ints(0, 1), [], fast=False)
    assert str(fast.value) == str(general.value)
    assert "returned float, str values; expected double" in str(fast.value)


def test_a_float_returned_for_an_integer_is_refused_not_truncated(monkeypatch):
    """Arrow turns 0.25 into 0 for an integer type without a word; a UDF's
    values are cast safely (2.0 is 2, 0.25 is refused, as ``Table.add()`` does),
    also inside lists and structs, from NumPy floats and Arrow scalars."""
    @mv.udf
    def quarter(n: int) -> int:
        return n / 4

    for batch in (_ints(4, 1), _ints(1, None)):
        with monkeypatch.context() as m:
            m.setattr(UDF, "_scalar_rowwise", lambda *a, **k: pytest.fail("apply ran the row-by-row path"))
            with pytest.raises(TypeError, match="expected int64") as fast:
                quarter.apply(batch)
        with pytest.raises(TypeError, match="expected int64") as general:
            quarter._apply_scalar(batch, [], fast=False)
        assert "truncated" in str(fast.value) and str(fast.value) == str(general.value)
    out, _, _ = _both(quarter, _ints(4, 8, None), monkeypatch)
    assert out.to_pylist() == [1, 2, None]  # whole floats are taken

    @mv.udf(data_type=pa.int32())
    def numpy_half(n: int):
        return (np.float64(n / 2), pa.scalar(n / 2))[n % 2]

    with pytest.raises(TypeError, match="truncated"):
        numpy_half.apply(_ints(1))
    with pytest.raises(TypeError, match="truncated"):
        numpy_half.apply(_ints(3, 2))
    assert numpy_half.apply(_ints(2, 4))[0].to_pylist() == [1, 2]

    @mv.udf
    def halves(n: int) -> list[int]:
        return [n / 2, n / 3]

    with pytest.raises(TypeError, match="truncated"):
        halves.apply(_ints(7))
    assert halves.apply(_ints(6))[0].to_pylist() == [[3, 2]]

    @mv.udf(data_type=pa.struct([("k", pa.int64()), ("s", pa.string())]))
    def pair(n: int):
        return {"k": n / 2, "s": str(n)}

    with pytest.raises(TypeError, match="truncated"):
        pair.apply(_ints(3))
    assert pair.apply(_ints(2, None))[0].to_pylist() == [{"k": 1, "s": "2"}, None]


def test_a_namedtuple_returned_for_one_struct_column_is_taken_by_field_name(monkeypatch):
    class Name(NamedTuple):
        last: str
        first: str

    @mv.udf(data_type=pa.struct([("first", pa.string()), ("last", pa.string())]))
    def person(n: int):
        return Name(last=f"Doe{n}", first=f"John{n}")

    out, _, _ = _both(person, _ints(1, None, 2), monkeypatch)
    assert out.to_pylist() == [{"first": "John1", "last": "Doe1"}, None, {"first": "John2", "last": "Doe2"}]


def _apply_to(f, n):
    return f(n)


def test_view_and_run_end_encoded_outputs_with_null_inputs(monkeypatch):
    """Arrow has no take of string_view, binary_view or run-end encoded arrays:
    a batch with NULL inputs (its values put back in their rows) worked only
    without NULLs."""
    for data_type, value in ((pa.string_view(), lambda n: f"n{n}"), (pa.binary_view(), lambda n: b"b%d" % n),
                             (pa.run_end_encoded(pa.int32(), pa.string()), lambda n: f"r{n}")):
        u = mv.udf(functools.partial(_apply_to, value), data_type=data_type, input_columns=["n"], name="u")
        out, n, _ = _both(u, _ints(1, None, 3), monkeypatch)
        assert out.to_pylist() == [value(1), None, value(3)] and n == 2


def test_nulls_held_in_a_dictionary_s_values_are_skipped(monkeypatch):
    """A dictionary array's NULLs may be in its values, which its null_count
    (of the indices) does not count: those rows get NULL without a call too."""
    calls: list = []

    @mv.udf
    def upper(s: str) -> str:
        calls.append(s)
        return s.upper()

    words = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 1], pa.int32()), pa.array(["a", None, "c"]))
    assert words.null_count == 0  # (the indices have none)
    out, n, _ = _both(upper, pa.record_batch({"s": words}), monkeypatch, calls)
    assert out.to_pylist() == ["A", None, "C", None] and n == 2
    assert calls == ["a", "c"]
    calls.clear()
    with_null_index = pa.DictionaryArray.from_arrays(pa.array([0, None, 2], pa.int32()), pa.array(["a", None, "c"]))
    out, n, _ = _both(upper, pa.record_batch({"s": with_null_index}), monkeypatch, calls)
    assert out.to_pylist() == ["A", None, "C"] and n == 2


# -- chunkers: the gate and the retry policy chosen once per batch ------------


class Word(NamedTuple):
    pos: int
    word: str


def test_a_chunker_takes_its_gate_once_per_batch_and_keeps_its_results(monkeypatch):
    tries: dict = {}

    def split(text: str):
        tries[text] = tries.get(text, 0) + 1
        if text == "flaky" and tries[text] < 2:
            raise ConnectionError("again")
        if text == "bad":
            raise ValueError("bad")
        for i, w in enumerate(text.split()):
            yield Word(i, w) if i % 2 else {"pos": i, "word": w}

    words = chunker(split, output_schema=pa.schema([("pos", pa.int64()), ("word", pa.string())]),
                    on_error=[mv.Retry(ConnectionError, max_attempts=2, backoff="fixed"), mv.Skip(ValueError)])
    monkeypatch.setattr(udf_module, "_sleep", lambda s: None)
    gates = []
    real_gate = type(words)._gate
    monkeypatch.setattr(type(words), "_gate", lambda self, fn=None: gates.append(fn) or real_gate(self, fn))
    texts = ["a b c", "flaky", "", "bad", "x y"]
    errors: list = []
    children, parent, n = words.apply(pa.record_batch({"text": texts}), errors=errors)
    assert len(gates) == 1 and n == 5
    assert children.to_pylist() == [{"pos": 0, "word": "a"}, {"pos": 1, "word": "b"}, {"pos": 2, "word": "c"},
                                    {"pos": 0, "word": "flaky"}, {"pos": 0, "word": "x"}, {"pos": 1, "word": "y"}]
    assert parent.to_pylist() == [0, 0, 0, 1, 4, 4]
    assert _errors(errors) == [(3, "ValueError", "bad", 1)] and tries["flaky"] == 2
