"""The chunker (1:N) and UDTF (N:M) models: forms, schema inference, the checked
call path, error policy, fingerprints and specs. No Spark, no Lance."""

import json
import subprocess
import sys
from collections import namedtuple
from typing import Generator, Iterable, Iterator, NamedTuple

import pyarrow as pa
import pytest

from mv_assets.model.chunker import UDTF, Chunker, chunker, from_spec, udtf
from mv_assets.model.errors import UdfError
from mv_assets.model.udf import OnError, RowError, udf


class Word(NamedTuple):
    pos: int
    word: str


@chunker
def words(text: str) -> Iterator[Word]:
    for i, w in enumerate(text.split()):
        yield Word(i, w)


class Piece(NamedTuple):
    n: int
    score: float
    label: str
    raw: bytes
    vec: list[float]
    note: str | None


@chunker
def pieces(text: str, times: int) -> list[Piece]:
    return [Piece(i, i / 2, text, text.encode(), [float(i)] * 2, None) for i in range(times)]


@chunker(batch=True, output_schema=pa.schema([("part", pa.string())]))
def halves(text: pa.Array, __source_row_id: pa.Array) -> pa.RecordBatch:
    # children deliberately returned out of parent order: apply regroups them
    parts, ids = [], []
    for t, i in reversed(list(zip(text.to_pylist(), __source_row_id.to_pylist(), strict=True))):
        for p in (t[: len(t) // 2], t[len(t) // 2 :]) if t else ():
            parts.append(p)
            ids.append(i)
    return pa.record_batch({"part": parts, "__source_row_id": ids})


@chunker(batch=True, output_schema=pa.schema([("word", pa.string())]))
class Splitter:
    setups = 0

    def __init__(self):
        type(self).setups += 1

    def __call__(self, __source_row_id: pa.Array, text: pa.Array) -> pa.RecordBatch:  # mangled by Python, any place
        out, ids = [], []
        for t, i in zip(text.to_pylist(), __source_row_id.to_pylist(), strict=True):
            out += t.split()
            ids += [i] * len(t.split())
        return pa.record_batch({"word": out, "__source_row_id": ids})


@chunker
class Letters:
    setups = 0

    def __init__(self):
        type(self).setups += 1

    def __call__(self, text: str) -> Iterator[Word]:
        return (Word(i, c) for i, c in enumerate(text))


@udtf(output_schema=pa.schema([("label", pa.string()), ("total", pa.int64())]), input_columns=["label", "x"])
def totals(table: pa.Table) -> pa.Table:
    by = table.group_by("label").aggregate([("x", "sum")])
    return pa.table({"total": by.column("x_sum"), "label": by.column("label")})  # any column order


def docs(*texts):
    return pa.record_batch({"text": list(texts)})


def test_scalar_chunker_from_a_generator():
    assert words.kind == "chunker" and words.input_columns == ["text"] and not words.batch
    assert words.output_schema == pa.schema([("pos", pa.int64()), ("word", pa.string())])
    children, parent, n = words.apply(docs("a b", "", "c d e"))
    assert children.schema == words.output_schema
    assert children.column("word").to_pylist() == ["a", "b", "c", "d", "e"]
    assert children.column("pos").to_pylist() == [0, 1, 0, 1, 2]
    assert parent.type == pa.int64() and parent.to_pylist() == [0, 0, 2, 2, 2]
    assert n == 3


def test_scalar_chunker_from_a_list_infers_every_field_type():
    assert pieces.output_schema == pa.schema([
        ("n", pa.int64()), ("score", pa.float64()), ("label", pa.string()), ("raw", pa.binary()),
        ("vec", pa.list_(pa.float64())), ("note", pa.string()),
    ])
    children, parent, _ = pieces.apply(pa.record_batch({"text": ["x", "y"], "times": [2, 0]}))
    assert parent.to_pylist() == [0, 0]
    assert children.to_pylist()[1] == {"n": 1, "score": 0.5, "label": "x", "raw": b"x", "vec": [1.0, 1.0], "note": None}


def test_every_iterator_annotation_is_read():
    @chunker
    def a(x: int) -> Iterable[Word]:
        return []

    @chunker
    def b(x: int) -> Generator[Word, None, None]:
        yield Word(x, "")

    assert a.output_schema == b.output_schema == words.output_schema


def test_all_parents_without_children_give_an_empty_table():
    children, parent, n = words.apply(docs("", ""))
    assert children.num_rows == 0 and children.schema == words.output_schema
    assert parent.type == pa.int64() and len(parent) == 0 and n == 2


def test_explicit_output_schema_wins_and_casts():
    @chunker(output_schema=pa.schema([("i", pa.int32()), ("f", pa.float32())]))
    def nums(k: int):
        for i in range(k):
            yield (i, i * 1.5)

    children, parent, _ = nums.apply(pa.record_batch({"k": [1, 2]}))
    assert children.schema == pa.schema([("i", pa.int32()), ("f", pa.float32())])
    assert children.to_pylist() == [{"i": 0, "f": 0.0}, {"i": 0, "f": 0.0}, {"i": 1, "f": 1.5}]
    assert parent.to_pylist() == [0, 1, 1]


def test_a_float_yielded_for_an_integer_field_is_refused_not_truncated():
    """Arrow turns 2.5 into 2 for an integer field without a word; a chunker's
    values are cast safely (3.0 is 3), as a scalar UDF's are."""
    @chunker(output_schema=pa.schema([("i", pa.int32()), ("f", pa.float32())]))
    def halves(k: int):
        for i in range(k):
            yield (i * 1.5 if k == 3 else float(i), i * 1.5)

    with pytest.raises(TypeError, match="yielded float values for 'i'; expected int32.*truncated"):
        halves.apply(pa.record_batch({"k": [3]}))
    children, _, _ = halves.apply(pa.record_batch({"k": [2]}))
    assert children.to_pylist() == [{"i": 0, "f": 0.0}, {"i": 1, "f": 1.5}]


def test_a_chunker_stays_a_plain_callable():
    assert list(words("a b")) == [Word(0, "a"), Word(1, "b")]
    assert [w.word for w in Letters("hi")] == ["h", "i"]
    assert halves(pa.array(["ab"]), pa.array([7])).to_pylist() == [
        {"part": "a", "__source_row_id": 7}, {"part": "b", "__source_row_id": 7}
    ]


def test_batched_chunker_maps_children_to_parents_by_id():
    assert halves.input_columns == ["text"] and halves.batch
    children, parent, n = halves.apply(docs("abcd", "", "xy"), pa.array([100, 200, 300]))
    # grouped in parent order, each parent's children in the order given
    assert children.column("part").to_pylist() == ["ab", "cd", "x", "y"]
    assert parent.to_pylist() == [0, 0, 2, 2] and n == 3
    assert children.schema == pa.schema([("part", pa.string())])


def test_batched_chunker_default_ids_are_positions():
    children, parent, _ = halves.apply(docs("ab", "cd"))
    assert children.column("part").to_pylist() == ["a", "b", "c", "d"] and parent.to_pylist() == [0, 0, 1, 1]


def test_parent_ids_are_checked():
    with pytest.raises(ValueError, match="parent_ids must be 2 distinct non-NULL ids"):
        halves.apply(docs("ab", "cd"), pa.array([1, 1]))
    with pytest.raises(ValueError, match="parent_ids must be 2 distinct non-NULL ids"):
        halves.apply(docs("ab", "cd"), pa.array([1]))


def test_stateful_chunkers_are_set_up_once_across_applies():
    before_s, before_l = Splitter.func.setups, Letters.func.setups
    for _ in range(3):
        children, parent, _ = Splitter.apply(docs("a b", "c"), pa.array([5, 6]))
        letters, _, _ = Letters.apply(docs("ab"))
    assert Splitter.func.setups - before_s <= 1 and Letters.func.setups - before_l <= 1
    assert Splitter.stateful and Splitter.input_columns == ["text"]
    assert children.column("word").to_pylist() == ["a", "b", "c"] and parent.to_pylist() == [0, 0, 1]
    assert letters.column("word").to_pylist() == ["a", "b"]


def test_input_columns_and_with_inputs_bind_other_columns():
    @chunker(input_columns=["body"])
    def split(text: str) -> Iterator[Word]:
        yield Word(0, text)

    batch = pa.record_batch({"body": ["b"], "title": ["t"]})
    assert split.apply(batch)[0].column("word").to_pylist() == ["b"]
    moved = split.with_inputs(["title"])
    assert moved.apply(batch)[0].column("word").to_pylist() == ["t"]
    assert moved.fingerprint != split.fingerprint and split.input_columns == ["body"]
    with pytest.raises(ValueError, match=r"has 1 input parameters \['text'\] but 2 input columns"):
        split.with_inputs(["a", "b"])


def flaky_source():
    def split(text: str) -> Iterator[Word]:
        if text == "bad":
            raise ValueError("cannot split bad")
        yield from words.func(text)

    return split


def test_on_error_skip_records_a_row_error_and_goes_on():
    skipping = chunker(flaky_source(), on_error="skip")
    errors: list[RowError] = []
    children, parent, n = skipping.apply(docs("a", "bad", "b c"), errors=errors)
    assert children.column("word").to_pylist() == ["a", "b", "c"] and parent.to_pylist() == [0, 2, 2] and n == 3
    assert [(e.index, e.error_type, e.message, e.attempts) for e in errors] == [(1, "ValueError", "cannot split bad", 1)]
    assert "cannot split bad" in errors[0].traceback


def test_on_error_fail_raises_udf_error_naming_the_chunker_and_row():
    failing = chunker(flaky_source())
    with pytest.raises(UdfError, match="'split' raised ValueError: cannot split bad") as info:
        failing.apply(docs("a", "bad"))
    assert info.value.udf == "split" and info.value.row_index == 1 and info.value.rows == 1
    assert failing.with_on_error("skip").fingerprint == failing.fingerprint


def test_retries_run_the_generator_again():
    calls = []

    def split(text: str) -> Iterator[Word]:
        calls.append(text)
        yield Word(0, text)
        if len(calls) < 3:
            raise ConnectionError("flaky")  # raised mid-iteration: the whole parent is retried
        yield Word(1, text)

    retrying = chunker(split, on_error=OnError(retry_on=(ConnectionError,), attempts=3, backoff_s=0))
    children, _, _ = retrying.apply(docs("x"))
    assert children.column("pos").to_pylist() == [0, 1] and len(calls) == 3


def test_batched_skip_reruns_parent_by_parent():
    @chunker(batch=True, output_schema=pa.schema([("t", pa.string())]), on_error="skip")
    def strict(text: pa.Array, __source_row_id: pa.Array) -> pa.RecordBatch:
        if "bad" in text.to_pylist():
            raise ValueError("bad text")
        return pa.record_batch({"t": text, "__source_row_id": __source_row_id})

    errors: list[RowError] = []
    children, parent, n = strict.apply(docs("a", "bad", "c"), pa.array([10, 11, 12]), errors)
    assert children.column("t").to_pylist() == ["a", "c"] and parent.to_pylist() == [0, 2] and n == 3
    assert [(e.index, e.message) for e in errors] == [(1, "bad text")]
    with pytest.raises(UdfError, match="'strict' raised ValueError: bad text") as info:
        strict.with_on_error("fail").apply(docs("a", "bad"))
    assert info.value.row_index == 0 and info.value.rows == 2


def test_batch_size_bounds_the_parents_of_one_call():
    sizes = []

    @chunker(batch=True, output_schema=pa.schema([("t", pa.string())]), batch_size=2, on_error="skip")
    def echo(text: pa.Array, __source_row_id: pa.Array) -> pa.RecordBatch:
        sizes.append(len(text))
        if "bad" in text.to_pylist():
            raise ValueError("bad text")
        return pa.record_batch({"t": text, "__source_row_id": __source_row_id})

    errors: list[RowError] = []
    children, parent, n = echo.apply(docs("a", "b", "c", "bad", "e"), pa.array([5, 4, 3, 2, 1]), errors)
    assert children.column("t").to_pylist() == ["a", "b", "c", "e"] and parent.to_pylist() == [0, 1, 2, 4] and n == 5
    assert sizes == [2, 2, 1, 1, 1] and [e.index for e in errors] == [3]
    with pytest.raises(UdfError, match="'echo' raised ValueError") as info:
        echo.with_on_error("fail").apply(docs("a", "b", "c", "bad"))
    assert info.value.row_index == 2 and info.value.rows == 2


def test_scalar_results_are_checked_whatever_on_error_says():
    @chunker(on_error="skip")
    def not_rows(text: str) -> Iterator[Word]:
        return 3  # type: ignore[return-value]

    @chunker(on_error="skip")
    def not_tuples(text: str) -> Iterator[Word]:
        yield "a"  # type: ignore[misc]

    @chunker(on_error="skip")
    def wrong_type(text: str) -> Iterator[Word]:
        yield Word("zero", text)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="'not_rows' returned int; expected an iterator or list of NamedTuples"):
        not_rows.apply(docs("a"))
    with pytest.raises(TypeError, match=r"'not_tuples' yielded str for parent row 0; expected a NamedTuple of 2"):
        not_tuples.apply(docs("a"))
    with pytest.raises(TypeError, match="'wrong_type' yielded str values for 'pos'; expected int64"):
        wrong_type.apply(docs("a"))

    @chunker
    def third_is_short(text: str) -> Iterator[Word]:  # children checked once a batch: still named by parent
        yield (Word(0, text) if text != "c" else (0,))  # type: ignore[misc]
        if text == "a":
            yield {"word": "dict", "pos": 9}  # type: ignore[misc]

    with pytest.raises(TypeError, match=r"'third_is_short' yielded tuple for parent row 2; expected a NamedTuple"):
        third_is_short.apply(docs("a", "b", "c"))
    children, parent, _ = third_is_short.apply(docs("a", "", "b"))
    assert children.to_pylist() == [{"pos": 0, "word": "a"}, {"pos": 9, "word": "dict"},
                                    {"pos": 0, "word": ""}, {"pos": 0, "word": "b"}]
    assert parent.to_pylist() == [0, 0, 1, 2]


def batched(result):
    @chunker(batch=True, output_schema=pa.schema([("n", pa.int64())]), on_error="skip")
    def bad(x: pa.Array, __source_row_id: pa.Array) -> pa.RecordBatch:
        return result

    return bad


def test_batched_results_are_checked():
    ok_ids = pa.array([1, 2])
    with pytest.raises(TypeError, match="returned dict; expected a pyarrow RecordBatch"):
        batched({"n": [1]}).apply(pa.record_batch({"x": [0, 0]}), ok_ids)
    with pytest.raises(ValueError, match="returned no '__source_row_id' column"):
        batched(pa.record_batch({"n": [1]})).apply(pa.record_batch({"x": [0, 0]}), ok_ids)
    with pytest.raises(ValueError, match=r"returned columns \['n', 'm', '__source_row_id'\]; expected"):
        batched(pa.record_batch({"n": [1], "m": [1], "__source_row_id": [1]})).apply(
            pa.record_batch({"x": [0, 0]}), ok_ids
        )
    with pytest.raises(TypeError, match="returned string for 'n'; expected int64"):
        batched(pa.record_batch({"n": ["a"], "__source_row_id": [1]})).apply(pa.record_batch({"x": [0, 0]}), ok_ids)
    with pytest.raises(ValueError, match=r"'__source_row_id' values \[7\] that are not among the ids of the 2 parent"):
        batched(pa.record_batch({"n": [1, 2], "__source_row_id": [1, 7]})).apply(
            pa.record_batch({"x": [0, 0]}), ok_ids
        )
    # a table, int32 values and ids cast to the declared types
    children, parent, _ = batched(pa.table({"__source_row_id": pa.array([2], pa.int32()), "n": pa.array([9], pa.int32())})).apply(
        pa.record_batch({"x": [0, 0]}), ok_ids
    )
    assert children.to_pylist() == [{"n": 9}] and parent.to_pylist() == [1]


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError, match="'f': cannot infer the output columns; annotate the return"):

        @chunker
        def f(x: int):
            yield x

    with pytest.raises(ValueError, match="'g': cannot infer the output columns"):

        @chunker
        def g(x: int) -> Iterator[int]:
            yield x

    with pytest.raises(ValueError, match="batched chunker 'h' needs output_schema="):

        @chunker(batch=True)
        def h(x: pa.Array, __source_row_id: pa.Array) -> pa.RecordBatch:
            return pa.record_batch({})

    with pytest.raises(ValueError, match="batched chunker 'i' needs a parameter named '__source_row_id'"):

        @chunker(batch=True, output_schema=pa.schema([("y", pa.int64())]))
        def i(x: pa.Array) -> pa.RecordBatch:
            return pa.record_batch({})

    with pytest.raises(ValueError, match="batched chunker 'j': annotate every input parameter pa.Array"):

        @chunker(batch=True, output_schema=pa.schema([("y", pa.int64())]))
        def j(x: int, __source_row_id: pa.Array) -> pa.RecordBatch:
            return pa.record_batch({})

    with pytest.raises(ValueError, match=r"chunker 'k': parameters \['x'\] are annotated pa.Array; pass batch=True"):

        @chunker(output_schema=pa.schema([("y", pa.int64())]))
        def k(x: pa.Array):
            return []

    with pytest.raises(ValueError, match="chunker 'm': only the batched form"):

        @chunker
        def m(x: int, __source_row_id: int) -> Iterator[Word]:
            return iter([])

    with pytest.raises(ValueError, match="output column '__source_row_id' is a reserved name"):
        chunker(lambda x: [], output_schema=pa.schema([("__source_row_id", pa.int64())]))
    with pytest.raises(ValueError, match="output column '_rowid' is a reserved name"):
        chunker(lambda x: [], output_schema=pa.schema([("_rowid", pa.int64())]))
    with pytest.raises(ValueError, match="output column 'a' appears twice"):
        chunker(lambda x: [], output_schema=pa.schema([("a", pa.int64()), ("a", pa.string())]))
    with pytest.raises(ValueError, match="output_schema must be a pyarrow Schema"):
        chunker(lambda x: [], output_schema=[("a", pa.int64())])
    Untyped = namedtuple("Untyped", ["b"])

    def untyped(x: int) -> Iterator[Untyped]:  # type: ignore[valid-type]
        return iter([])

    with pytest.raises(ValueError, match="field 'b' of Untyped needs a type annotation"):
        chunker(untyped)
    with pytest.raises(ValueError, match=r"'words' has 1 input parameters \['text'\] but 2 input columns"):
        chunker(words.func, input_columns=["a", "b"])
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        chunker(words.func, batch_size=0)
    with pytest.raises(ValueError, match="num_cpus must be a positive number"):
        chunker(words.func, num_cpus=0)
    with pytest.raises(ValueError, match="num_gpus must be a number >= 0"):
        chunker(words.func, num_gpus=-1)
    with pytest.raises(ValueError, match=r"memory must be a positive int \(bytes\)"):
        chunker(words.func, memory=1.5)
    with pytest.raises(ValueError, match="on_error must be 'fail', 'skip' or an OnError"):
        chunker(words.func, on_error="ignore")


def test_validate_inputs_names_the_source_and_the_column():
    with pytest.raises(ValueError, match=r"chunker 'words' parameter 'text' reads column 'text', which the source "
                       r"'docs' does not have \(columns: \['id', 'body'\]\)"):
        words.validate_inputs(pa.schema([("id", pa.int64()), ("body", pa.string())]), "docs")
    with pytest.raises(ValueError, match="parameter 'text' expects str but column 'text' of 'docs' is int64"):
        words.validate_inputs(pa.schema([("text", pa.int64())]), "docs")
    words.validate_inputs(pa.schema([("text", pa.large_string())]), "docs")
    with pytest.raises(ValueError, match="chunker 'halves' parameter 'text' reads column 'text'"):
        halves.validate_inputs(pa.schema([("txt", pa.string())]), "docs")
    halves.validate_inputs(pa.schema([("text", pa.string())]), "docs")


def test_resources_and_options_are_kept():
    c = chunker(words.func, num_cpus=2, num_gpus=0.5, memory=1 << 30, inherit_input_columns=True, batch_size=8)
    assert (c.num_cpus, c.num_gpus, c.memory, c.inherit_input_columns, c.batch_size) == (2.0, 0.5, 1 << 30, True, 8)
    assert c.fingerprint == words.fingerprint  # none of them changes what is computed
    assert chunker(words.func, version="").fingerprint == words.fingerprint


def test_fingerprint_tracks_code_options_and_schema():
    def split(text: str) -> Iterator[Word]:
        yield Word(0, text)

    first = chunker(split)
    assert chunker(split).fingerprint == first.fingerprint

    def split(text: str) -> Iterator[Word]:  # noqa: F811 - same name, new code
        yield Word(1, text)

    assert chunker(split).fingerprint != first.fingerprint
    assert chunker(split, version="v1").fingerprint == chunker(words.func, version="v1").fingerprint
    assert chunker(split, version="v1").fingerprint != chunker(split, version="v2").fingerprint
    wider = pa.schema([("pos", pa.int32()), ("word", pa.string())])
    assert chunker(split, output_schema=wider).fingerprint != chunker(split).fingerprint
    # a chunker and a UDF of the same code never share a fingerprint
    assert udf(lambda x: x, data_type=pa.int64(), version="v1").fingerprint != chunker(split, version="v1").fingerprint


def test_udtf_runs_over_a_partition():
    assert totals.kind == "udtf" and totals.input_columns == ["label", "x"] and totals.partition_by is None
    out = totals.apply(pa.table({"label": ["a", "b", "a"], "x": [1, 2, 3], "other": [0, 0, 0]}))
    assert out.schema == totals.output_schema
    assert sorted(out.to_pylist(), key=lambda r: r["label"]) == [{"label": "a", "total": 4}, {"label": "b", "total": 2}]
    assert totals(pa.table({"label": ["a"], "x": [1]})).num_rows == 1  # a plain callable


def test_udtf_iterator_of_batches_stateful_and_cast():
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])

    @udtf(output_schema=schema, input_columns=["k"], partition_by="k")
    class Count:
        setups = 0

        def __init__(self):
            type(self).setups += 1

        def __call__(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
            yield pa.record_batch({"n": pa.array([table.num_rows], pa.int32()), "k": [table.column("k")[0].as_py()]})
            yield pa.record_batch({"n": pa.array([], pa.int32()), "k": pa.array([], pa.string())})

    assert Count.partition_by == "k" and Count.stateful
    for key in ("a", "b"):
        assert Count.apply(pa.table({"k": [key, key]})).to_pylist() == [{"k": key, "n": 2}]
    assert Count.func.setups == 1

    @udtf(output_schema=schema, input_columns=["k"])
    def nothing(table: pa.Table) -> Iterator[pa.RecordBatch]:
        return iter([])

    assert nothing.apply(pa.table({"k": ["a"]})).schema == schema


def test_udtf_results_are_checked():
    schema = pa.schema([("n", pa.int64())])

    def returning(value):
        return udtf(lambda table: value, output_schema=schema, input_columns=["x"], name="agg")

    table = pa.table({"x": [1]})
    with pytest.raises(TypeError, match="UDTF 'agg' returned int; expected a pyarrow Table, RecordBatch or an iterator"):
        returning(5).apply(table)
    with pytest.raises(TypeError, match="UDTF 'agg' yielded dict; expected pyarrow RecordBatches"):
        returning([{"n": 1}]).apply(table)
    with pytest.raises(ValueError, match=r"UDTF 'agg' returned columns \['m'\]; expected \['n'\]"):
        returning(pa.table({"m": [1]})).apply(table)
    with pytest.raises(TypeError, match="UDTF 'agg' returned string for 'n'; expected int64"):
        returning(pa.table({"n": ["a"]})).apply(table)


def test_udtf_errors_fail_after_retries():
    calls = []

    def agg(table: pa.Table) -> pa.Table:
        calls.append(1)
        raise ConnectionError("down")

    retrying = udtf(agg, output_schema=pa.schema([("n", pa.int64())]), input_columns=["x"],
                    on_error=OnError(retry_on=(ConnectionError,), attempts=2, backoff_s=0))
    with pytest.raises(UdfError, match="'agg' raised ConnectionError: down") as info:
        retrying.apply(pa.table({"x": [1, 2]}))
    assert len(calls) == 2 and info.value.attempts == 2 and info.value.rows == 2


def test_bad_udtf_declarations_are_refused():
    schema = pa.schema([("n", pa.int64())])

    def f(table):
        return table

    with pytest.raises(ValueError, match="UDTF 'f' needs output_schema="):
        udtf(f, input_columns=["x"])
    assert udtf(f, output_schema=schema).input_columns is None  # Geneva's "the whole source": bound with its view
    for bad in ([], "x", [1], ["x", None]):
        with pytest.raises(ValueError, match=r"UDTF 'f': input_columns must be a non-empty list of column names"):
            udtf(f, output_schema=schema, input_columns=bad)
    with pytest.raises(ValueError, match=r"UDTF 'f' partitions by 'k', which is not one of its input_columns \['x'\]"):
        udtf(f, output_schema=schema, input_columns=["x"], partition_by="k")
    with pytest.raises(ValueError, match="UDTF 'f': on_error cannot skip"):
        udtf(f, output_schema=schema, input_columns=["x"], on_error="skip")
    with pytest.raises(ValueError, match="UDTF 'f': on_error cannot skip"):
        udtf(f, output_schema=schema, input_columns=["x"]).with_on_error(OnError(then="skip"))
    with pytest.raises(ValueError, match="UDTF 'f': output column '__key' is a reserved name"):
        udtf(f, output_schema=pa.schema([("__key", pa.int64())]), input_columns=["x"])


def test_udtf_validate_inputs():
    by_k = udtf(lambda t: t, output_schema=pa.schema([("n", pa.int64())]), input_columns=["k", "x"], partition_by="k",
                name="agg")
    with pytest.raises(ValueError, match=r"UDTF 'agg' partitions by column 'k', which the source 'sales' does not "
                       r"have \(columns: \['x'\]\)"):
        by_k.validate_inputs(pa.schema([("x", pa.int64())]), "sales")
    with pytest.raises(ValueError, match=r"UDTF 'agg' reads columns \['x'\], which the source 'sales' does not have"):
        by_k.validate_inputs(pa.schema([("k", pa.int64())]), "sales")
    by_k.validate_inputs(pa.schema([("k", pa.int64()), ("x", pa.int64())]), "sales")


def test_specs_round_trip_in_process_and_refuse_other_kinds():
    for obj in (words, halves, Splitter, totals):
        spec = json.loads(json.dumps(obj.to_spec()))
        assert spec["kind"] == obj.kind and spec["fingerprint"] == obj.fingerprint
        back = from_spec(spec)
        assert type(back) is type(obj) and back.fingerprint == obj.fingerprint
    assert words.to_spec()["output_schema"] == {"pos": "int64", "word": "string"}
    assert words.to_spec()["source_line"] > 0
    with pytest.raises(ValueError, match="does not unpickle to a UDTF"):
        UDTF.from_spec(words.to_spec())
    with pytest.raises(ValueError, match="does not unpickle to a chunker or UDTF"):
        from_spec(udf(lambda x: x, data_type=pa.int64()).to_spec())
    assert isinstance(Chunker.from_spec(words.to_spec()), Chunker)


def test_spec_round_trip_in_a_fresh_interpreter(tmp_path):
    specs = {"words": words, "pieces": pieces, "halves": halves, "splitter": Splitter, "totals": totals}
    path = tmp_path / "specs.json"
    path.write_text(json.dumps({k: v.to_spec() for k, v in specs.items()}))
    code = """
import json, sys
import pyarrow as pa
from mv_assets.model.chunker import from_spec
specs = {k: from_spec(v) for k, v in json.load(open(sys.argv[1])).items()}
docs = pa.record_batch({"text": ["ab cd", "", "e"], "times": [1, 0, 2]})
out = {}
for k, c in specs.items():
    if c.kind == "udtf":
        out[k] = [c.fingerprint, c.apply(pa.table({"label": ["a", "a"], "x": [1, 2]})).to_pylist()]
    else:
        children, parent, _ = c.apply(docs, pa.array([7, 8, 9]))
        out[k] = [c.fingerprint, children.to_pylist(), parent.to_pylist()]
print(json.dumps(out, default=repr))
"""
    result = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=str(tmp_path), check=True
    )
    got = json.loads(result.stdout)
    docs_batch = pa.record_batch({"text": ["ab cd", "", "e"], "times": [1, 0, 2]})
    for k, c in specs.items():
        if c.kind == "udtf":
            expected = [c.fingerprint, c.apply(pa.table({"label": ["a", "a"], "x": [1, 2]})).to_pylist()]
        else:
            children, parent, _ = c.apply(docs_batch, pa.array([7, 8, 9]))
            expected = [c.fingerprint, children.to_pylist(), parent.to_pylist()]
        assert got[k] == json.loads(json.dumps(expected, default=repr)), k


def test_a_udtf_receives_its_partition_with_the_query_builders_reads():
    """Geneva's UDTFs read ``source.to_arrow()`` / ``to_pandas()`` /
    ``to_batches(batch_size=)``; code written for a pyarrow Table keeps working."""
    import copy
    import pickle

    from mv_assets.model.chunker import Partition

    t = pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]})
    p = Partition(t)
    assert p.to_arrow() is t and p.num_rows == len(p) == 3 and p.column_names == ["x", "y"]
    assert [b.num_rows for b in p.to_batches(batch_size=2)] == [2, 1] == [b.num_rows for b in p.to_batches(2)]
    assert p.to_pandas()["x"].tolist() == [1, 2, 3] and p.to_pylist() == t.to_pylist()
    assert p["y"].to_pylist() == ["a", "b", "c"] and p.select(["y"]).to_arrow().column_names == ["y"]
    assert pa.table(p).equals(t)
    assert copy.copy(p).to_arrow().equals(t) and pickle.loads(pickle.dumps(p)).to_arrow().equals(t)

    @udtf(output_schema=pa.schema([("n", pa.int64())]), input_columns=["x"])
    def total(source) -> pa.Table:
        assert isinstance(source, Partition) and source.column_names == ["x"]
        return pa.table({"n": [sum(b.column(0).to_pylist()[0] for b in source.to_arrow().to_batches(1))]})

    assert total.apply(t).to_pylist() == [{"n": 6}]
