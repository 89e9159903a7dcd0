"""User-defined functions: the ``@udf`` decorator, type inference, the checked
call path used by the engine, serialization and code fingerprints.

A :class:`UDF` stays a plain callable: calling it runs the user's function as
written. The engine calls :meth:`UDF.apply` instead, which feeds Arrow data in,
validates what comes back ("expected float64, got string") and counts the rows
it really computed.

Forms (as in Geneva):

* scalar: ``@udf def f(x: int) -> float`` is called once per row with Python
  values; the output type comes from the return annotation (or ``data_type=``).
* batched: parameters annotated ``pa.Array``; called once per batch with Arrow
  arrays; ``data_type=`` is required.
* RecordBatch: a single parameter annotated ``pa.RecordBatch``; it receives all
  source columns of the batch; ``data_type=`` is required.
* stateful: a class whose ``__init__`` does the set-up (load a model) and whose
  ``__call__`` is one of the forms above. It is instantiated once per worker
  process and reused. It is registered as it is, or, as in Geneva, as an
  instance: ``MyModel()`` (``__init__`` arguments allowed,
  ``MyModel(model="small")``) is the UDF whose per-process instance is made
  with them.

:func:`udf`'s arguments in full (its docstring has each in short); from
``on_error`` on, none is part of the fingerprint:

* ``on_error``: ``"fail"`` (default: an exception fails the job), ``"skip"``
  (the row's value stays NULL and an error record is written) or an
  :class:`OnError` with retries and backoff for chosen exceptions; or, as in
  Geneva, a list of ``Retry`` / ``Skip`` / ``Fail`` matchers
  (``retry_transient()``, ``retry_all()``, ``skip_on_error()``,
  ``fail_fast()``; :mod:`mv_assets.model.matchers`).
* ``batch_size``: batched and RecordBatch UDFs: at most this many rows per
  call (a model's memory bound, say). By default a call gets up to 65,536
  rows of a cheap UDF, fewer for an expensive one (sized by time) or for wide
  rows (32 MiB).
* ``checkpoint_size``: as in Geneva: rows per checkpoint. The default
  ``checkpoint_size`` of a backfill of this column and of a refresh of a view
  computing it (the smallest of its UDFs'); an explicit ``checkpoint_size=``
  of the call wins. Without one, results are checkpointed by time.
* ``field_metadata``: as in Geneva: metadata of the output column's Arrow
  field (in the table's or view's schema).
* ``num_cpus``, ``num_gpus``, ``memory``: as in Geneva: what one call of the
  UDF needs (CPUs, GPUs, possibly a fraction, and bytes of memory). Stored
  with the view or column and shown by ``describe()``, ``mv-assets plan`` and
  Dagster. On a Spark cluster a refresh's or backfill's tasks run under a task
  resource profile (docs/deploy.md); local mode and the inline runner warn
  and run CPU tasks.
* ``task_size``: as in Geneva: rows per task, the default ``task_size`` of a
  backfill of this column (a call's own ``task_size=`` wins).
* ``max_concurrency``: at most this many calls of the UDF at once in one
  process (Ray's name for an actor's concurrent calls), however many task
  threads feed it (``InlineRunner(threads=)``, ``SparkRunner(task_threads=)``);
  the other threads read and write meanwhile. A bound on the memory the
  calls hold at once (a large model's activations on one GPU), not a speed
  setting: on an H100 every bound measured was slower than none (docs/
  performance.md). By default, no bound.

Geneva's other :func:`udf` arguments (docs/geneva.md):

* ``error_handling``: Geneva's other name for the policy: an :class:`OnError`
  or a matcher list (Geneva's tenacity ``ErrorHandlingConfig`` is not
  provided). Not together with ``on_error``.
* ``manifest``, ``auto_backfill``: accepted with a ``GenevaCompatWarning``
  when given (tasks run in the executors' environment; nothing backfills a
  column on its own: see docs/geneva.md).
* ``cuda``: Geneva's deprecated flag: ``cuda=True`` with no ``num_gpus`` is
  ``num_gpus=1``.
* ``min_checkpoint_size``, ``max_checkpoint_size``: Geneva's adaptive
  checkpoint bounds: equal, they are a fixed ``checkpoint_size``; other values
  are accepted with a ``GenevaCompatWarning`` (checkpoints are sized by time
  here).
* ``timeout``: Geneva's per-row timeout of scalar UDFs: accepted with a
  ``GenevaCompatWarning`` (no call is interrupted here).
"""

import base64
import contextlib
import copy
import dataclasses
import functools
import hashlib
import inspect
import os
import sys
import sysconfig
import textwrap
import threading
import time
import traceback as _traceback
import typing
from dataclasses import dataclass
from typing import Any, Callable

import cloudpickle
import pyarrow as pa

from mv_assets.model.blobs import logical_type
from mv_assets.model.compat import NO_MANIFEST, warn_ignored
from mv_assets.model.errors import UdfError
from mv_assets.model.idle import keep_seconds
from mv_assets.model.matchers import ExceptionMatcher, Retry, Skip, backoff_seconds, first_match, outcome
from mv_assets.model.names import UdfKind, is_reserved_name
from mv_assets.model.trust import declared_only, resolve, track

__all__ = ["UDF", "udf", "python_type_to_arrow", "Columns", "UnpackedUDF", "OnError", "skip_on_error"]

T = typing.TypeVar("T")


class Columns(typing.Generic[T]):
    """Return annotation of a multi-column UDF: ``-> Columns[MyNamedTuple]``.

    The UDF returns one NamedTuple per row; each field becomes a sibling
    column (``table.add_columns(udf)`` adds them all, computed together).
    """


class UnpackedUDF:
    """A :class:`Columns` UDF whose output columns get a name ``prefix``.

    >>> # table.add_columns(UnpackedUDF(dimensions, prefix="img_"))  # img_height, img_width
    """

    def __init__(self, udf: "UDF", prefix: str = "") -> None:
        if not isinstance(udf, UDF) or not udf.output_fields:
            raise ValueError("UnpackedUDF wraps a multi-column UDF (one annotated -> Columns[NamedTuple])")
        if not isinstance(prefix, str):
            raise ValueError("UnpackedUDF prefix must be a string")
        self.udf = udf
        self.prefix = prefix

    def columns(self) -> dict[str, str]:
        """``{output column: struct field}``."""
        return {f"{self.prefix}{f}": f for f in self.udf.output_fields or []}


@dataclass(frozen=True)
class OnError:
    """What a UDF does when it raises on a row.

    ``retry_on`` exceptions are retried up to ``attempts`` times in all, waiting
    ``backoff_s`` then ``backoff_s * backoff_factor``, ...; a row that still
    fails (or fails with another exception) is then skipped (``then="skip"``:
    the value stays NULL, an error record is written, the rest of the job
    goes on) or fails the job (``then="fail"``).

    Geneva's matcher lists (``on_error=[Retry(...), Skip(...), Fail(...)]``,
    ``retry_transient()``, ``retry_all()``, ``fail_fast()``) are held in
    ``matchers``: the first matcher fitting the exception decides (see
    :mod:`mv_assets.model.matchers`); ``retry_on``, ``attempts`` and the backoff
    fields are then unused.

    >>> from mv_assets.model.matchers import Retry, Skip
    >>> policy = OnError.coerce([Retry(ConnectionError, max_attempts=4), Skip(ValueError)])
    >>> policy.then, policy.max_attempts(ConnectionError()), policy.skips(ValueError()), policy.skips(KeyError())
    ('skip', 4, True, False)
    """

    retry_on: tuple[type, ...] = ()
    attempts: int = 1
    backoff_s: float = 0.1
    backoff_factor: float = 2.0
    then: str = "fail"
    matchers: tuple = ()

    def __post_init__(self) -> None:
        if self.then not in ("skip", "fail"):
            raise ValueError(f"OnError(then=...) must be 'skip' or 'fail', got {self.then!r}")
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError("OnError attempts must be an int >= 1")
        if self.backoff_s < 0 or self.backoff_factor < 1:
            raise ValueError("OnError backoff_s must be >= 0 and backoff_factor >= 1")
        for exc in self.retry_on:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise ValueError(f"OnError retry_on takes exception classes, got {exc!r}")
        for m in self.matchers:
            if not isinstance(m, ExceptionMatcher):
                raise ValueError(f"on_error matchers are Retry(...), Skip(...) or Fail(...), got {m!r}")

    @staticmethod
    def coerce(value: "OnError | str | list | tuple | None") -> "OnError":
        if value is None or value == "fail":
            return OnError()
        if value == "skip":
            return OnError(then="skip")
        if isinstance(value, OnError):
            return value
        if isinstance(value, list | tuple):
            return OnError.from_matchers(value)
        raise ValueError(
            f"on_error must be 'fail', 'skip' or an OnError(...) (or a list of Retry/Skip/Fail matchers), got {value!r}"
        )

    @staticmethod
    def from_matchers(matchers: "list | tuple") -> "OnError":
        """Geneva's ``on_error=[...]``: a row whose retries run out is skipped
        when the list holds a ``Skip`` (as Geneva isolates rows then), else it
        fails the job; ``[]`` (``fail_fast()``) is the default."""
        matchers = tuple(matchers)
        for m in matchers:
            if not isinstance(m, ExceptionMatcher):
                raise ValueError(f"on_error matchers are Retry(...), Skip(...) or Fail(...), got {m!r}")
            if isinstance(m, Skip):
                for name in ("max_skip_count", "max_skip_fraction"):
                    if getattr(m, name) is not None:
                        warn_ignored("Skip", name, getattr(m, name), _NO_SKIP_LIMIT, stacklevel=5)
        if not matchers:
            return OnError()
        return OnError(then="skip" if any(isinstance(m, Skip) for m in matchers) else "fail", matchers=matchers)

    def retries(self, exc: BaseException) -> bool:
        if self.matchers:
            return isinstance(first_match(self.matchers, exc), Retry)
        return bool(self.retry_on) and isinstance(exc, self.retry_on)

    @property
    def may_retry(self) -> bool:
        """Whether any exception is ever retried."""
        if self.matchers:
            return any(isinstance(m, Retry) and m.max_attempts > 1 for m in self.matchers)
        return self.attempts > 1 and bool(self.retry_on)

    def max_attempts(self, exc: BaseException) -> int:
        """Calls in all for a row raising ``exc`` (1: no retry)."""
        if self.matchers:
            m = first_match(self.matchers, exc)
            return m.max_attempts if isinstance(m, Retry) else 1
        return self.attempts if self.retries(exc) else 1

    def wait_s(self, exc: BaseException, attempt: int) -> float:
        """Seconds to wait after call number ``attempt`` raised ``exc``."""
        if self.matchers:
            m = first_match(self.matchers, exc)
            return backoff_seconds(m.backoff if isinstance(m, Retry) else "exponential", attempt)
        return self.backoff_s * self.backoff_factor ** (attempt - 1)

    @property
    def may_skip(self) -> bool:
        """Whether a row may ever be skipped (left NULL, the job going on)."""
        return self.then == "skip" or any(isinstance(m, Skip) for m in self.matchers)

    def skips(self, exc: BaseException) -> bool:
        """Whether a row whose (last) call raised ``exc`` is skipped (NULL and
        an error record) rather than failing the job."""
        if self.matchers:
            decided = outcome(self.matchers, exc)
            return decided == "skip" or (decided == "retry" and self.then == "skip")
        return self.then == "skip"


def _sleep(seconds: float) -> None:
    """The wait between retries (one name, so tests can count the waits)."""
    time.sleep(seconds)


_NO_SKIP_LIMIT = ("a job does not fail on a count or share of skipped rows here: each skipped row is recorded "
                  "(table.get_errors(), db.list_jobs() metrics) and can be retried")


def skip_on_error(max_skip_count: int | None = None, max_skip_fraction: float | None = None) -> list:
    """Geneva's ``skip_on_error()``: a row the UDF raises on stays NULL and gets
    an error record; the job goes on. As in Geneva, the matcher list
    ``[Skip(Exception)]`` (so it combines with others:
    ``[*retry_transient(), *skip_on_error()]``). The limits ``max_skip_count``
    / ``max_skip_fraction`` are accepted with a
    :class:`~mv_assets.model.compat.GenevaCompatWarning` when the UDF is
    declared (no job fails on them here).

    >>> skip_on_error()
    [Skip(Exception, match=None, max_skip_count=None, max_skip_fraction=None)]
    >>> OnError.coerce(skip_on_error()).skips(KeyError())
    True
    """
    return [Skip(Exception, max_skip_count=max_skip_count, max_skip_fraction=max_skip_fraction)]


@dataclass
class RowError:
    """One row a UDF failed on (``index`` is the position in the batch)."""

    index: int
    error_type: str
    message: str
    traceback: str
    attempts: int

SCALAR, ARRAY, BATCH = UdfKind.SCALAR, UdfKind.ARRAY, UdfKind.BATCH

_PY_TO_ARROW = {
    float: pa.float64(),
    int: pa.int64(),
    str: pa.string(),
    bool: pa.bool_(),
    bytes: pa.binary(),
}


def _columns_struct(tp: Any) -> pa.DataType | None:
    """The struct type of a ``Columns[NamedTuple]`` annotation, else None."""
    if typing.get_origin(tp) is not Columns:
        return None
    (inner,) = typing.get_args(tp) or (None,)
    fields = getattr(inner, "_fields", None)
    if not fields:
        raise ValueError(f"Columns[...] takes a NamedTuple class, got {inner!r}")
    return _namedtuple_struct(inner, f"Columns[{getattr(inner, '__name__', inner)}]")


def _is_namedtuple(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, tuple) and bool(getattr(tp, "_fields", None))


def _namedtuple_struct(tp: Any, label: str) -> pa.DataType:
    """The struct type of a NamedTuple class: a field per field, typed by its annotation."""
    hints = typing.get_type_hints(tp)
    out = []
    for name in tp._fields:
        t = python_type_to_arrow(hints.get(name))
        if t is None:
            raise ValueError(f"{label}: field {name!r} needs a type annotation (int, float, str, ...)")
        out.append(pa.field(name, t))
    return pa.struct(out)


def python_type_to_arrow(tp: Any) -> pa.DataType | None:
    """Arrow type for a Python annotation (``float`` is float64), or None."""
    if isinstance(tp, pa.DataType):
        return tp
    struct = _columns_struct(tp)
    if struct is not None:
        return struct
    if _is_namedtuple(tp):  # (-> MyTuple: one struct column; -> Columns[MyTuple]: a column per field)
        return _namedtuple_struct(tp, getattr(tp, "__name__", str(tp)))
    if tp in _PY_TO_ARROW:
        return _PY_TO_ARROW[tp]
    origin = typing.get_origin(tp)
    if origin is list:
        (inner,) = typing.get_args(tp) or (None,)
        inner_type = python_type_to_arrow(inner)
        return pa.list_(inner_type) if inner_type is not None else None
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return python_type_to_arrow(args[0])
    return None


def _compatible(annotation: Any, column_type: pa.DataType) -> bool:
    """Whether a column of ``column_type`` can feed a scalar parameter."""
    target = python_type_to_arrow(annotation)
    if target is None:
        return True  # unannotated or unknown: nothing to check
    if pa.types.is_dictionary(column_type):  # (its values are what the parameter gets)
        column_type = column_type.value_type
    if pa.types.is_floating(target):
        return pa.types.is_floating(column_type) or pa.types.is_integer(column_type)
    if pa.types.is_integer(target):
        return pa.types.is_integer(column_type)
    if pa.types.is_string(target):
        return pa.types.is_string(column_type) or pa.types.is_large_string(column_type) or pa.types.is_string_view(column_type)
    if pa.types.is_binary(target):
        return pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type) or pa.types.is_binary_view(column_type)
    if pa.types.is_boolean(target):
        return pa.types.is_boolean(column_type)
    if pa.types.is_list(target):
        return pa.types.is_list(column_type) or pa.types.is_large_list(column_type)
    return True


def _call_target(func: Callable) -> Callable:
    """The function whose signature describes the UDF (``__call__`` for
    classes, and for instances of a class with ``__call__``: its bound method,
    whose annotations give the return type)."""
    if inspect.isclass(func) or _is_callable_instance(func):
        return func.__call__
    return func


def _is_callable_instance(func: Any) -> bool:
    """An object called through its class's ``__call__`` (not a function, method, class or partial)."""
    return (callable(func) and not inspect.isroutine(func) and not inspect.isclass(func)
            and not isinstance(func, functools.partial))


def _signature(func: Callable) -> inspect.Signature:
    sig = inspect.signature(_call_target(func))
    if inspect.isclass(func):
        params = list(sig.parameters.values())[1:]  # drop self
        sig = sig.replace(parameters=params)
    return sig


def _type_hints(func: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(_call_target(func))
    except Exception:  # unresolvable forward references: fall back to raw
        return dict(getattr(_call_target(func), "__annotations__", {}))


def resource_hints(obj: Any) -> tuple[float, float, int | None]:
    """(num_cpus, num_gpus, memory) of a UDF or table function (UDFs pickled
    before the hints existed: the defaults)."""
    return (float(getattr(obj, "num_cpus", 1.0)), float(getattr(obj, "num_gpus", 0.0)), getattr(obj, "memory", None))


def check_resources(label: str, name: str, num_cpus: Any, num_gpus: Any, memory: Any) -> tuple[float, float, int | None]:
    """Geneva's resource hints of a UDF, chunker or UDTF, checked (ValueError in our words)."""
    num_cpus = 1.0 if num_cpus is None else num_cpus  # Geneva's defaults are None: one CPU, no GPU
    num_gpus = 0.0 if num_gpus is None else num_gpus
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, int | float) or num_cpus <= 0:
        raise ValueError(f"{label} {name!r}: num_cpus must be a positive number, got {num_cpus!r}")
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int | float) or num_gpus < 0:
        raise ValueError(f"{label} {name!r}: num_gpus must be a number >= 0, got {num_gpus!r}")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0):
        raise ValueError(f"{label} {name!r}: memory must be a positive int (bytes), got {memory!r}")
    return float(num_cpus), float(num_gpus), memory


def resources_spec(num_cpus: float, num_gpus: float, memory: int | None) -> dict | None:
    """The hints as stored in a spec (None: the defaults, one CPU and nothing else)."""
    if num_cpus == 1.0 and num_gpus == 0.0 and memory is None:
        return None
    return {"num_cpus": num_cpus, "num_gpus": num_gpus, "memory": memory}


def _check_positive_int(name: str, value: Any, unit: str) -> None:
    """``@udf(name=value)`` is None or a positive int (``unit``: what it counts)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"@udf {name} must be a positive int ({unit}), got {value!r}")


def _kind_of(name: str, annotations: list[Any]) -> UdfKind:
    """A UDF's form from its parameters' annotations: one ``pa.RecordBatch``
    (BATCH), every one ``pa.Array`` (ARRAY) or none of them Arrow (SCALAR)."""
    if len(annotations) == 1 and annotations[0] is pa.RecordBatch:
        return BATCH
    if annotations and all(a is pa.Array for a in annotations):
        return ARRAY
    if any(a is pa.Array or a is pa.RecordBatch for a in annotations):
        raise ValueError(
            f"UDF {name!r}: mix of Arrow and Python parameter annotations; "
            "annotate every parameter pa.Array (batched) or none of them (scalar)"
        )
    return SCALAR


def _output_type(name: str, data_type: Any, hints: dict[str, Any]) -> pa.DataType:
    """The UDF's output type: ``data_type``, else inferred from the return annotation."""
    if data_type is None:
        ret = hints.get("return")
        data_type = python_type_to_arrow(ret) if ret is not None else None
        arrow = isinstance(ret, type) and issubclass(ret, pa.Array | pa.ChunkedArray | pa.RecordBatch | pa.Table)
        if data_type is None and ret is not None and not arrow:  # (Arrow's types say no value type)
            raise ValueError(
                f"UDF {name!r}: its return annotation {getattr(ret, '__name__', ret)!r} has no Arrow type here "
                "(int, float, str, bytes, bool, lists, NamedTuples...): pass @udf(data_type=...), e.g. "
                "data_type=pa.timestamp('us')"
            )
        if data_type is None:
            raise ValueError(
                f"UDF {name!r}: cannot infer the output type; add a return "
                "annotation (e.g. -> float) or pass @udf(data_type=pa.float32())"
            )
    if not isinstance(data_type, pa.DataType):
        raise ValueError(f"UDF {name!r}: data_type must be a pyarrow DataType")
    return data_type


_SWEEP_S = 30.0  # how often a process looks for stateful UDF instances unused too long


def _instance_idle_seconds() -> float:
    """Seconds a stateful UDF instance may go unused before it is let go: the
    time a Spark worker is kept idle (model/idle.py); 0 (or a bad value, which
    the runner refuses first) keeps them all."""
    try:
        return keep_seconds()
    except ValueError:
        return 0.0


def nested_type(schema: pa.Schema, path: str) -> pa.DataType | None:
    """The type of ``path`` in ``schema``: a column's name, or a field of a
    struct column in dot notation (``"info.vals"``, Geneva's); None if none."""
    if path in schema.names:
        return logical_type(schema.field(path))  # (a blob column's values are its bytes)
    head, _, rest = path.partition(".")
    if not rest or head not in schema.names:
        return None
    dtype = schema.field(head).type
    for name in rest.split("."):
        if not pa.types.is_struct(dtype) or dtype.get_field_index(name) < 0:
            return None
        dtype = dtype.field(name).type
    return dtype


def input_values(data: "pa.RecordBatch | pa.Table", path: str) -> Any:
    """The values of ``path`` in ``data``: its column, or a struct column's
    field in dot notation (NULL where the struct is NULL)."""
    if path in data.schema.names:
        return data.column(path)
    import pyarrow.compute as pc

    head, _, rest = path.partition(".")
    return pc.struct_field(data.column(head), rest.split("."))  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)


def _as_array(value: Any) -> Any:
    import numpy as np

    return np.asarray(value)


def _plain_value(value: Any, named: bool) -> Any:
    """A scalar UDF's value as Arrow takes it for ``data_type``: where the
    type is a struct (``named``: a multi-column UDF's, or one struct column),
    a NamedTuple as a dict by field name (Arrow would take its values by
    position), and a value given as Arrow (Geneva's stateful example returns
    ``pa.array(...)``) as Python, so that Arrow casts it (float64 values into
    a float32 list, say)."""
    if named and value is not None and hasattr(value, "_asdict"):
        return value._asdict()
    if isinstance(value, pa.Scalar):
        return value.as_py()  # pyright: ignore[reportOptionalMemberAccess]  (pyarrow's stubs)
    if isinstance(value, pa.Array | pa.ChunkedArray):
        return value.to_pylist()  # pyright: ignore[reportOptionalMemberAccess]
    return value


def _rows_without_nulls(inputs: list) -> Any:
    """A boolean mask of the rows where no input is NULL, or None when no
    input has a NULL (every row is called). A dictionary's NULLs may sit in
    its values (and a run-end encoded array's in its runs), which its
    ``null_count`` does not count: its validity is read value by value."""
    if not any(a.null_count or _nulls_uncounted(a.type) for a in inputs):
        return None
    import pyarrow.compute as pc

    kept = pc.is_valid(inputs[0])  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
    for a in inputs[1:]:
        kept = pc.and_(kept, pc.is_valid(a))  # pyright: ignore[reportAttributeAccessIssue]
    return None if pc.all(kept).as_py() else kept  # pyright: ignore[reportAttributeAccessIssue]


def _nulls_uncounted(t: pa.DataType) -> bool:
    return pa.types.is_dictionary(t) or pa.types.is_run_end_encoded(t)


def _stop_raised(fn: Callable, args: list) -> Exception:
    """The StopIteration (or subclass) ``fn(*args)`` raises, called again for it."""
    try:
        fn(*args)
    except Exception as exc:
        return exc
    return StopIteration()


def _holds_integers(t: pa.DataType) -> bool:
    """Whether values of type ``t`` hold integers (itself, or its lists' or structs' fields)."""
    if pa.types.is_integer(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _holds_integers(t.value_type)
    if pa.types.is_struct(t):
        return any(_holds_integers(f.type) for f in t)
    return False


def _may_hold_fractions(values: list, t: pa.DataType) -> bool:
    """Whether a float may sit among ``values`` where ``t`` wants integers: a
    float (Python's or NumPy's) among them, or, for nested types, any value
    that is a sequence or mapping (looked at once a batch, not value by value)."""
    import numpy as np

    kinds = set(map(type, values))
    if pa.types.is_integer(t):
        return any(issubclass(k, float | np.floating) for k in kinds)
    return any(k is not type(None) for k in kinds)


def _is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def typed_array(values: list, t: pa.DataType) -> pa.Array:
    """Python values returned by user code as an array of type ``t``, none of
    them changed on the way: a float where ``t`` holds integers is cast safely
    (:func:`_safely_cast`); Arrow's errors are raised as they come."""
    if pa.types.is_struct(t):
        _check_struct_keys(values, t)
    if _holds_integers(t) and _may_hold_fractions(values, t):
        exact = _safely_cast(values, t)
        if exact is not None:
            return exact
    return pa.array(values, type=t)


def _check_struct_keys(values: list, t: pa.StructType) -> None:
    """A dict returned for a struct column names only its fields: Arrow drops
    a key that is none of them without a word (a typo's value was lost, the
    field NULL, the row counted computed)."""
    names = {t.field(i).name for i in range(t.num_fields)}
    for v in values:
        if isinstance(v, dict) and not names.issuperset(v):
            extra = sorted(str(k) for k in v if k not in names)
            raise TypeError(f"returned a dict with keys {extra}, which are no field of its struct type {t} "
                            f"(fields: {sorted(names)})")


def _safely_cast(values: list, t: pa.DataType) -> "pa.Array | None":
    """``values`` as type ``t`` where it holds integers: Arrow truncates a
    float into an integer type without a word (0.25 -> 0), so the values as
    Arrow makes them of themselves, then cast safely (2.0 -> 2 is taken, 0.25
    refused: ArrowInvalid, as ``Table.add()`` refuses it). None where Arrow
    cannot make them of themselves or has no such cast (the caller converts
    them to ``t`` directly, as before)."""
    try:
        inferred = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError):
        return None
    try:
        return inferred.cast(t)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _positions(mask: Any) -> Any:
    """The positions (a NumPy array) where a boolean mask is true."""
    import numpy as np

    return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


def _spread(values: pa.Array, mask: Any) -> pa.Array:
    """``values`` (one per true row of ``mask``) in their rows, NULL in the others."""
    import numpy as np

    keep = mask.to_numpy(zero_copy_only=False)
    index = np.cumsum(keep) - 1
    try:
        return values.take(pa.array(index, pa.int64(), mask=~keep))
    except pa.ArrowNotImplementedError:  # no take of string_view, binary_view, run-end encoded...: made again from Python
        given = iter(values.to_pylist())
        return pa.array([next(given) if k else None for k in keep], values.type)


# How a column's value becomes a scalar parameter annotated with a class of
# another layer, by the class's "module.qualname": ``lance.blob.BlobFile``
# (Geneva passes a blob column's values as file objects) is registered by
# mv_assets.execution.blobs, which owns Lance; this module stays free of it.
PARAM_ADAPTERS: dict[str, Callable[[Any], Any]] = {}


def _adapter(annotation: Any) -> Callable[[Any], Any] | None:
    """The registered adapter of a parameter annotated ``annotation`` (or ``X | None``), if any."""
    for a in (annotation, *typing.get_args(annotation)):
        key = f"{getattr(a, '__module__', '')}.{getattr(a, '__qualname__', '')}"
        if key in PARAM_ADAPTERS:
            return PARAM_ADAPTERS[key]
    return None


def adapted(cols: list[list], param_names: list[str], annotations: dict[str, Any]) -> list[list]:
    """A scalar call's argument columns (one per parameter), each value adapted
    where its parameter's annotation has an adapter (a blob's bytes as a
    ``BlobFile``); NULLs stay None. The columns as they are when none has one."""
    adapters = [_adapter(annotations.get(p)) for p in param_names]
    if not any(adapters):
        return cols
    return [[a(v) if v is not None else v for v in col] if a else col for col, a in zip(cols, adapters, strict=True)]


def _wants_ndarray(annotation: Any) -> bool:
    """Whether a scalar parameter is annotated ``np.ndarray`` (or ``np.ndarray | None``):
    its list values are passed as NumPy arrays, as Geneva does."""
    if getattr(annotation, "__name__", None) == "ndarray" and getattr(annotation, "__module__", None) == "numpy":
        return True
    return any(_wants_ndarray(a) for a in typing.get_args(annotation))


class UDF:
    """A user-defined column function. Create with :func:`udf`."""

    def __init__(
        self,
        func: Callable,
        *,
        name: str | None = None,
        data_type: pa.DataType | None = None,
        input_columns: list[str] | None = None,
        version: str | None = None,
        skip_nulls: bool = True,
        on_error: "OnError | str | list | None" = None,
        batch_size: int | None = None,
        checkpoint_size: int | None = None,
        field_metadata: dict[str, str] | None = None,
        num_cpus: float | None = 1.0,
        num_gpus: float | None = 0.0,
        memory: int | None = None,
        task_size: int | None = None,
        manifest: Any = None,
        auto_backfill: bool = False,
        max_concurrency: int | None = None,
    ) -> None:
        if not callable(func):
            raise ValueError(f"@udf needs a function or class, got {func!r}")
        _check_positive_int("task_size", task_size, "rows per task")
        _check_positive_int("max_concurrency", max_concurrency, "calls at once in a process")
        self.max_concurrency = max_concurrency
        if manifest is not None:
            warn_ignored("udf", "manifest", manifest, NO_MANIFEST, stacklevel=4)
        if auto_backfill:
            warn_ignored("udf", "auto_backfill", auto_backfill, _NO_AUTO_BACKFILL, stacklevel=4)
        self.task_size = task_size
        self.num_cpus, self.num_gpus, self.memory = check_resources(
            "UDF", name or getattr(func, "__name__", "udf"), num_cpus, num_gpus, memory)
        _check_positive_int("batch_size", batch_size, "rows per call")
        _check_positive_int("checkpoint_size", checkpoint_size, "rows per checkpoint")
        self.batch_size = batch_size
        self.checkpoint_size = checkpoint_size
        self.field_metadata = _checked_field_metadata(field_metadata)
        self.func = func
        self.name = name or getattr(func, "__name__", "udf")
        self.stateful = inspect.isclass(func)
        self.version = version
        self.skip_nulls = skip_nulls
        self.on_error = OnError.coerce(on_error)
        sig = _signature(func)
        hints = _type_hints(func)
        params = [
            p
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        self.param_names = [p.name for p in params]
        self.param_annotations = {p.name: hints.get(p.name) for p in params}
        self.kind = _kind_of(self.name, list(self.param_annotations.values()))
        self.input_columns: list[str] = self._checked_inputs(input_columns)
        self.data_type = out_type = _output_type(self.name, data_type, hints)
        ret = hints.get("return")
        # Multi-column UDF: annotated -> Columns[NamedTuple]; one sibling column per field.
        self.output_fields: list[str] | None = (
            [f.name for f in out_type] if typing.get_origin(ret) is Columns and pa.types.is_struct(out_type) else None
        )
        self._fingerprint: str | None = None
        track(self)  # code this process made: what MV_ASSETS_CODE=declared runs (model.trust)

    # -- plain callable -------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.stateful:
            if constructs(self.func, args, kwargs):
                made = with_init_args(self, args, kwargs)
                track(made)
                return made
            return self._instance()(*args, **kwargs)
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"UDF({self.name}, kind={self.kind}, inputs={self.input_columns}, type={self.data_type})"

    def _checked_inputs(self, input_columns: list[str] | None) -> list[str]:
        """The columns the parameters read, checked against the signature."""
        if self.kind == BATCH:
            if input_columns:
                raise ValueError(
                    f"UDF {self.name!r} takes a pa.RecordBatch: it receives every "
                    "source column, so input_columns must not be given"
                )
            return []
        inputs = list(input_columns or self.param_names)
        if len(inputs) != len(self.param_names):
            raise ValueError(
                f"UDF {self.name!r} has {len(self.param_names)} parameters "
                f"{self.param_names} but {len(inputs)} input columns "
                f"{inputs} were given"
            )
        return inputs

    def with_inputs(self, input_columns: list[str]) -> "UDF":
        """A copy of this UDF reading its parameters from other columns; every
        other setting (``batch_size``, error policy, version...) is kept."""
        u = copy.copy(self)
        u.input_columns = self._checked_inputs(input_columns)
        u.__dict__.pop("_input_paths", None)
        u._fingerprint = None
        return u

    @property
    def input_paths(self) -> list[str]:
        """What each parameter reads: a source column, or a field of a struct
        column in dot notation (``"info.vals"``). ``input_columns`` are the
        source columns read: a struct field's column (see :meth:`bound_to`)."""
        return self.__dict__.get("_input_paths") or self.input_columns

    def _with_paths(self, paths: list[str], columns: list[str]) -> "UDF":
        u = copy.copy(self)
        u.__dict__["_input_paths"] = list(paths)
        u.input_columns = list(columns)  # (the fingerprint hashes the paths: unchanged)
        return u

    def bound_to(self, schema: "pa.Schema | list[str]", struct_paths: bool = False) -> "UDF":
        """This UDF with its inputs fixed against ``schema`` (the input table's
        schema when the column or view is created).

        A RecordBatch UDF receives "every column": that means the data columns
        of the input at creation, fixed from then on, so rows computed before
        and after the input gains a column see the same batch. Other kinds
        already name their inputs and are returned as they are, but with
        ``struct_paths`` (one source, not a join), where an input names a
        struct column's field in dot notation: then the struct's column is
        what it reads. A list of names (an altered column keeping its
        columns) is taken as it is.
        """
        if self.kind != BATCH and struct_paths and isinstance(schema, pa.Schema):
            # an input in dot notation naming a struct's field (not a column of that name): its
            # struct column is read, the field taken out for the call (not in join views,
            # whose dotted names are table.column)
            paths, struct = self.input_paths, typing.cast(pa.Schema, schema)
            heads = [p if p in struct.names or nested_type(struct, p) is None else p.partition(".")[0] for p in paths]
            if heads != paths:
                return self._with_paths(paths, list(dict.fromkeys(heads)))
            return self
        if self.kind != BATCH or self.input_columns:
            return self
        u = copy.copy(self)
        u.input_columns = list(schema) if isinstance(schema, list) else [n for n in schema.names if not _is_internal(n)]
        u._fingerprint = None
        return u

    def with_on_error(self, on_error: "OnError | str | list") -> "UDF":
        """A copy of this UDF with another error policy (same fingerprint)."""
        u = copy.copy(self)
        u.on_error = OnError.coerce(on_error)
        return u

    # -- checked call path ----------------------------------------------
    _instances: dict[str, Any] = {}
    # held while a stateful UDF is constructed: tasks on several threads of a
    # process (InlineRunner(threads=...)) share one instance, set up once
    _instances_lock = threading.RLock()
    # seconds this process spent constructing stateful UDFs (their set-up: a
    # model's load), for the tasks' stage timings (execution.stages)
    setup_seconds: float = 0.0
    # the same, per thread: a task's share when tasks run on several threads
    _setup_here = threading.local()

    # when each instance was last asked for (time.monotonic()), and when unused ones were
    # last let go: a process that lives long (a Spark worker the daemon keeps, a notebook)
    # does not hold every model it ever set up, such as those of columns since redefined
    _last_used: dict[str, float] = {}
    _last_sweep: float = 0.0

    def _instance(self) -> Any:
        key = self.instance_key()
        now = time.monotonic()
        inst = UDF._instances.get(key)
        UDF._last_used[key] = now
        if now - UDF._last_sweep >= _SWEEP_S:
            UDF.drop_unused_instances(now)
        if inst is None:
            with UDF._instances_lock:
                inst = UDF._instances.get(key)
                if inst is None:
                    args, kwargs = getattr(self, "init_args", None) or ((), {})
                    started = time.perf_counter()
                    inst = self.func(*args, **kwargs)
                    spent = time.perf_counter() - started
                    UDF.setup_seconds += spent
                    UDF._setup_here.seconds = UDF.setup_seconds_here() + spent
                    UDF._instances[key] = inst
                    UDF._last_used[key] = time.monotonic()
        return inst

    @staticmethod
    def drop_unused_instances(now: float | None = None) -> list[str]:
        """Let go of the stateful UDF instances (models) this process has not
        used for ``$MV_ASSETS_PYTHON_WORKER_KEEP_S`` seconds (900; 0 or unset
        by a bad value: never), as a kept Spark worker is let go after that
        long idle. Returns their keys. A task using one holds its own
        reference: at worst the next call sets it up again."""
        now = time.monotonic() if now is None else now
        idle = _instance_idle_seconds()
        with UDF._instances_lock:
            UDF._last_sweep = now
            if not idle:
                return []
            old = [k for k, t in list(UDF._last_used.items()) if now - t > idle]
            for k in old:
                UDF._last_used.pop(k, None)
                UDF._instances.pop(k, None)
            gone = set(old)
            for g in [g for g in UDF._gates if g[0] in gone]:
                UDF._gates.pop(g, None)
            for k in gone:
                UDF._warm.pop(k, None)
                UDF._warming.pop(k, None)
            return old

    @staticmethod
    def setup_seconds_here() -> float:
        """Seconds this thread spent constructing stateful UDFs (see ``setup_seconds``)."""
        return getattr(UDF._setup_here, "seconds", 0.0)

    def instance_key(self) -> str:
        """Which function this is: the code fingerprint and the values it
        captured (:func:`captured_digest`: closure cells, defaults, class
        attributes, a Geneva-style instance's ``__init__`` arguments), so two
        functions (or stateful classes) of the same code that captured
        different values (a factory's ``model_path``) never share an instance
        or a computation, and the same code with the same values is one
        instance however it was loaded (the user's object, its stored pickle,
        a copy). Found once per UDF object, and carried by its pickle."""
        key = self.__dict__.get("_ikey")
        if key is None:
            captured = captured_digest(self.func, getattr(self, "init_args", None))
            key = self._ikey = f"{self.fingerprint}:{captured}"
        return key

    def _target(self) -> Callable:
        return self._instance() if self.stateful else self.func

    def call_limit(self) -> int:
        """How many calls of this UDF a process runs at once: ``max_concurrency``
        (0: no bound, the default)."""
        return getattr(self, "max_concurrency", None) or 0  # UDFs pickled before it existed lack it

    # one gate per UDF (by its instance key) and bound in a process: the calls it lets through at once
    _gates: dict[tuple[str, int], threading.BoundedSemaphore] = {}
    # stateful instances whose first call has returned in this process (instance key -> id of the
    # instance), and the lock their first calls take: until an instance's first call returns, its
    # calls run one at a time, so a model the UDF loads lazily in its first __call__ (as Geneva's
    # examples do: ``if not self.is_loaded: self.setup()``) is loaded once, not by each task thread
    _warm: dict[str, int] = {}
    _warming: dict[str, threading.Lock] = {}

    @contextlib.contextmanager
    def _gate(self, target: Any = None) -> "typing.Iterator[None]":
        """What a call of ``target`` (the UDF's instance or function) holds
        while it runs: a slot of this UDF's bound in this process, shared by
        the threads of every task calling it (none without a bound); and, for
        a stateful instance whose first call has not returned yet, that
        instance to itself (the other threads wait for its first call)."""
        limit = self.call_limit()
        bound: Any = contextlib.nullcontext()
        if limit:
            key = (self.instance_key(), limit)
            bound = UDF._gates.get(key)
            if bound is None:
                with UDF._instances_lock:
                    bound = UDF._gates.setdefault(key, threading.BoundedSemaphore(limit))
        with bound:
            ikey = self.instance_key() if self.stateful and target is not None else None
            if ikey is None or UDF._warm.get(ikey) == id(target):
                yield
                return
            with UDF._instances_lock:
                first = UDF._warming.setdefault(ikey, threading.Lock())
            with first:
                if UDF._warm.get(ikey) != id(target):
                    yield  # the instance's first call, alone (raising, it leaves the next call first)
                    UDF._warm[ikey] = id(target)
                    return
            yield

    def validate_inputs(self, schema: pa.Schema, column_label: str) -> None:
        """Raise ValueError if the inputs are missing or of the wrong type."""
        if self.kind == BATCH:
            missing = [c for c in self.input_columns if c not in schema.names]
            if missing:
                raise ValueError(
                    f"column {column_label!r}: RecordBatch UDF {self.name!r} reads columns {missing}, "
                    f"which the input does not have (columns: {schema.names})"
                )
            return
        for param, col in zip(self.param_names, self.input_paths, strict=True):
            col_type = nested_type(schema, col)
            if col_type is None:
                raise ValueError(
                    f"column {column_label!r}: UDF {self.name!r} parameter {param!r} reads "
                    f"column {col!r}, which the source does not have (columns: {schema.names})"
                )
            if self.kind == SCALAR:
                ann = self.param_annotations.get(param)
                if ann is not None and not _compatible(ann, col_type):
                    raise ValueError(
                        f"column {column_label!r}: UDF {self.name!r} parameter {param!r} "
                        f"expects {getattr(ann, '__name__', ann)} but column {col!r} is {col_type}"
                    )

    def _call(self, call: Callable[[], Any]) -> tuple[Any, int]:
        """Run ``call`` under the retry policy; return (result, attempts)."""
        try:
            return call(), 1
        except Exception as exc:
            first = exc
        return self._retried(call, first)

    def _retried(self, call: Callable[[], Any], exc: Exception) -> tuple[Any, int]:
        """``call``'s first attempt raised ``exc``: retry it as the policy says
        for that exception; return (result, attempts) or raise the last
        exception (its ``__mv_attempts__`` set)."""
        policy = self.on_error
        attempt = 1
        while attempt < policy.max_attempts(exc):
            _sleep(policy.wait_s(exc, attempt))
            attempt += 1
            try:
                return call(), attempt
            except Exception as again:
                exc = again
        exc.__mv_attempts__ = attempt  # type: ignore[attr-defined]
        raise exc

    def _row_error(self, index: int, exc: BaseException) -> RowError:
        return RowError(
            index=index,
            error_type=type(exc).__name__,
            message=str(exc)[:2000],
            traceback="".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:],
            attempts=getattr(exc, "__mv_attempts__", 1),
        )

    def _failure(self, index: int, rows: int, exc: BaseException) -> UdfError:
        """The error that stops the job (on_error "fail"): rows ``index`` ..
        ``index + rows - 1`` of the batch (one row, or for a batched UDF the
        smallest part of its batch that raised, see :meth:`_failing_part`)."""
        e = self._row_error(index, exc)
        return UdfError(self.name, e.error_type, e.message, traceback=e.traceback, attempts=e.attempts,
                        row_index=index, rows=rows)

    def apply(self, batch: pa.RecordBatch, errors: list[RowError] | None = None) -> tuple[pa.Array, int]:
        """Compute the UDF over ``batch``; return (values, rows computed).

        ``batch`` holds the input columns under their source names (for a
        RecordBatch UDF: all source columns). The result is validated against
        ``data_type`` and the batch length. Under ``on_error`` "skip", rows
        the function raises on get NULL and a :class:`RowError` in ``errors``
        (a batched UDF that raises is re-run row by row to find them).
        """
        limit = getattr(self, "batch_size", None)  # UDFs pickled before batch_size existed lack it
        if limit and batch.num_rows > limit and self.kind != SCALAR:
            return self._apply_in_slices(batch, limit, errors)
        if errors is None:
            errors = []
        if self.kind == SCALAR:
            return self._apply_scalar(batch, errors)
        return self._apply_batched(batch, errors)

    def called_rows(self, batch: pa.RecordBatch) -> "Any | None":
        """A boolean NumPy mask of the rows of ``batch`` (its input columns)
        ``apply`` calls the function on, None for every row: a scalar UDF
        under ``skip_nulls`` gives a row with a NULL input NULL without a call."""
        if self.kind != SCALAR or not self.skip_nulls or not self.param_names:
            return None
        kept = _rows_without_nulls([input_values(batch, c) for c in self.input_paths])
        return None if kept is None else kept.to_numpy(zero_copy_only=False)

    # -- scalar UDFs: once per row --------------------------------------
    def _apply_scalar(self, batch: pa.RecordBatch, errors: list[RowError], fast: bool = True) -> tuple[pa.Array, int]:
        """``apply`` of a scalar UDF. What a row needs beyond the call is
        decided once per batch (:meth:`_scalar_fast`); ``fast=False`` (and a
        UDF of no parameter) runs :meth:`_scalar_rowwise`, which decides it
        row by row: the reference the fast path is tested against."""
        fn = self._target()
        if not fast or not self.param_names:
            values, computed = self._scalar_rowwise(fn, batch, errors)
            return self._check_output(self._scalar_array(values, True), batch.num_rows), computed
        return self._scalar_fast(fn, batch, errors)

    def _scalar_rowwise(self, fn: Callable, batch: pa.RecordBatch, errors: list[RowError]) -> tuple[list, int]:
        """The values of a scalar UDF over ``batch``, each row checked on its
        own: NULL inputs, NumPy arguments, retries, skips, Arrow values and
        NamedTuples returned. Returns (values as Python, rows computed)."""
        cols = adapted([input_values(batch, c).to_pylist() for c in self.input_paths], self.param_names,
                       self.param_annotations)
        arrays = [_wants_ndarray(self.param_annotations.get(p)) for p in self.param_names]
        policy, named, ndarrays = self.on_error, pa.types.is_struct(self.data_type), any(arrays)
        values: list[Any] = []
        computed = 0
        with self._gate(fn):  # a batch's rows, one slot
            for i, row in enumerate(zip(*cols, strict=True) if cols else ([()] * batch.num_rows)):
                if self.skip_nulls and None in row:
                    values.append(None)
                    continue
                computed += 1
                if ndarrays:  # list values as NumPy arrays where the parameter says np.ndarray
                    row = tuple(_as_array(v) if a and v is not None else v for v, a in zip(row, arrays, strict=True))
                try:
                    value = self._call(lambda row=row: fn(*row))[0] if policy.may_retry else fn(*row)
                except Exception as exc:
                    if not policy.skips(exc):
                        raise self._failure(i, 1, exc) from exc
                    errors.append(self._row_error(i, exc))
                    value = None
                values.append(_plain_value(value, named))
        return values, computed

    def _scalar_fast(self, fn: Callable, batch: pa.RecordBatch, errors: list[RowError]) -> tuple[pa.Array, int]:
        """``apply`` of a scalar UDF with the per-row work chosen once per batch:
        rows with a NULL input are left out beforehand (Arrow's filter, when
        ``skip_nulls`` and an input has NULLs) and get NULL after; NumPy
        arguments are made column by column; the function is mapped over the
        argument columns with nothing else per row, a row that raises handled
        apart (:meth:`_failed_row`: retries, skip or fail) before the map goes
        on from the next row; values returned as Arrow or as NamedTuples are
        made Python once per batch (:meth:`_scalar_array`)."""
        n = batch.num_rows
        inputs = [input_values(batch, c) for c in self.input_paths]
        kept = _rows_without_nulls(inputs) if self.skip_nulls else None  # None: every row is called
        if kept is not None:
            inputs = [a.filter(kept) for a in inputs]
        cols = adapted([a.to_pylist() for a in inputs], self.param_names, self.param_annotations)
        for k, p in enumerate(self.param_names):
            if _wants_ndarray(self.param_annotations.get(p)):  # list values as NumPy arrays
                cols[k] = [_as_array(v) if v is not None else v for v in cols[k]]
        rows = None if kept is None else _positions(kept)
        its, called = [iter(c) for c in cols], len(cols[0])
        values: list[Any] = []
        with self._gate(fn):  # a batch's rows, one slot
            while True:
                try:
                    values.extend(map(fn, *its))  # (a row that raises leaves the rows before it in values)
                except Exception as exc:
                    failed = exc
                else:
                    if len(values) == called:
                        break
                    # the map ended early: the function raised StopIteration, which map takes for
                    # its end and drops; the row is called once more for it (its message and class
                    # decide what on_error does), a second call only on such a row
                    failed = _stop_raised(fn, [c[len(values)] for c in cols])
                i = len(values)  # the row that raised; its iterators stand at the next one
                index = i if rows is None else int(rows[i])
                values.append(self._failed_row(fn, [c[i] for c in cols], failed, index, errors))
        out = self._scalar_array(values, False)
        if kept is not None:
            out = _spread(out, kept)
        return self._check_output(out, n), len(values)

    def _failed_row(self, fn: Callable, args: list, exc: Exception, index: int, errors: list[RowError]) -> Any:
        """The value of a row whose call raised ``exc`` (row ``index`` of the
        batch): its retries' result, or None with a :class:`RowError` in
        ``errors`` when the policy skips it; else the job fails."""
        policy = self.on_error
        if policy.may_retry:
            try:
                return self._retried(lambda: fn(*args), exc)[0]
            except Exception as last:
                exc = last
        if not policy.skips(exc):
            raise self._failure(index, 1, exc) from exc
        errors.append(self._row_error(index, exc))
        return None

    def _scalar_array(self, values: list, plain: bool) -> pa.Array:
        """A scalar UDF's values as an array of ``data_type``. Unless ``plain``
        (made Python already), values given as Arrow (Geneva's stateful example
        returns ``pa.array(...)`` for a row) are made Python when Arrow refuses
        them, and a multi-column UDF's NamedTuples are taken by field name."""
        named = pa.types.is_struct(self.data_type)
        if not plain and named and any(hasattr(t, "_asdict") for t in set(map(type, values))):
            values, plain = [_plain_value(v, named) for v in values], True
        try:
            return typed_array(values, self.data_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError) as exc:
            if not plain:  # Arrow values among them: as Python, so Arrow casts them (float64 into float32, say)
                return self._scalar_array([_plain_value(v, named) for v in values], True)
            got = sorted({type(v).__name__ for v in values if v is not None})
            raise TypeError(
                f"UDF {self.name!r} returned {', '.join(got)} values; expected {self.data_type}: {exc}"
            ) from exc

    # -- batched and RecordBatch UDFs: once per batch -------------------
    def _apply_batched(self, batch: pa.RecordBatch, errors: list[RowError]) -> tuple[pa.Array, int]:
        """``apply`` of a batched or RecordBatch UDF: one call for the batch;
        when it raises under a policy that may skip, row by row to find the
        failing rows."""
        n = batch.num_rows
        fn = self._target()
        policy = self.on_error
        try:
            out, _ = self._call(lambda: self._call_batch(fn, batch))
            return self._check_output(out, n), n
        except Exception as exc:
            if getattr(exc, "__mv_output_error__", False):
                raise
            if policy.then != "skip":  # no exception is skipped (which are: policy.skips(exc))
                index, rows, cause = self._failing_part(fn, batch, exc)
                raise self._failure(index, rows, cause) from cause
        # The batch failed: find the failing rows one by one.
        parts = []
        for i in range(n):
            row = batch.slice(i, 1)
            try:
                value, _ = self._call(lambda row=row: self._call_batch(fn, row))
                parts.append(self._check_output(value, 1))
            except Exception as exc:
                if getattr(exc, "__mv_output_error__", False):
                    raise
                if not policy.skips(exc):
                    raise self._failure(i, 1, exc) from exc
                errors.append(self._row_error(i, exc))
                parts.append(pa.nulls(1, self.data_type))
        out = pa.concat_arrays(parts) if parts else pa.array([], self.data_type)
        return out, n

    def _failing_part(self, fn: Callable, batch: pa.RecordBatch, exc: Exception) -> tuple[int, int, Exception]:
        """The smallest part of a batch that raised (on_error "fail") found by
        halving it: (first row, rows, its exception). A half that raises alone
        is halved again, so a row that fails names itself after about log2(n)
        calls and n rows computed again (on the failure path only); where
        neither half raises alone (the batch fails as a whole: out of memory,
        say), that part is named."""
        lo, n = 0, batch.num_rows
        attempts = getattr(exc, "__mv_attempts__", 1)  # the batch's: the parts are called once each
        while n > 1:
            half = n // 2
            for start, size in ((lo, half), (lo + half, n - half)):
                try:
                    self._call_batch(fn, batch.slice(start, size))
                except Exception as found:
                    found.__mv_attempts__ = attempts  # type: ignore[attr-defined]
                    lo, n, exc = start, size, found
                    break
            else:
                break  # neither half raises alone
        return lo, n, exc

    def _apply_in_slices(self, batch: pa.RecordBatch, limit: int, errors: list[RowError] | None):
        """``apply`` over consecutive slices of at most ``limit`` rows (``batch_size``)."""
        parts, computed = [], 0
        for start in range(0, batch.num_rows, limit):
            found: list[RowError] = []
            try:
                values, n = self.apply(batch.slice(start, limit), found)
            except UdfError as exc:
                exc.row_index = (exc.row_index or 0) + start
                raise
            parts.append(values)
            computed += n
            if errors is not None:
                errors.extend(dataclasses.replace(e, index=e.index + start) for e in found)
        return pa.concat_arrays(parts), computed

    def _call_batch(self, fn: Callable, batch: pa.RecordBatch) -> Any:
        args = ([batch.select(self.input_columns) if self.input_columns else batch] if self.kind == BATCH
                else [input_values(batch, c) for c in self.input_paths])
        with self._gate(fn):
            return fn(*args)

    def _check_output(self, out: Any, n: int) -> pa.Array:
        def fail(exc: Exception) -> Exception:
            exc.__mv_output_error__ = True  # type: ignore[attr-defined]
            return exc

        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        if isinstance(out, pa.RecordBatch) and pa.types.is_struct(self.data_type):
            out = pa.StructArray.from_arrays(out.columns, names=out.schema.names)
        if not isinstance(out, pa.Array):
            try:
                out = pa.array(out, type=self.data_type)
            except Exception as exc:
                raise fail(TypeError(
                    f"UDF {self.name!r} returned {type(out).__name__}; expected a pyarrow "
                    f"Array of {self.data_type}"
                )) from exc
        if len(out) != n:
            raise fail(ValueError(f"UDF {self.name!r} returned {len(out)} values for a batch of {n} rows"))
        if out.type != self.data_type:
            if _is_text(out.type) != _is_text(self.data_type):  # (Arrow would parse "7" as 7, or print 7 as "7")
                raise fail(TypeError(f"UDF {self.name!r} returned {out.type}; expected {self.data_type} (text is "
                                     "not converted to or from other types: return the declared type)"))
            try:
                out = out.cast(self.data_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise fail(TypeError(f"UDF {self.name!r} returned {out.type}; expected {self.data_type}")) from exc
        return out

    # -- identity and serialization -------------------------------------
    @property
    def fingerprint(self) -> str:
        """A hash of the UDF's code and signature: changes when the code does."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(f"{self.kind}|{self.data_type}|{self.input_paths}|{self.version}|{self.skip_nulls}".encode())
            if self.version is None:
                h.update(_code_identity(self.func))
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def to_spec(self) -> dict:
        """The UDF as stored in a view's definition. A UDF loaded from a stored
        spec gives that spec back as it was (re-pickling it and finding its
        source, ~4 ms a UDF, is what a small refresh spent most on)."""
        stored = self.__dict__.get("_stored_spec")
        if stored is not None:
            return dict(stored)
        spec = {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "input_columns": self.input_columns,
            **({"input_paths": self.input_paths} if self.input_paths != self.input_columns else {}),
            "data_type": str(self.data_type),
            "kind": self.kind,
            "pickle": base64.b64encode(dumps_by_value(self)).decode("ascii"),
            "instance": self.instance_key(),
        }
        hints = resources_spec(*resource_hints(self))
        if hints is not None:
            spec["resources"] = hints
        where = self.code_location()
        if where is not None:
            spec["source_file"], spec["source_line"] = where
        return spec

    def code_location(self) -> tuple[str, int] | None:
        """File and first line of the UDF's code, when Python knows them (found
        once: for a class Python parses its whole module)."""
        if "_location" not in self.__dict__:
            try:
                path = inspect.getsourcefile(self.func)
                _, line = inspect.getsourcelines(self.func)
                self._location = (os.path.abspath(path), int(line)) if path else None
            except (OSError, TypeError):
                self._location = None
        return self._location

    @staticmethod
    def from_spec(spec: dict) -> "UDF":
        if declared_only():  # never load the stored pickle: the code this process declared (model.trust)
            found = copy.copy(resolve(spec, UDF, "UDF", lambda u, cols: u.with_inputs(cols)))
            if spec.get("input_paths") and found.input_paths == spec["input_paths"]:  # struct fields, as stored
                found = found._with_paths(spec["input_paths"], spec["input_columns"])
            found.__dict__["_stored_spec"] = dict(spec)
            return found
        obj = cloudpickle.loads(base64.b64decode(spec["pickle"]))
        if not isinstance(obj, UDF):
            raise ValueError("stored UDF does not unpickle to a UDF")
        obj.__dict__["_stored_spec"] = dict(spec)
        return obj

    def __getstate__(self) -> dict:
        # a stored spec is this object's own: copies (with_inputs, with_on_error...) and
        # pickles leave it out, and compute theirs
        state = dict(self.__dict__)
        state.pop("_stored_spec", None)
        state.pop("_location", None)
        return state


def _checked_field_metadata(metadata: Any) -> dict[str, str] | None:
    """``field_metadata`` as ``{str: str}`` (bytes decoded), or None."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise ValueError(f"@udf field_metadata must be a dict of str -> str, got {type(metadata).__name__}")
    out = {}
    for k, v in metadata.items():
        k = k.decode() if isinstance(k, bytes) else k
        v = v.decode() if isinstance(v, bytes) else v
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"@udf field_metadata must be a dict of str -> str, got {k!r}: {v!r}")
        out[k] = v
    return out


def field_metadata_of(u: "UDF") -> dict[str, str] | None:
    """A UDF's ``field_metadata`` (None for UDFs pickled before it existed)."""
    return getattr(u, "field_metadata", None)


def checkpoint_size_of(u: "UDF") -> int | None:
    """A UDF's ``checkpoint_size`` (None for UDFs pickled before it existed)."""
    return getattr(u, "checkpoint_size", None)


def task_size_of(u: "UDF") -> int | None:
    """A UDF's ``task_size`` (None for UDFs pickled before it existed)."""
    return getattr(u, "task_size", None)


_NO_AUTO_BACKFILL = ("a table's computed column is computed by backfill() (a view's UDF columns by its refresh, "
                     "which its refresh policy schedules); nothing backfills a column on its own")


def constructs(cls: Any, args: tuple, kwargs: dict) -> bool:
    """Whether calling a stateful UDF (class ``cls``) with these arguments means
    Geneva's ``MyUdf(...)``, an instance to register (the arguments fit
    ``__init__``, not ``__call__``), rather than a call of the function."""
    try:
        _signature(cls).bind(*args, **kwargs)
        return False
    except TypeError:
        pass
    try:
        inspect.signature(cls).bind(*args, **kwargs)
        return True
    except (TypeError, ValueError):
        return False


def with_init_args(obj: T, args: tuple, kwargs: dict) -> T:
    """A copy of a stateful UDF (or chunker) whose per-process instance is
    made with these ``__init__`` arguments (Geneva registers ``MyUdf()``,
    an instance of the decorated class). Part of its instance key, not of its
    fingerprint (like other captured values)."""
    u = copy.copy(obj)
    u.init_args = (tuple(args), dict(kwargs))  # type: ignore[attr-defined]
    u.__dict__.pop("_ikey", None)
    u.__dict__.pop("_stored_spec", None)
    return u


_SKIPPED_CLASS_ATTRS = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__",
                                  "__annotations__", "__firstlineno__", "__static_attributes__"})


def _captured(value: Any, seen: set[int], depth: int = 0) -> Any:
    """``value`` with every function and class replaced by what it captured
    (its code and names are the fingerprint's), recursively, so that the
    result pickles to the same bytes for the user's object and a copy loaded
    from a pickle (cloudpickle gives each class object a tracker id of its own,
    and pickles a loaded function by value where the original went by reference)."""
    if id(value) in seen or depth > 8:
        return ("<seen>", type(value).__qualname__)
    if inspect.isfunction(value) or inspect.ismethod(value):
        fn: Any = getattr(value, "__func__", value)
        seen = seen | {id(value)}
        code = fn.__code__
        return ("fn", fn.__qualname__, code.co_code, repr(code.co_consts),
                tuple(_captured(_cell(c), seen, depth + 1) for c in fn.__closure__ or ()),
                _captured(fn.__defaults__, seen, depth + 1), _captured(fn.__kwdefaults__, seen, depth + 1))
    if inspect.isclass(value):
        if _module_is_installed(getattr(value, "__module__", "") or ""):
            return ("cls", value.__module__, value.__qualname__)
        seen = seen | {id(value)}
        attrs = sorted((k, v) for k, v in vars(value).items() if k not in _SKIPPED_CLASS_ATTRS)
        return ("cls", value.__qualname__, tuple((k, _captured(v, seen, depth + 1)) for k, v in attrs),
                tuple(_captured(b, seen, depth + 1) for b in value.__bases__))
    if isinstance(value, staticmethod | classmethod | property):
        inner = value.fget if isinstance(value, property) else value.__func__
        return (type(value).__name__, _captured(inner, seen, depth + 1))
    if isinstance(value, list | tuple | set | frozenset):
        items = [_captured(v, seen | {id(value)}, depth + 1) for v in value]
        return (type(value).__name__, tuple(sorted(items, key=repr) if isinstance(value, set | frozenset) else items))
    if isinstance(value, dict):
        return ("dict", tuple((_captured(k, seen, depth + 1), _captured(v, seen | {id(value)}, depth + 1))
                              for k, v in value.items()))
    return value


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return "<empty cell>"


def captured_digest(func: Callable, init_args: tuple | None = None) -> str:
    """A hash of the values ``func`` (a function or a stateful class) captured
    and of a stateful instance's ``__init__`` arguments: equal for equal
    values however the function was loaded. A value that cannot be pickled
    counts as itself (by identity: such functions share nothing)."""
    canonical = (_captured(func, set()), _captured(init_args, set()))
    try:
        raw = cloudpickle.dumps(canonical)
    except Exception:
        raw = repr(canonical).encode() + f"@{id(func)}".encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def _is_internal(name: str) -> bool:
    """Bookkeeping columns no UDF reads: markers, view keys, Lance's row columns."""
    return is_reserved_name(name)


def _code_identity(func: Callable) -> bytes:
    """What a UDF's fingerprint hashes of its code: the source (else the
    bytecode); of a ``functools.partial``, its function's and the arguments'
    values; of an instance of a class with ``__call__``, its class's and the
    instance's values (never an address: the same UDF loaded by another
    process has the same identity)."""
    if isinstance(func, functools.partial):
        return (b"partial|" + _code_identity(func.func) + b"|"
                + captured_digest(func.func, (func.args, tuple(sorted(func.keywords.items())))).encode())
    if _is_callable_instance(func):
        return (b"instance|" + _code_identity(type(func)) + b"|"
                + captured_digest(type(func), (tuple(sorted(vars(func).items())) if hasattr(func, "__dict__") else (),)).encode())
    try:
        return textwrap.dedent(inspect.getsource(func)).encode()
    except (OSError, TypeError):
        target = _call_target(func)
        code = getattr(target, "__code__", None)
        if code is None:
            return repr(func).encode()
        return code.co_code + repr(code.co_consts).encode()


_SITE_DIRS = tuple(
    os.path.realpath(p)
    for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], sysconfig.get_paths()["stdlib"]}
)


@functools.lru_cache(maxsize=None)
def _path_is_installed(path: str) -> bool:
    return os.path.realpath(path).startswith(_SITE_DIRS)


def _module_is_installed(module_name: str) -> bool:
    """True for stdlib / site-packages modules that every worker can import."""
    if module_name == "__main__":
        return False
    if module_name.split(".")[0] == "mv_assets":
        return True
    mod = sys.modules.get(module_name)
    path = getattr(mod, "__file__", None)
    if not path:
        return True  # builtins
    return _path_is_installed(path)


def dumps_by_value(obj: UDF) -> bytes:
    """cloudpickle a UDF so that workers which cannot import its module run it.

    Code from scripts, notebooks, test files and any other module that is not
    installed (not in site-packages or the standard library) is pickled by
    value: its code and globals travel with the pickle, including helpers it
    calls from other local modules. Installed packages stay references.
    """
    obj.fingerprint  # noqa: B018 - computed here, where the code's source is, and carried by the pickle
    obj.instance_key()  # carried too: a loaded copy is the same instance without hashing its values again
    registered = []
    for name, module in list(sys.modules.items()):
        if module is None or name == "__main__" or _module_is_installed(name):
            continue
        try:
            cloudpickle.register_pickle_by_value(module)
            registered.append(module)
        except (ValueError, TypeError):
            pass
    try:
        return cloudpickle.dumps(obj)
    finally:
        for module in registered:
            try:
                cloudpickle.unregister_pickle_by_value(module)
            except ValueError:
                pass


_NO_TIMEOUT = ("no call is interrupted here: a UDF that must give up after a while raises TimeoutError itself, "
               "which on_error= retries or skips as it says")


def _geneva_checkpoint_bounds(checkpoint_size: int | None, low: int | None, high: int | None) -> int | None:
    """Geneva's ``@udf(min_checkpoint_size=, max_checkpoint_size=)``: equal
    bounds are a fixed ``checkpoint_size`` (an explicit one wins); other
    bounds than Geneva's defaults (1, None) warn."""
    if low is not None and low == high:
        return checkpoint_size if checkpoint_size is not None else low
    for name, value, default in (("min_checkpoint_size", low, 1), ("max_checkpoint_size", high, None)):
        if value != default:
            warn_ignored("udf", name, value, "checkpoints are sized by time here (or fixed by checkpoint_size=), "
                         "not adaptively between bounds; batch_size= bounds the rows of one call", stacklevel=5)
    return checkpoint_size


def _error_policy(on_error: "OnError | str | list | None", error_handling: "OnError | list | None"
                  ) -> "OnError | str | list | None":
    """``@udf``'s error policy: ``on_error``, or Geneva's ``error_handling``
    (an :class:`OnError` or a matcher list; not with ``on_error`` too)."""
    if error_handling is None:
        return on_error
    if on_error is not None:
        raise ValueError(
            "Cannot specify both 'on_error' and 'error_handling'. "
            "Use 'on_error' for simple cases or 'error_handling' for advanced use."
        )
    if not isinstance(error_handling, OnError | list | tuple):
        raise ValueError(
            f"@udf(error_handling=...) takes an OnError(...) or a list of Retry/Skip/Fail matchers here, got "
            f"{error_handling!r} (Geneva's tenacity ErrorHandlingConfig is not provided: docs/geneva.md)"
        )
    return error_handling


def _geneva_arguments(
    on_error: "OnError | str | list | None", error_handling: "OnError | list | None", num_gpus: float | None,
    cuda: bool | None, checkpoint_size: int | None, min_checkpoint_size: int | None,
    max_checkpoint_size: int | None, timeout: float | None,
) -> "tuple[OnError | str | list | None, float | None, int | None]":
    """:func:`udf`'s Geneva arguments mapped to its own: (on_error, num_gpus,
    checkpoint_size); those ignored here warn (at the ``@udf`` line)."""
    on_error = _error_policy(on_error, error_handling)
    if cuda and not num_gpus:
        num_gpus = 1.0  # Geneva: the deprecated cuda=True is num_gpus=1 when num_gpus is not given
    checkpoint_size = _geneva_checkpoint_bounds(checkpoint_size, min_checkpoint_size, max_checkpoint_size)
    if timeout is not None:
        warn_ignored("udf", "timeout", timeout, _NO_TIMEOUT, stacklevel=4)
    return on_error, num_gpus, checkpoint_size


def udf(
    func: Callable | None = None, *,
    data_type: pa.DataType | None = None, input_columns: list[str] | None = None, name: str | None = None,
    version: str | None = None, skip_nulls: bool = True, on_error: "OnError | str | list | None" = None,
    batch_size: int | None = None, checkpoint_size: int | None = None, field_metadata: dict[str, str] | None = None,
    num_cpus: float | None = 1.0, num_gpus: float | None = 0.0, memory: int | None = None, task_size: int | None = None,
    max_concurrency: int | None = None,
    # Geneva's (see the module docstring)
    manifest: Any = None, auto_backfill: bool = False, cuda: bool | None = False, min_checkpoint_size: int | None = 1,
    max_checkpoint_size: int | None = None, timeout: float | None = None, error_handling: "OnError | list | None" = None,
) -> Any:
    """Declare a UDF; usable as ``@udf`` or ``@udf(data_type=...)``.

    Parameters
    ----------
    data_type:
        Arrow output type. Inferred from the return annotation for scalar UDFs
        (``float`` is float64); required for batched and RecordBatch UDFs.
    input_columns:
        Columns feeding the parameters, positionally. Defaults to the parameter
        names. A struct column's field in dot notation (``"info.vals"``) passes
        that field (its struct column is what is read); a scalar parameter
        annotated ``np.ndarray`` gets list values as NumPy arrays.
    version:
        An explicit code version; when given it replaces the source-code hash
        in the fingerprint.
    skip_nulls:
        Scalar UDFs only: rows with a NULL input get a NULL output without
        calling the function (the default).
    on_error:
        ``"fail"`` (default), ``"skip"`` (the value stays NULL, an error is
        recorded), an :class:`OnError` or Geneva's matchers.
    batch_size:
        Batched and RecordBatch UDFs: at most this many rows per call.
    checkpoint_size:
        As in Geneva: rows per checkpoint (without one: by time).
    field_metadata:
        As in Geneva: metadata of the output column's Arrow field.
    num_cpus, num_gpus, memory:
        As in Geneva: what one call needs (CPUs, GPUs, bytes of memory).
    task_size:
        As in Geneva: rows per task of a backfill of this column.
    max_concurrency:
        At most this many calls at once in one process, whatever the task
        threads feeding it: a bound on the memory calls hold at once (by
        default, no bound).
    error_handling, manifest, auto_backfill, cuda, min_checkpoint_size, max_checkpoint_size, timeout:
        Geneva's: mapped to the arguments above or accepted with a
        ``GenevaCompatWarning``.

    From ``on_error`` on, no argument is part of the fingerprint. The module
    docstring has them all in full, and a stateful UDF registered as an instance.

    Examples
    --------
    >>> import pyarrow as pa
    >>> @udf
    ... def double(x: int) -> int:
    ...     return 2 * x
    >>> double(21)
    42
    >>> double.data_type
    DataType(int64)
    """
    on_error, num_gpus, checkpoint_size = _geneva_arguments(
        on_error, error_handling, num_gpus, cuda, checkpoint_size, min_checkpoint_size, max_checkpoint_size, timeout)

    def wrap(f: Callable) -> UDF:
        return UDF(
            f, name=name, data_type=data_type, input_columns=input_columns, version=version,
            skip_nulls=skip_nulls, on_error=on_error, batch_size=batch_size, checkpoint_size=checkpoint_size,
            field_metadata=field_metadata, num_cpus=num_cpus, num_gpus=num_gpus, memory=memory,
            task_size=task_size, manifest=manifest, auto_backfill=auto_backfill, max_concurrency=max_concurrency,
        )

    if func is not None:
        return wrap(func)
    return wrap
