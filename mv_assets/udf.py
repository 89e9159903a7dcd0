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
  process and reused.
"""

import base64
import functools
import hashlib
import inspect
import os
import sys
import sysconfig
import textwrap
import typing
from typing import Any, Callable

import cloudpickle
import pyarrow as pa

__all__ = ["UDF", "udf", "python_type_to_arrow"]

SCALAR = "scalar"
ARRAY = "array"
BATCH = "batch"

_PY_TO_ARROW = {
    float: pa.float64(),
    int: pa.int64(),
    str: pa.string(),
    bool: pa.bool_(),
    bytes: pa.binary(),
}


def python_type_to_arrow(tp: Any) -> pa.DataType | None:
    """Arrow type for a Python annotation (``float`` is float64), or None."""
    if isinstance(tp, pa.DataType):
        return tp
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
    if pa.types.is_floating(target):
        return pa.types.is_floating(column_type) or pa.types.is_integer(column_type)
    if pa.types.is_integer(target):
        return pa.types.is_integer(column_type)
    if pa.types.is_string(target):
        return pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
    if pa.types.is_binary(target):
        return pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type)
    if pa.types.is_boolean(target):
        return pa.types.is_boolean(column_type)
    if pa.types.is_list(target):
        return pa.types.is_list(column_type) or pa.types.is_large_list(column_type)
    return True


def _call_target(func: Callable) -> Callable:
    """The function whose signature describes the UDF (``__call__`` for classes)."""
    return func.__call__ if inspect.isclass(func) else func


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
    ) -> None:
        if not callable(func):
            raise ValueError(f"@udf needs a function or class, got {func!r}")
        self.func = func
        self.name = name or getattr(func, "__name__", "udf")
        self.stateful = inspect.isclass(func)
        self.version = version
        self.skip_nulls = skip_nulls
        sig = _signature(func)
        hints = _type_hints(func)
        params = [
            p
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        self.param_names = [p.name for p in params]
        self.param_annotations = {p.name: hints.get(p.name) for p in params}
        ann = list(self.param_annotations.values())
        if len(ann) == 1 and ann[0] is pa.RecordBatch:
            self.kind = BATCH
        elif ann and all(a is pa.Array for a in ann):
            self.kind = ARRAY
        elif any(a is pa.Array or a is pa.RecordBatch for a in ann):
            raise ValueError(
                f"UDF {self.name!r}: mix of Arrow and Python parameter annotations; "
                "annotate every parameter pa.Array (batched) or none of them (scalar)"
            )
        else:
            self.kind = SCALAR
        if self.kind == BATCH:
            if input_columns:
                raise ValueError(
                    f"UDF {self.name!r} takes a pa.RecordBatch: it receives every "
                    "source column, so input_columns must not be given"
                )
            self.input_columns: list[str] = []
        else:
            self.input_columns = list(input_columns or self.param_names)
            if len(self.input_columns) != len(self.param_names):
                raise ValueError(
                    f"UDF {self.name!r} has {len(self.param_names)} parameters "
                    f"{self.param_names} but {len(self.input_columns)} input columns "
                    f"{self.input_columns} were given"
                )
        if data_type is None:
            ret = hints.get("return")
            data_type = python_type_to_arrow(ret) if ret is not None else None
            if data_type is None:
                raise ValueError(
                    f"UDF {self.name!r}: cannot infer the output type; add a return "
                    "annotation (e.g. -> float) or pass @udf(data_type=pa.float32())"
                )
        if not isinstance(data_type, pa.DataType):
            raise ValueError(f"UDF {self.name!r}: data_type must be a pyarrow DataType")
        self.data_type = data_type
        self._fingerprint: str | None = None

    # -- plain callable -------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.stateful:
            return self._instance()(*args, **kwargs)
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"UDF({self.name}, kind={self.kind}, inputs={self.input_columns}, type={self.data_type})"

    def with_inputs(self, input_columns: list[str]) -> "UDF":
        """A copy of this UDF reading its parameters from other columns."""
        return UDF(
            self.func,
            name=self.name,
            data_type=self.data_type,
            input_columns=input_columns,
            version=self.version,
            skip_nulls=self.skip_nulls,
        )

    # -- checked call path ----------------------------------------------
    _instances: dict[str, Any] = {}

    def _instance(self) -> Any:
        key = self.fingerprint
        inst = UDF._instances.get(key)
        if inst is None:
            inst = self.func()
            UDF._instances[key] = inst
        return inst

    def _target(self) -> Callable:
        return self._instance() if self.stateful else self.func

    def validate_inputs(self, schema: pa.Schema, column_label: str) -> None:
        """Raise ValueError if the inputs are missing or of the wrong type."""
        for param, col in zip(self.param_names, self.input_columns):
            if col not in schema.names:
                raise ValueError(
                    f"column {column_label!r}: UDF {self.name!r} parameter {param!r} reads "
                    f"column {col!r}, which the source does not have (columns: {schema.names})"
                )
            if self.kind == SCALAR:
                ann = self.param_annotations.get(param)
                col_type = schema.field(col).type
                if ann is not None and not _compatible(ann, col_type):
                    raise ValueError(
                        f"column {column_label!r}: UDF {self.name!r} parameter {param!r} "
                        f"expects {getattr(ann, '__name__', ann)} but column {col!r} is {col_type}"
                    )

    def apply(self, batch: pa.RecordBatch) -> tuple[pa.Array, int]:
        """Compute the UDF over ``batch``; return (values, rows computed).

        ``batch`` holds the input columns under their source names (for a
        RecordBatch UDF: all source columns). The result is validated against
        ``data_type`` and the batch length.
        """
        n = batch.num_rows
        fn = self._target()
        if self.kind == BATCH:
            out = fn(batch)
            computed = n
        elif self.kind == ARRAY:
            out = fn(*[batch.column(c) for c in self.input_columns])
            computed = n
        else:
            cols = [batch.column(c).to_pylist() for c in self.input_columns]
            values: list[Any] = []
            computed = 0
            for row in zip(*cols) if cols else ([()] * n):
                if self.skip_nulls and any(v is None for v in row):
                    values.append(None)
                    continue
                values.append(fn(*row))
                computed += 1
            try:
                out = pa.array(values, type=self.data_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
                got = sorted({type(v).__name__ for v in values if v is not None})
                raise TypeError(
                    f"UDF {self.name!r} returned {', '.join(got)} values; expected "
                    f"{self.data_type}: {exc}"
                ) from exc
        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        if not isinstance(out, pa.Array):
            try:
                out = pa.array(out, type=self.data_type)
            except Exception as exc:
                raise TypeError(
                    f"UDF {self.name!r} returned {type(out).__name__}; expected a pyarrow "
                    f"Array of {self.data_type}"
                ) from exc
        if len(out) != n:
            raise ValueError(
                f"UDF {self.name!r} returned {len(out)} values for a batch of {n} rows"
            )
        if out.type != self.data_type:
            try:
                out = out.cast(self.data_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise TypeError(
                    f"UDF {self.name!r} returned {out.type}; expected {self.data_type}"
                ) from exc
        return out, computed

    # -- identity and serialization -------------------------------------
    @property
    def fingerprint(self) -> str:
        """A hash of the UDF's code and signature: changes when the code does."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(f"{self.kind}|{self.data_type}|{self.input_columns}|{self.version}|{self.skip_nulls}".encode())
            if self.version is None:
                h.update(_code_identity(self.func))
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def to_spec(self) -> dict:
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "input_columns": self.input_columns,
            "data_type": str(self.data_type),
            "kind": self.kind,
            "pickle": base64.b64encode(dumps_by_value(self)).decode("ascii"),
        }

    @staticmethod
    def from_spec(spec: dict) -> "UDF":
        obj = cloudpickle.loads(base64.b64decode(spec["pickle"]))
        if not isinstance(obj, UDF):
            raise ValueError("stored UDF does not unpickle to a UDF")
        return obj


def _code_identity(func: Callable) -> bytes:
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


def udf(
    func: Callable | None = None,
    *,
    data_type: pa.DataType | None = None,
    input_columns: list[str] | None = None,
    name: str | None = None,
    version: str | None = None,
    skip_nulls: bool = True,
) -> Any:
    """Declare a UDF; usable as ``@udf`` or ``@udf(data_type=...)``.

    Parameters
    ----------
    data_type:
        Arrow output type. Inferred from the return annotation for scalar UDFs
        (``float`` is float64); required for batched and RecordBatch UDFs.
    input_columns:
        Columns feeding the parameters, positionally. Defaults to the parameter
        names.
    version:
        An explicit code version; when given it replaces the source-code hash
        in the fingerprint.
    skip_nulls:
        Scalar UDFs only: rows with a NULL input get a NULL output without
        calling the function (the default).

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

    def wrap(f: Callable) -> UDF:
        return UDF(
            f, name=name, data_type=data_type, input_columns=input_columns, version=version, skip_nulls=skip_nulls
        )

    if func is not None:
        return wrap(func)
    return wrap
