"""Which code a refresher runs: the code stored with a view, or only code it imported.

A view stores its UDFs, chunkers and table functions pickled (with a
fingerprint of their code). By default every process that refreshes a view
(the Dagster daemon's runs, Spark executors, ``mv-assets refresh``) unpickles
and runs them: whoever can write the catalog's directory or bucket can run
code on every refresher (docs/deploy.md, "Security").

``MV_ASSETS_CODE=declared`` turns that off in a process: a stored pickle is
never loaded. The code a view needs is taken, by fingerprint, from the UDFs,
chunkers and table functions this process made itself: those of the modules
it imported (the views modules of ``$MV_ASSETS_VIEWS``, the modules of
``$MV_ASSETS_CODE_MODULES``, comma-separated, imported on the first miss;
what a Dagster code location or a components yaml loaded). A view whose code
was not declared fails before anything runs, saying which UDF and where to
declare it.

Pure: no Lance, no Spark, no Dagster.
"""

import hashlib
import importlib
import importlib.util
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from mv_assets.model.errors import MvAssetsError

__all__ = ["CODE_ENV", "MODULES_ENV", "UndeclaredCodeError", "declared_only", "track", "resolve"]

CODE_ENV = "MV_ASSETS_CODE"
MODULES_ENV = "MV_ASSETS_CODE_MODULES"
VIEWS_ENV = "MV_ASSETS_VIEWS"
_MODES = ("stored", "declared")


class UndeclaredCodeError(MvAssetsError, ValueError):
    """Under ``MV_ASSETS_CODE=declared``, a view needs code this process did not declare."""


def declared_only() -> bool:
    """Whether this process runs only code it declared (``$MV_ASSETS_CODE``)."""
    mode = (os.environ.get(CODE_ENV) or "stored").strip().lower()
    if mode not in _MODES:
        raise ValueError(f"${CODE_ENV} must be one of {', '.join(_MODES)}, got {mode!r}")
    return mode == "declared"


_lock = threading.Lock()
_made: list[weakref.ref] = []  # the code objects made in this process (never those unpickled)
_imported: set[str] = set()


def track(obj: Any) -> None:
    """Remember a UDF, chunker or table function this process made (its
    constructor and copies call this; unpickling never does)."""
    with _lock:
        _made.append(weakref.ref(obj))
        if len(_made) > 4096:  # drop the dead now and then
            _made[:] = [r for r in _made if r() is not None]


def _import(spec: str) -> None:
    spec = spec.strip()
    if not spec or spec in _imported:
        return
    _imported.add(spec)
    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec)
        # named as mv_assets.api.declare.load_declared names the file (registered here: imported once)
        name = "mv_assets_declared_" + hashlib.sha256(path.encode()).hexdigest()[:8]
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise UndeclaredCodeError(f"cannot load the code module {spec!r} (${VIEWS_ENV} / ${MODULES_ENV})")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec.split(":")[0])


def _candidates() -> list[Any]:
    with _lock:
        return [o for o in (r() for r in _made) if o is not None]


def _same(obj: Any, spec: dict) -> bool:
    """The same code (fingerprint) and, where the spec says, the same captured
    values (a UDF's instance key: closure cells, defaults, ``__init__`` arguments)."""
    if obj.fingerprint != spec.get("fingerprint"):
        return False
    want = spec.get("instance")  # "<fingerprint>:<captured values' digest>": the values are compared
    return want is None or not hasattr(obj, "instance_key") or (
        obj.instance_key().rpartition(":")[2] == want.rpartition(":")[2])


def _match(spec: dict, cls: type, rebind: Callable[[Any, list[str]], Any] | None) -> Any | None:
    for obj in _candidates():
        if not isinstance(obj, cls):
            continue
        if _same(obj, spec):
            return obj
        inputs = spec.get("input_columns")
        if rebind is not None and inputs is not None and getattr(obj, "input_columns", None) != inputs:
            try:
                bound = rebind(obj, list(inputs))
            except (ValueError, TypeError):
                continue
            if _same(bound, spec):
                return bound
    return None


def resolve(spec: dict, cls: type, label: str, rebind: Callable[[Any, list[str]], Any] | None = None) -> Any:
    """The declared object whose fingerprint is the stored ``spec``'s (made
    in this process, or by a module of ``$MV_ASSETS_VIEWS`` /
    ``$MV_ASSETS_CODE_MODULES``, imported now), or UndeclaredCodeError.
    ``rebind(obj, input_columns)``: the same code reading other columns (a
    ``(udf, [columns])`` binding has a fingerprint of its own)."""
    found = _match(spec, cls, rebind)
    if found is None:
        for var in (VIEWS_ENV, MODULES_ENV):
            for module in (os.environ.get(var) or "").split(","):
                _import(module)
        found = _match(spec, cls, rebind)
    if found is None:
        where = f" (defined at {spec['source_file']}:{spec.get('source_line')})" if spec.get("source_file") else ""
        raise UndeclaredCodeError(
            f"{label} {spec.get('name')!r} (code fingerprint {spec.get('fingerprint')}){where} is not declared in "
            f"this process, and ${CODE_ENV}=declared forbids loading the code stored with the view: import the "
            f"module that defines it (${VIEWS_ENV} for views modules, ${MODULES_ENV}=module[,module] for others), "
            f"with the same code; or unset ${CODE_ENV} to trust the catalog's stored code"
        )
    return found
