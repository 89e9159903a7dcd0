"""mv_assets: incrementally maintained materialized views with Python UDF
columns over Lance datasets, computed on Spark.

Layers (docs/architecture.md), each importing only the ones below it:
``dagster`` (wiring) > ``cli``/``demo`` > ``api`` (handles, query builder) >
``ops`` (refresh, backfill, columns, checks) > ``execution`` (tasks, runners) >
``storage`` (layout, state, status, errors, references) > ``model`` (names,
definitions, UDFs, planning, policies). The engine never imports dagster, and
nothing here starts a JVM until a refresh has work to do.
"""

import importlib as _importlib
import sys as _sys
import types as _types
from typing import TYPE_CHECKING

# The names below are imported on first use (PEP 562): ``import mv_assets`` alone, and so
# ``python -m mv_assets.execution.daemon``, imports none of pyarrow, lance or numpy, which
# start threads, and a process that forks (Spark's Python daemon) must run none.
if TYPE_CHECKING:
    from mv_assets.api import progress as progress
    from mv_assets.api.catalog import Connection as Connection
    from mv_assets.api.catalog import connect as connect
    from mv_assets.api.declare import DeclaredView as DeclaredView
    from mv_assets.api.geneva import GenevaCompatWarning as GenevaCompatWarning
    from mv_assets.api.progress import Progress as Progress
    from mv_assets.api.query import Query as GenevaQueryBuilder  # Geneva's name, in UDTF annotations
    from mv_assets.api.query import Query as Query
    from mv_assets.api.table import MaterializedView as MaterializedView
    from mv_assets.api.table import Table as Table
    from mv_assets.api.views import View as View
    from mv_assets.execution.resources import ResourceRequest as ResourceRequest
    from mv_assets.execution.resources import current_device as current_device
    from mv_assets.execution.spark import InlineRunner as InlineRunner
    from mv_assets.execution.spark import SparkRunner as SparkRunner
    from mv_assets.model.chunker import UDTF as UDTF
    from mv_assets.model.chunker import Chunker as Chunker
    from mv_assets.model.chunker import chunker as chunker
    from mv_assets.model.chunker import udtf as udtf
    from mv_assets.model.compaction import CompactionPolicy as CompactionPolicy
    from mv_assets.model.definition import SOURCE_ROW_ID as SOURCE_ROW_ID
    from mv_assets.model.errors import CatalogNotFoundError as CatalogNotFoundError
    from mv_assets.model.errors import ConcurrentRefreshError as ConcurrentRefreshError
    from mv_assets.model.errors import ConcurrentWriteError as ConcurrentWriteError
    from mv_assets.model.errors import JobNotFoundError as JobNotFoundError
    from mv_assets.model.errors import MvAssetsError as MvAssetsError
    from mv_assets.model.errors import SourceBehindError as SourceBehindError
    from mv_assets.model.errors import SqlRowsError as SqlRowsError
    from mv_assets.model.errors import TableExistsError as TableExistsError
    from mv_assets.model.errors import TableNotFoundError as TableNotFoundError
    from mv_assets.model.errors import UdfError as UdfError
    from mv_assets.model.matchers import Fail as Fail
    from mv_assets.model.matchers import Retry as Retry
    from mv_assets.model.matchers import Skip as Skip
    from mv_assets.model.matchers import fail_fast as fail_fast
    from mv_assets.model.matchers import retry_all as retry_all
    from mv_assets.model.matchers import retry_transient as retry_transient
    from mv_assets.model.policy import RefreshPolicy as RefreshPolicy
    from mv_assets.model.udf import UDF as UDF
    from mv_assets.model.udf import Columns as Columns
    from mv_assets.model.udf import OnError as OnError
    from mv_assets.model.udf import UnpackedUDF as UnpackedUDF
    from mv_assets.model.udf import skip_on_error as skip_on_error
    from mv_assets.model.udf import udf as udf
    from mv_assets.ops.backfill import BackfillJob as BackfillJob
    from mv_assets.ops.backfill import BackfillPlan as BackfillPlan
    from mv_assets.ops.backfill import BackfillResult as BackfillResult
    from mv_assets.ops.jobs import Job as Job
    from mv_assets.ops.refresh import RefreshPlan as RefreshPlan
    from mv_assets.ops.refresh import RefreshResult as RefreshResult
    from mv_assets.storage.error_log import ErrorRecord as ErrorRecord
    from mv_assets.storage.jobs import JobMetric as JobMetric
    from mv_assets.storage.jobs import JobRecord as JobRecord
    from mv_assets.storage.jobs import JobStatus as JobStatus

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "progress": ("mv_assets.api.progress", None),
    "Connection": ("mv_assets.api.catalog", 'Connection'),
    "connect": ("mv_assets.api.catalog", 'connect'),
    "DeclaredView": ("mv_assets.api.declare", 'DeclaredView'),
    "GenevaCompatWarning": ("mv_assets.api.geneva", 'GenevaCompatWarning'),
    "Progress": ("mv_assets.api.progress", 'Progress'),
    "GenevaQueryBuilder": ("mv_assets.api.query", 'Query'),
    "Query": ("mv_assets.api.query", 'Query'),
    "MaterializedView": ("mv_assets.api.table", 'MaterializedView'),
    "Table": ("mv_assets.api.table", 'Table'),
    "View": ("mv_assets.api.views", 'View'),
    "ResourceRequest": ("mv_assets.execution.resources", 'ResourceRequest'),
    "current_device": ("mv_assets.execution.resources", 'current_device'),
    "InlineRunner": ("mv_assets.execution.spark", 'InlineRunner'),
    "SparkRunner": ("mv_assets.execution.spark", 'SparkRunner'),
    "UDTF": ("mv_assets.model.chunker", 'UDTF'),
    "Chunker": ("mv_assets.model.chunker", 'Chunker'),
    "chunker": ("mv_assets.model.chunker", 'chunker'),
    "udtf": ("mv_assets.model.chunker", 'udtf'),
    "CompactionPolicy": ("mv_assets.model.compaction", 'CompactionPolicy'),
    "SOURCE_ROW_ID": ("mv_assets.model.definition", 'SOURCE_ROW_ID'),
    "CatalogNotFoundError": ("mv_assets.model.errors", 'CatalogNotFoundError'),
    "ConcurrentRefreshError": ("mv_assets.model.errors", 'ConcurrentRefreshError'),
    "ConcurrentWriteError": ("mv_assets.model.errors", 'ConcurrentWriteError'),
    "JobNotFoundError": ("mv_assets.model.errors", 'JobNotFoundError'),
    "MvAssetsError": ("mv_assets.model.errors", 'MvAssetsError'),
    "SourceBehindError": ("mv_assets.model.errors", 'SourceBehindError'),
    "SqlRowsError": ("mv_assets.model.errors", 'SqlRowsError'),
    "TableExistsError": ("mv_assets.model.errors", 'TableExistsError'),
    "TableNotFoundError": ("mv_assets.model.errors", 'TableNotFoundError'),
    "UdfError": ("mv_assets.model.errors", 'UdfError'),
    "Fail": ("mv_assets.model.matchers", 'Fail'),
    "Retry": ("mv_assets.model.matchers", 'Retry'),
    "Skip": ("mv_assets.model.matchers", 'Skip'),
    "fail_fast": ("mv_assets.model.matchers", 'fail_fast'),
    "retry_all": ("mv_assets.model.matchers", 'retry_all'),
    "retry_transient": ("mv_assets.model.matchers", 'retry_transient'),
    "RefreshPolicy": ("mv_assets.model.policy", 'RefreshPolicy'),
    "UDF": ("mv_assets.model.udf", 'UDF'),
    "Columns": ("mv_assets.model.udf", 'Columns'),
    "OnError": ("mv_assets.model.udf", 'OnError'),
    "UnpackedUDF": ("mv_assets.model.udf", 'UnpackedUDF'),
    "skip_on_error": ("mv_assets.model.udf", 'skip_on_error'),
    "udf": ("mv_assets.model.udf", 'udf'),
    "BackfillJob": ("mv_assets.ops.backfill", 'BackfillJob'),
    "BackfillPlan": ("mv_assets.ops.backfill", 'BackfillPlan'),
    "BackfillResult": ("mv_assets.ops.backfill", 'BackfillResult'),
    "Job": ("mv_assets.ops.jobs", 'Job'),
    "RefreshPlan": ("mv_assets.ops.refresh", 'RefreshPlan'),
    "RefreshResult": ("mv_assets.ops.refresh", 'RefreshResult'),
    "ErrorRecord": ("mv_assets.storage.error_log", 'ErrorRecord'),
    "JobMetric": ("mv_assets.storage.jobs", 'JobMetric'),
    "JobRecord": ("mv_assets.storage.jobs", 'JobRecord'),
    "JobStatus": ("mv_assets.storage.jobs", 'JobStatus'),
}

__all__ = [
    "BackfillJob",
    "BackfillPlan",
    "BackfillResult",
    "Chunker",
    "UDTF",
    "chunker",
    "udtf",
    "Columns",
    "ErrorRecord",
    "GenevaCompatWarning",
    "Job",
    "JobMetric",
    "JobRecord",
    "JobStatus",
    "View",
    "OnError",
    "UnpackedUDF",
    "Connection",
    "connect",
    "DeclaredView",
    "CatalogNotFoundError",
    "ConcurrentRefreshError",
    "ConcurrentWriteError",
    "JobNotFoundError",
    "MvAssetsError",
    "SourceBehindError",
    "SqlRowsError",
    "TableExistsError",
    "TableNotFoundError",
    "UdfError",
    "Query",
    "RefreshPolicy",
    "CompactionPolicy",
    "SOURCE_ROW_ID",
    "RefreshPlan",
    "RefreshResult",
    "InlineRunner",
    "SparkRunner",
    "Progress",
    "progress",
    "MaterializedView",
    "Table",
    "UDF",
    "udf",
    "skip_on_error",
    "Retry",
    "Skip",
    "Fail",
    "retry_transient",
    "retry_all",
    "fail_fast",
    "GenevaQueryBuilder",
]

__version__ = "0.1.0"

# Views stored before the layers had folders pickled their UDFs as
# ``mv_assets.udf.UDF``: that module path keeps resolving, so old catalogs load. A stand-in
# module, not the real one, so that nothing is imported until an old pickle asks for it (and
# ``mv_assets.udf``, the decorator, stays what it is: a submodule import would replace it).
_old_udf_module = _types.ModuleType("mv_assets.udf", "The old name of mv_assets.model.udf.")
_old_udf_module.__getattr__ = lambda name: getattr(_importlib.import_module("mv_assets.model.udf"), name)  # type: ignore[attr-defined]
_sys.modules.setdefault("mv_assets.udf", _old_udf_module)

# Dagster Components (``type: mv_assets.ViewComponent`` in a defs.yaml, ``dg scaffold defs
# mv_assets.ViewComponent``; docs/dagster.md): the Dagster layer's, imported on first use of
# these names only (by dg, through dir() and the registry entry point in pyproject.toml), so
# that importing the engine never imports Dagster (by name: no static import of the wiring here).
_COMPONENTS = ("ViewComponent", "CatalogComponent")


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        found = _importlib.import_module(module)
        value = found if attr is None else getattr(found, attr)
        globals()[name] = value  # once: later lookups do not come here
        return value
    if name in _COMPONENTS:
        return getattr(_importlib.import_module("mv_assets.dagster.components"), name)
    raise AttributeError(f"module 'mv_assets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_COMPONENTS})
