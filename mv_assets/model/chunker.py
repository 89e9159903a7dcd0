"""Row-expanding functions of the two new view kinds: ``@chunker`` (1:N, one
parent row gives zero or more child rows) and ``@udtf`` (N:M, the rows of one
partition give a table of any shape). Names as in Geneva 0.17.

Like a :class:`~mv_assets.model.udf.UDF`, each stays a plain callable (calling
it runs the user's function as written), and the engine calls ``apply``, which
feeds Arrow data in and validates what comes back. Both reuse the UDF model's
type inference, error policy (:class:`OnError`, :class:`RowError`,
:class:`UdfError`), stateful instances, fingerprints and pickling by value.

Chunker forms:

* scalar: ``@chunker def split(text: str) -> Iterator[Chunk]`` is called once
  per parent row with Python values and yields (or returns a list of)
  instances of the NamedTuple ``Chunk``, whose fields and annotations are the
  output columns (or ``output_schema=``).
* batched: ``@chunker(batch=True, output_schema=...)``; parameters annotated
  ``pa.Array`` get the batch's input columns and a parameter named
  ``__source_row_id`` gets the parents' ids (it may stand anywhere; first
  keeps type checkers quiet, which read a leading ``__`` as positional-only);
  it returns a ``pa.RecordBatch`` (or Table) of the output columns plus
  ``__source_row_id``, each child row's parent id.
* stateful: a class whose ``__call__`` is one of the forms above, instantiated
  once per worker process and reused (so is a stateful UDTF).

A UDTF gets the rows of one partition as a ``pa.Table`` of its input columns
(``partition_by``: one partition per distinct value of that column, which must
be one of the input columns; otherwise the whole source is one partition) and
returns a ``pa.Table``, a ``pa.RecordBatch`` or an iterator of RecordBatches.
"""

import base64
import collections.abc
import copy
import dataclasses
import hashlib
import inspect
import typing
from typing import Any, Callable

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.model.blobs import logical_type
from mv_assets.model.compat import NO_MANIFEST, warn_ignored
from mv_assets.model.errors import UdfError
from mv_assets.model.names import SOURCE_ROW_ID, is_reserved_name
from mv_assets.model.trust import declared_only, resolve, track
from mv_assets.model.udf import (
    UDF,
    OnError,
    RowError,
    _code_identity,
    _compatible,
    _signature,
    _type_hints,
    adapted,
    check_resources,
    constructs,
    dumps_by_value,
    python_type_to_arrow,
    resources_spec,
    typed_array,
    with_init_args,
)

__all__ = ["Chunker", "UDTF", "chunker", "udtf", "from_spec"]

_ROW_ANNOTATIONS = (
    collections.abc.Iterator, collections.abc.Iterable, collections.abc.Generator, list,
)


def _output_error(exc: Exception) -> Exception:
    """Mark ``exc`` as a wrong result: it fails the job whatever ``on_error`` says."""
    exc.__mv_output_error__ = True  # type: ignore[attr-defined]
    return exc


def _is_output_error(exc: BaseException) -> bool:
    return getattr(exc, "__mv_output_error__", False)


class _TableFunction:
    """What chunkers and UDTFs share with UDFs: plain call, stateful instance,
    retries and error records, resources, fingerprint cache, spec."""

    kind: str
    label = "chunker or UDTF"  # how messages name the kind
    input_columns: list[str]
    _output_schema: pa.Schema

    # The UDF model's own methods: they read only name, on_error, func and fingerprint (and cache in __dict__).
    _call = UDF._call
    _retried = UDF._retried
    _row_error = UDF._row_error
    _failure = UDF._failure
    _instance = UDF._instance
    _gate: Any = UDF._gate  # (an instance's first call alone: a model loaded in it is loaded once)
    call_limit = UDF.call_limit
    instance_key = UDF.instance_key
    code_location = UDF.code_location

    def __init__(
        self, func: Callable, *, name: str | None, output_schema: Any, version: str | None,
        on_error: "OnError | str | list | None", num_cpus: float, num_gpus: float, memory: int | None,
    ) -> None:
        if not callable(func):
            raise ValueError(f"@{self.kind} needs a function or class, got {func!r}")
        self.func = func
        self.name = name or getattr(func, "__name__", self.kind)
        self.stateful = inspect.isclass(func)
        self.version = version or None  # "" (Geneva's default) means: hash the code
        self.on_error = self._policy(on_error)
        self.num_cpus, self.num_gpus, self.memory = check_resources(self.label, self.name, num_cpus, num_gpus, memory)
        if output_schema is not None and not isinstance(output_schema, pa.Schema):
            raise ValueError(f"{self.label} {self.name!r}: output_schema must be a pyarrow Schema, got {output_schema!r}")
        self._fingerprint: str | None = None
        track(self)  # code this process made: what MV_ASSETS_CODE=declared runs (model.trust)

    def _check_output_names(self, schema: pa.Schema) -> None:
        if not schema.names:
            raise ValueError(f"{self.label} {self.name!r}: the output schema has no columns")
        seen: set[str] = set()
        for col in schema.names:
            if is_reserved_name(col):
                raise ValueError(
                    f"{self.label} {self.name!r}: output column {col!r} is a reserved name "
                    "(names starting with '__' and Lance's row columns belong to mv_assets)"
                )
            if "." in col:
                raise ValueError(f"{self.label} {self.name!r}: output column {col!r} contains '.', which Lance "
                                 "reads as the path of a nested field; choose a name without it")
            if col in seen:
                raise ValueError(f"{self.label} {self.name!r}: output column {col!r} appears twice")
            seen.add(col)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.stateful:
            if constructs(self.func, args, kwargs):  # Geneva's MyChunker(): the instance to register
                return with_init_args(self, args, kwargs)
            return self._instance()(*args, **kwargs)
        return self.func(*args, **kwargs)

    def _target(self) -> Callable:
        return self._instance() if self.stateful else self.func

    def _policy(self, on_error: "OnError | str | list | None") -> OnError:
        policy = OnError.coerce(on_error)
        if policy.then == "skip" and self.kind == "udtf":
            raise ValueError(
                f"UDTF {self.name!r}: on_error cannot skip (a partition is not a row whose output can stay "
                "NULL); use 'fail' or OnError(retry_on=..., attempts=...)"
            )
        return policy

    def with_on_error(self, on_error: "OnError | str | list") -> Any:
        """A copy with another error policy (same fingerprint)."""
        u = copy.copy(self)
        u.on_error = self._policy(on_error)
        return u

    @property
    def output_schema(self) -> pa.Schema:
        return self._output_schema

    def _identity(self) -> str:
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        """A hash of the code, the options that shape the output and the output
        schema: changes when any of them does. Resources and ``on_error`` are
        not part of it."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            fields = [(f.name, str(f.type)) for f in self._output_schema]
            h.update(f"{self.kind}|{self._identity()}|{fields}|{self.version}".encode())
            if self.version is None:
                h.update(_code_identity(self.func))
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def to_spec(self) -> dict:
        """A JSON-able description, the object itself pickled by value included
        (with its fingerprint, so that it reads the same in any process)."""
        spec = {
            "name": self.name,
            "kind": self.kind,
            "fingerprint": self.fingerprint,
            "input_columns": None if self.input_columns is None else list(self.input_columns),  # (None: a UDTF not bound)
            "output_schema": {f.name: str(f.type) for f in self._output_schema},
            "pickle": base64.b64encode(dumps_by_value(self)).decode("ascii"),  # pyright: ignore[reportArgumentType]
        }
        if getattr(self, "partition_by", None) is not None:
            spec["partition_by"] = self.partition_by  # pyright: ignore[reportAttributeAccessIssue]
        hints = resources_spec(self.num_cpus, self.num_gpus, self.memory)
        if hints is not None:
            spec["resources"] = hints
        where = self.code_location()
        if where is not None:
            spec["source_file"], spec["source_line"] = where
        return spec

    @classmethod
    def from_spec(cls, spec: dict) -> Any:
        if declared_only():  # never load the stored pickle: the code this process declared (model.trust)
            return resolve(spec, cls, cls.label, lambda f, cols: f.with_inputs(cols) if hasattr(f, "with_inputs") else f)
        obj = cloudpickle.loads(base64.b64decode(spec["pickle"]))
        if not isinstance(obj, cls):
            raise ValueError(f"stored spec does not unpickle to a {cls.label}")
        return obj


_NO_AUTO_REFRESH = ("when a view refreshes is the view's refresh policy: create_udtf_view(..., auto_refresh=True) "
                    "or refresh_policy=")


def _geneva_only(api: str, manifest: Any, auto_refresh: bool) -> None:
    """Geneva's ``manifest`` and ``auto_refresh`` of a chunker or UDTF: one warning each when given."""
    if manifest is not None:
        warn_ignored(api, "manifest", manifest, NO_MANIFEST, stacklevel=5)
    if auto_refresh:
        warn_ignored(api, "auto_refresh", auto_refresh, _NO_AUTO_REFRESH, stacklevel=5)


class Chunker(_TableFunction):
    """A 1:N row function. Create with :func:`chunker`."""

    kind = "chunker"
    label = "chunker"

    def __init__(
        self,
        func: Callable,
        *,
        name: str | None = None,
        output_schema: pa.Schema | None = None,
        batch: bool = False,
        input_columns: list[str] | None = None,
        inherit_input_columns: bool = False,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        memory: int | None = None,
        version: str | None = None,
        on_error: "OnError | str | list | None" = None,
        batch_size: int | None = None,
        manifest: Any = None,
        auto_refresh: bool = False,
    ) -> None:
        super().__init__(
            func, name=name, output_schema=output_schema, version=version, on_error=on_error,
            num_cpus=num_cpus, num_gpus=num_gpus, memory=memory,
        )
        _geneva_only("chunker", manifest, auto_refresh)
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0):
            raise ValueError(f"@chunker batch_size must be a positive int (parent rows per call), got {batch_size!r}")
        self.batch = bool(batch)
        self.batch_size = batch_size
        self.inherit_input_columns = bool(inherit_input_columns)
        hints = _type_hints(func)
        params = [
            p.name for p in _signature(func).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        # Batched: the parameter receiving the parents' ids (mangled in a class body).
        id_names = {SOURCE_ROW_ID, f"_{func.__name__.lstrip('_')}{SOURCE_ROW_ID}" if self.stateful else SOURCE_ROW_ID}
        ids_at = [i for i, p in enumerate(params) if p in id_names]
        self._ids_at: int | None = ids_at[0] if ids_at else None
        self.param_names = [p for p in params if p not in id_names]
        self.param_annotations = {p: hints.get(p) for p in self.param_names}
        arrays = [p for p, a in self.param_annotations.items() if a is pa.Array]
        if self.batch:
            if output_schema is None:
                raise ValueError(
                    f"batched chunker {self.name!r} needs output_schema=pa.schema([...]): "
                    "the columns of a returned RecordBatch cannot be inferred"
                )
            if self._ids_at is None:
                raise ValueError(
                    f"batched chunker {self.name!r} needs a parameter named {SOURCE_ROW_ID!r}: it receives "
                    f"the parents' ids, which the returned batch's {SOURCE_ROW_ID!r} column refers to"
                )
            if len(arrays) != len(self.param_names):
                raise ValueError(f"batched chunker {self.name!r}: annotate every input parameter pa.Array")
        elif self._ids_at is not None:
            raise ValueError(
                f"chunker {self.name!r}: only the batched form (batch=True) receives {SOURCE_ROW_ID!r}"
            )
        elif arrays:
            raise ValueError(
                f"chunker {self.name!r}: parameters {arrays} are annotated pa.Array; pass batch=True "
                "for the batched form, or annotate them with Python types"
            )
        self.input_columns: list[str] = self._checked_inputs(input_columns)
        self._output_schema = output_schema if output_schema is not None else self._inferred_schema(hints.get("return"))
        self._check_output_names(self._output_schema)

    def __repr__(self) -> str:
        form = "batched" if self.batch else "scalar"
        return f"Chunker({self.name}, {form}, inputs={self.input_columns}, outputs={self._output_schema.names})"

    def _inferred_schema(self, ret: Any) -> pa.Schema:
        """The output schema of a scalar chunker from ``-> Iterator[NamedTuple]`` (or Iterable, Generator, list)."""
        args = typing.get_args(ret) if typing.get_origin(ret) in _ROW_ANNOTATIONS else ()
        row = args[0] if args else None
        fields = getattr(row, "_fields", None)
        if not fields:
            raise ValueError(
                f"chunker {self.name!r}: cannot infer the output columns; annotate the return "
                "-> Iterator[Chunk] (or list[Chunk]) with a NamedTuple class Chunk, or pass output_schema=pa.schema([...])"
            )
        hints = typing.get_type_hints(row)
        out = []
        for name in fields:
            t = python_type_to_arrow(hints.get(name))
            if t is None:
                raise ValueError(
                    f"chunker {self.name!r}: field {name!r} of {getattr(row, '__name__', row)} needs a type "
                    "annotation (int, float, str, bytes, list[float], ...)"
                )
            out.append(pa.field(name, t))
        return pa.schema(out)

    def _checked_inputs(self, input_columns: list[str] | None) -> list[str]:
        inputs = list(input_columns or self.param_names)
        if len(inputs) != len(self.param_names):
            raise ValueError(
                f"chunker {self.name!r} has {len(self.param_names)} input parameters {self.param_names} "
                f"but {len(inputs)} input columns {inputs} were given"
            )
        return inputs

    def _identity(self) -> str:
        return f"{self.batch}|{self.input_columns}"

    def with_inputs(self, input_columns: list[str]) -> "Chunker":
        """A copy reading its parameters from other columns (every other setting kept)."""
        c = copy.copy(self)
        c.input_columns = self._checked_inputs(input_columns)
        c._fingerprint = None
        return c

    def validate_inputs(self, schema: pa.Schema, label: str) -> None:
        """Raise ValueError if the source ``label`` (of ``schema``) lacks an input or has it of the wrong type."""
        for param, col in zip(self.param_names, self.input_columns, strict=True):
            if col not in schema.names:
                raise ValueError(
                    f"chunker {self.name!r} parameter {param!r} reads column {col!r}, which the source "
                    f"{label!r} does not have (columns: {schema.names})"
                )
            ann = self.param_annotations.get(param)
            col_type = logical_type(schema.field(col))  # (a blob column's values are its bytes)
            if not self.batch and ann is not None and not _compatible(ann, col_type):
                raise ValueError(
                    f"chunker {self.name!r} parameter {param!r} expects {getattr(ann, '__name__', ann)} "
                    f"but column {col!r} of {label!r} is {col_type}"
                )

    # -- checked call path ----------------------------------------------
    def apply(
        self, batch: pa.RecordBatch, parent_ids: pa.Array | None = None, errors: list[RowError] | None = None
    ) -> tuple[pa.Table, pa.Array, int]:
        """Expand the parent rows of ``batch``; return ``(children, parent, parents processed)``.

        ``batch`` holds (at least) the input columns; ``parent_ids`` are the
        parents' ids (unique, no NULLs; default: their positions), which a
        batched chunker receives and refers to. ``children`` is a Table of the
        output schema; ``parent`` (int64, one per child) is each child's
        parent's position in ``batch``: children come grouped in parent order,
        in the order the function gave them within a parent. A parent may have
        none. Under ``on_error`` "skip", a parent the function raises on has no
        children and a :class:`RowError` in ``errors`` (a batched call that
        raises is re-run parent by parent to find them); under "fail" it
        raises :class:`UdfError`. Wrong results (types, columns, ids) always raise.
        """
        n = batch.num_rows
        ids = pa.array(range(n), pa.int64()) if parent_ids is None else parent_ids
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        distinct = len(pc.unique(ids))  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
        if len(ids) != n or ids.null_count or distinct != n:
            raise ValueError(f"chunker {self.name!r}: parent_ids must be {n} distinct non-NULL ids, one per row")
        if errors is None:
            errors = []
        if not self.batch:
            return self._apply_scalar(batch, errors)
        if self.batch_size and n > self.batch_size:
            return self._apply_in_slices(batch, ids, self.batch_size, errors)
        fn = self._target()
        try:
            with self._gate(fn):
                out, _ = self._call(lambda: self._call_batch(fn, batch, ids))
        except Exception as exc:
            if self.on_error.then != "skip":  # no exception is skipped (which are: on_error.skips)
                raise self._failure(0, n, exc) from exc
        else:
            return *self._check_batch(out, ids), n
        # The batch failed: find the failing parents one by one.
        tables, parents = [], []
        for i in range(n):
            try:
                out, _ = self._call(lambda i=i: self._call_batch(fn, batch.slice(i, 1), ids.slice(i, 1)))
            except Exception as exc:
                if not self.on_error.skips(exc):
                    raise self._failure(i, 1, exc) from exc
                errors.append(self._row_error(i, exc))
                continue
            children, _ = self._check_batch(out, ids.slice(i, 1))
            tables.append(children)
            parents.append(pa.array([i] * children.num_rows, pa.int64()))
        return *self._concat(tables, parents), n

    def _concat(self, tables: list[pa.Table], parents: list[pa.Array]) -> tuple[pa.Table, pa.Array]:
        if not tables:
            return self._output_schema.empty_table(), pa.array([], pa.int64())
        return pa.concat_tables(tables), pa.concat_arrays(parents)

    def _apply_in_slices(
        self, batch: pa.RecordBatch, ids: pa.Array, limit: int, errors: list[RowError]
    ) -> tuple[pa.Table, pa.Array, int]:
        """``apply`` over consecutive slices of at most ``limit`` parents (``batch_size``)."""
        tables, parents = [], []
        for start in range(0, batch.num_rows, limit):
            found: list[RowError] = []
            try:
                children, parent, _ = self.apply(batch.slice(start, limit), ids.slice(start, limit), found)
            except UdfError as exc:
                exc.row_index = (exc.row_index or 0) + start
                raise
            tables.append(children)
            parents.append(pc.add(parent, start))  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
            errors.extend(dataclasses.replace(e, index=e.index + start) for e in found)
        return *self._concat(tables, parents), batch.num_rows

    def _apply_scalar(self, batch: pa.RecordBatch, errors: list[RowError]) -> tuple[pa.Table, pa.Array, int]:
        fn = self._target()
        n = batch.num_rows
        cols = adapted([batch.column(c).to_pylist() for c in self.input_columns], self.param_names,
                       self.param_annotations)  # (a blob's bytes as a file object where a parameter says BlobFile)
        width = len(self._output_schema)
        rows: list = []
        called: list[int] = []  # the parents called, in order, and how many children each gave
        sizes: list[int] = []
        call = self._retried_rows if self.on_error.may_retry else self._rows  # (chosen once per batch)
        with self._gate(fn):  # a batch's parents, one slot (as a scalar UDF's rows)
            for i, args in enumerate(zip(*cols, strict=True) if cols else ([()] * n)):
                try:
                    children = call(fn, args)
                except Exception as exc:
                    if _is_output_error(exc):
                        raise
                    if not self.on_error.skips(exc):
                        raise self._failure(i, 1, exc) from exc
                    errors.append(self._row_error(i, exc))
                    continue
                rows.extend(children)
                called.append(i)
                sizes.append(len(children))
        parent = np.repeat(np.asarray(called, np.int64), np.asarray(sizes, np.int64))
        rows = self._checked_children(rows, parent, width)
        columns = list(zip(*rows, strict=True)) if rows else [()] * width  # (the children's fields, column by column)
        arrays = []
        for k, field in enumerate(self._output_schema):
            values = list(columns[k])
            try:
                arrays.append(typed_array(values, field.type))  # (a float into an integer field refused, not truncated)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
                got = sorted({type(v).__name__ for v in values if v is not None})
                raise TypeError(
                    f"chunker {self.name!r} yielded {', '.join(got)} values for {field.name!r}; expected {field.type}: {exc}"
                ) from exc
        return pa.Table.from_arrays(arrays, schema=self._output_schema), pa.array(parent), n

    def _checked_children(self, rows: list, parent: np.ndarray, width: int) -> list:
        """A batch's children as tuples of ``width`` fields, checked once for the
        batch (their types and lengths); a dict (Geneva's chunkers may yield
        dicts keyed by the output columns) as its values in the output's order;
        anything else refused, naming its parent row (``parent``: each child's)."""
        kinds = set(map(type, rows))
        if all(issubclass(k, tuple) for k in kinds) and set(map(len, rows)) <= {width}:
            return rows
        out = []
        for child, i in zip(rows, parent.tolist(), strict=True):
            if isinstance(child, dict):
                child = self._dict_row(child, i)
            if not isinstance(child, tuple) or len(child) != width:
                raise TypeError(
                    f"chunker {self.name!r} yielded {type(child).__name__} for parent row {i}; expected a "
                    f"NamedTuple of {width} fields {self._output_schema.names} (or a dict of them)"
                )
            out.append(child)
        return out

    def _dict_row(self, child: dict, parent: int) -> tuple:
        """A child given as a dict: its values in the output schema's order
        (a column it leaves out is NULL; a key that is no output column is refused)."""
        names = self._output_schema.names
        unknown = [k for k in child if k not in names]
        if unknown:
            raise _output_error(TypeError(
                f"chunker {self.name!r} yielded a dict with keys {unknown} for parent row {parent}, which are "
                f"not among its output columns {names}"
            ))
        return tuple(child.get(n) for n in names)

    def _retried_rows(self, fn: Callable, args: tuple) -> list:
        """:meth:`_rows` under the retry policy."""
        return self._call(lambda: self._rows(fn, args))[0]

    def _rows(self, fn: Callable, args: tuple) -> list:
        """One parent's children, the generator run to its end (its exceptions are the user's)."""
        out = fn(*args)
        if isinstance(out, str | bytes | dict) or not isinstance(out, collections.abc.Iterable):
            raise _output_error(TypeError(
                f"chunker {self.name!r} returned {type(out).__name__}; expected an iterator or list of NamedTuples"
            ))
        return list(out)

    def _call_batch(self, fn: Callable, batch: pa.RecordBatch, ids: pa.Array) -> Any:
        args: list[Any] = [batch.column(c) for c in self.input_columns]
        assert self._ids_at is not None
        args.insert(self._ids_at, ids)
        return fn(*args)

    def _check_batch(self, out: Any, ids: pa.Array) -> tuple[pa.Table, pa.Array]:
        """Validate what a batched call returned against the output schema and the ids it was given."""
        if isinstance(out, pa.RecordBatch):
            out = pa.Table.from_batches([out])
        if not isinstance(out, pa.Table):
            raise TypeError(
                f"chunker {self.name!r} returned {type(out).__name__}; expected a pyarrow RecordBatch (or Table) "
                f"of {self._output_schema.names} and {SOURCE_ROW_ID!r}"
            )
        if SOURCE_ROW_ID not in out.column_names:
            raise ValueError(
                f"chunker {self.name!r} returned no {SOURCE_ROW_ID!r} column; a batched chunker names each "
                "child row's parent in it (one of the ids it received)"
            )
        expected = [*self._output_schema.names, SOURCE_ROW_ID]
        if sorted(out.column_names) != sorted(expected):
            raise ValueError(f"chunker {self.name!r} returned columns {out.column_names}; expected {expected}")
        arrays = []
        for field in [*self._output_schema, pa.field(SOURCE_ROW_ID, ids.type)]:
            col = out.column(field.name).combine_chunks()
            if col.type != field.type:
                try:
                    col = col.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                    raise TypeError(
                        f"chunker {self.name!r} returned {col.type} for {field.name!r}; expected {field.type}"
                    ) from exc
            arrays.append(col)
        *values, child_ids = arrays
        parent = pc.index_in(child_ids, value_set=ids)  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
        if parent.null_count:
            unknown = child_ids.filter(pc.is_null(parent)).to_pylist()  # pyright: ignore[reportAttributeAccessIssue]
            raise ValueError(
                f"chunker {self.name!r} returned {SOURCE_ROW_ID!r} values {unknown[:5]} that are not "
                f"among the ids of the {len(ids)} parent rows it received"
            )
        order = pc.sort_indices(parent)  # pyright: ignore[reportAttributeAccessIssue]  (stable: children keep their order)
        children = pa.Table.from_arrays(values, schema=self._output_schema).take(order)
        return children, parent.take(order).cast(pa.int64())


class Partition:
    """What a UDTF receives: one partition of its source, a pyarrow Table with
    the reads of Geneva's query builder (``GenevaQueryBuilder``) besides:
    ``to_arrow()``, ``to_pandas()``, ``to_batches(batch_size=)``,
    ``to_pylist()``. Every other attribute is the Table's (``num_rows``,
    ``column("x")``, ``select([...])``, ``table["x"]``, ``len(table)``), and it
    hands its rows to anything that reads Arrow streams (``pa.table(p)``)."""

    __slots__ = ("_table",)

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def to_arrow(self) -> pa.Table:
        return self._table

    def to_pandas(self, **kwargs: Any) -> Any:
        return self._table.to_pandas(**kwargs)

    def to_batches(self, batch_size: int | None = None, max_chunksize: int | None = None) -> list[pa.RecordBatch]:
        """The rows as record batches of at most ``batch_size`` rows (Geneva's
        name; pyarrow's ``max_chunksize`` works too)."""
        return self._table.to_batches(max_chunksize=batch_size or max_chunksize)

    def to_pylist(self) -> list[dict]:
        return self._table.to_pylist()

    def select(self, columns: Any) -> "Partition":
        return Partition(self._table.select(columns))

    def __getattr__(self, name: str) -> Any:
        if name == "_table":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self._table, name)

    def __reduce__(self) -> Any:
        return Partition, (self._table,)

    def __getitem__(self, key: Any) -> Any:
        return self._table[key]

    def __len__(self) -> int:
        return len(self._table)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self._table.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        return f"Partition({self._table.num_rows} rows, columns={self._table.column_names})"


class UDTF(_TableFunction):
    """An N:M table function over the rows of one partition. Create with :func:`udtf`."""

    kind = "udtf"
    label = "UDTF"

    def __init__(
        self,
        func: Callable,
        *,
        output_schema: pa.Schema | None = None,
        input_columns: list[str] | None = None,
        partition_by: str | None = None,
        name: str | None = None,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        memory: int | None = None,
        version: str | None = None,
        on_error: "OnError | str | list | None" = None,
        manifest: Any = None,
        auto_refresh: bool = False,
    ) -> None:
        super().__init__(
            func, name=name, output_schema=output_schema, version=version, on_error=on_error,
            num_cpus=num_cpus, num_gpus=num_gpus, memory=memory,
        )
        _geneva_only("udtf", manifest, auto_refresh)
        if output_schema is None:
            raise ValueError(f"UDTF {self.name!r} needs output_schema=pa.schema([...]): its output cannot be inferred")
        self.partition_by = partition_by
        # None (Geneva: "the whole source"): the columns of the view's source query, fixed when
        # the view is created (bound_to), as a RecordBatch UDF's "every column" is
        self.input_columns: list[str] | None = (  # pyright: ignore[reportIncompatibleVariableOverride] (None: unbound)
            None if input_columns is None else self._checked(input_columns))
        self._output_schema = output_schema
        self._check_output_names(output_schema)

    def _checked(self, input_columns: Any) -> list[str]:
        if (not isinstance(input_columns, list | tuple) or not input_columns
                or not all(isinstance(c, str) for c in input_columns)):
            raise ValueError(f"UDTF {self.name!r}: input_columns must be a non-empty list of column names "
                             f"(or left out: every column of the view's source query), got {input_columns!r}")
        if self.partition_by is not None and self.partition_by not in input_columns:
            raise ValueError(
                f"UDTF {self.name!r} partitions by {self.partition_by!r}, which is not one of its "
                f"input_columns {list(input_columns)}; add it there"
            )
        return list(input_columns)

    def with_inputs(self, input_columns: list[str]) -> "UDTF":
        """A copy of this UDTF reading ``input_columns`` (every other setting kept)."""
        u = copy.copy(self)
        u.input_columns = self._checked(input_columns)
        u._fingerprint = None
        return u

    def bound_to(self, columns: list[str]) -> "UDTF":
        """This UDTF with its inputs fixed: a UDTF declared without
        ``input_columns`` reads ``columns`` (the view's source query's, when
        the view is created); one that names its inputs is returned as it is."""
        return self if self.input_columns is not None else self.with_inputs(columns)

    def __repr__(self) -> str:
        outputs = self._output_schema.names
        return f"UDTF({self.name}, inputs={self.input_columns}, partition_by={self.partition_by}, outputs={outputs})"

    def _identity(self) -> str:
        return f"{self.input_columns}|{self.partition_by}"

    def validate_inputs(self, schema: pa.Schema, label: str) -> None:
        """Raise ValueError if the source ``label`` (of ``schema``) lacks the partition column or an input."""
        if self.partition_by is not None and self.partition_by not in schema.names:
            raise ValueError(
                f"UDTF {self.name!r} partitions by column {self.partition_by!r}, which the source {label!r} "
                f"does not have (columns: {schema.names})"
            )
        missing = [c for c in self.inputs() if c not in schema.names]
        if missing:
            raise ValueError(
                f"UDTF {self.name!r} reads columns {missing}, which the source {label!r} does not have "
                f"(columns: {schema.names})"
            )

    def inputs(self) -> list[str]:
        """The columns it reads: ``input_columns``, bound when its view was created."""
        if self.input_columns is None:
            raise ValueError(f"UDTF {self.name!r} reads every column of its view's source query: it is bound to "
                             "them when the view is created (create_udtf_view)")
        return self.input_columns

    def apply(self, table: pa.Table) -> pa.Table:
        """Run the UDTF over one partition (``table`` holds at least the input
        columns); return its output as a Table of the output schema. The
        function receives the partition as a :class:`Partition` (a pyarrow
        Table with Geneva's query-builder reads). A call that raises is
        retried as ``on_error`` says, then raises :class:`UdfError`; a wrong
        result (type, columns) raises TypeError or ValueError."""
        fn = self._target()
        inputs = table.select(self.input_columns or table.column_names)
        try:
            with self._gate(fn):
                out, _ = self._call(lambda: self._run(fn, inputs))
        except Exception as exc:
            if _is_output_error(exc):
                raise
            failure = self._failure(0, table.num_rows, exc)
            failure.skippable = False  # (a partition cannot be skipped: its remedy is a fix, or retries)
            raise failure from exc
        return self._check_table(out)

    def _run(self, fn: Callable, table: pa.Table) -> list:
        """The function's batches, an iterator run to its end (its exceptions are the user's)."""
        out = fn(Partition(table))
        if isinstance(out, pa.Table | pa.RecordBatch):
            return [out]
        if not isinstance(out, collections.abc.Iterable) or isinstance(out, str | bytes | dict):
            raise _output_error(TypeError(
                f"UDTF {self.name!r} returned {type(out).__name__}; expected a pyarrow Table, RecordBatch "
                "or an iterator of RecordBatches"
            ))
        return list(out)

    def _check_table(self, parts: list) -> pa.Table:
        tables = []
        for part in parts:
            if not isinstance(part, pa.Table | pa.RecordBatch):
                raise TypeError(f"UDTF {self.name!r} yielded {type(part).__name__}; expected pyarrow RecordBatches")
            if sorted(part.schema.names) != sorted(self._output_schema.names):
                raise ValueError(
                    f"UDTF {self.name!r} returned columns {part.schema.names}; expected {self._output_schema.names}"
                )
            arrays = []
            for field in self._output_schema:
                col = part.column(field.name)
                if col.type != field.type:
                    try:
                        col = col.cast(field.type)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                        raise TypeError(
                            f"UDTF {self.name!r} returned {col.type} for {field.name!r}; expected {field.type}"
                        ) from exc
                arrays.append(col)
            tables.append(pa.Table.from_arrays(arrays, schema=self._output_schema))
        return pa.concat_tables(tables) if tables else self._output_schema.empty_table()


def from_spec(spec: dict) -> "Chunker | UDTF":
    """The chunker or UDTF a ``to_spec()`` dict describes."""
    return _TableFunction.from_spec(spec)


def chunker(
    func: Callable | None = None,
    *,
    output_schema: pa.Schema | None = None,
    batch: bool = False,
    input_columns: list[str] | None = None,
    inherit_input_columns: bool = False,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    memory: int | None = None,
    version: str | None = None,
    on_error: "OnError | str | list | None" = None,
    batch_size: int | None = None,
    name: str | None = None,
    manifest: Any = None,
    auto_refresh: bool = False,
) -> Any:
    """Declare a chunker (1:N); usable as ``@chunker`` or ``@chunker(...)``.

    Parameters
    ----------
    output_schema:
        The child columns. Inferred for the scalar form from the return
        annotation ``-> Iterator[Chunk]`` (``Iterable``, ``Generator``,
        ``list``) of a NamedTuple class; required with ``batch=True``.
    batch:
        The batched form: ``pa.Array`` parameters, a ``__source_row_id``
        parameter, a RecordBatch returned (see the module docstring).
    input_columns:
        Columns feeding the parameters, positionally. Defaults to the parameter names.
    inherit_input_columns:
        Whether the view's child rows also copy the columns the chunker reads
        (by default they don't: a document's text is not copied into each of
        its chunks; the view's other source columns are). Not part of the fingerprint.
    num_cpus, num_gpus, memory:
        What one call needs (memory in bytes), for the scheduler. Not part of the fingerprint.
    version:
        An explicit code version; when given (non-empty) it replaces the
        source-code hash in the fingerprint.
    on_error:
        As for :func:`~mv_assets.model.udf.udf`: ``"fail"`` (default),
        ``"skip"`` (the parent gets no children and an error record) or an
        :class:`OnError`. Not part of the fingerprint.
    batch_size:
        Batched form: at most this many parents per call. Not part of the fingerprint.
    manifest, auto_refresh:
        Geneva's; accepted with a ``GenevaCompatWarning`` when given (see docs/geneva.md).

    A scalar chunker yields NamedTuples, or (with ``output_schema=``, as Geneva's
    do) dicts keyed by the output columns.

    Examples
    --------
    >>> from typing import Iterator, NamedTuple
    >>> class Word(NamedTuple):
    ...     pos: int
    ...     word: str
    >>> @chunker
    ... def words(text: str) -> Iterator[Word]:
    ...     for i, w in enumerate(text.split()):
    ...         yield Word(i, w)
    >>> list(words("a b"))
    [Word(pos=0, word='a'), Word(pos=1, word='b')]
    >>> children, parent, _ = words.apply(pa.record_batch({"text": ["x y", "", "z"]}))
    >>> children.column("word").to_pylist(), parent.to_pylist()
    (['x', 'y', 'z'], [0, 0, 2])
    """

    def wrap(f: Callable) -> Chunker:
        return Chunker(
            f, name=name, output_schema=output_schema, batch=batch, input_columns=input_columns,
            inherit_input_columns=inherit_input_columns, num_cpus=num_cpus, num_gpus=num_gpus, memory=memory,
            version=version, on_error=on_error, batch_size=batch_size, manifest=manifest, auto_refresh=auto_refresh,
        )

    if func is not None:
        return wrap(func)
    return wrap


def udtf(
    func: Callable | None = None,
    *,
    output_schema: pa.Schema | None = None,
    input_columns: list[str] | None = None,
    partition_by: str | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    memory: int | None = None,
    version: str | None = None,
    on_error: "OnError | str | list | None" = None,
    name: str | None = None,
    manifest: Any = None,
    auto_refresh: bool = False,
) -> Any:
    """Declare a UDTF (N:M); used as ``@udtf(output_schema=..., input_columns=[...])``.

    Parameters
    ----------
    output_schema:
        Required: the output table's columns.
    input_columns:
        The source columns of the partition the function receives. Left
        out (Geneva: "the whole source"), every column of the view's source
        query, fixed when the view is created.
    partition_by:
        One of ``input_columns``: the function is called once per distinct
        value of it (rows of other values never meet). Default: one call over
        the whole source.
    num_cpus, num_gpus, memory, version:
        As for :func:`chunker`.
    on_error:
        ``"fail"`` (default) or an :class:`OnError` retrying chosen
        exceptions; a partition cannot be skipped.

    Examples
    --------
    >>> @udtf(output_schema=pa.schema([("n", pa.int64())]), input_columns=["x"])
    ... def count(table: pa.Table) -> pa.Table:
    ...     return pa.table({"n": [table.num_rows]})
    >>> count.apply(pa.table({"x": [1, 2, 3], "y": [0, 0, 0]})).to_pylist()
    [{'n': 3}]
    """

    def wrap(f: Callable) -> UDTF:
        return UDTF(
            f, output_schema=output_schema, input_columns=input_columns, partition_by=partition_by, name=name,
            num_cpus=num_cpus, num_gpus=num_gpus, memory=memory, version=version, on_error=on_error,
            manifest=manifest, auto_refresh=auto_refresh,
        )

    if func is not None:
        return wrap(func)
    return wrap
