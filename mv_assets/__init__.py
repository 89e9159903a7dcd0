"""mv_assets: incrementally maintained materialized views with Python UDF
columns over Lance datasets, computed on Spark.

Layers (docs/architecture.md), each importing only the ones below it:
``dagster`` (wiring) > ``cli``/``demo`` > ``api`` (handles, query builder) >
``ops`` (refresh, backfill, columns, checks) > ``execution`` (tasks, runners) >
``storage`` (layout, state, status, errors, references) > ``model`` (names,
definitions, UDFs, planning, policies). The engine never imports dagster, and
nothing here starts a JVM until a refresh has work to do.
"""

import sys as _sys

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
from mv_assets.model import udf as _udf_module
from mv_assets.model.chunker import UDTF as UDTF
from mv_assets.model.chunker import Chunker as Chunker
from mv_assets.model.chunker import chunker as chunker
from mv_assets.model.chunker import udtf as udtf
from mv_assets.model.compaction import CompactionPolicy as CompactionPolicy
from mv_assets.model.definition import SOURCE_ROW_ID as SOURCE_ROW_ID
from mv_assets.model.errors import CatalogNotFoundError as CatalogNotFoundError
from mv_assets.model.errors import ConcurrentRefreshError as ConcurrentRefreshError
from mv_assets.model.errors import ConcurrentWriteError as ConcurrentWriteError
from mv_assets.model.errors import MvAssetsError as MvAssetsError
from mv_assets.model.errors import SourceBehindError as SourceBehindError
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
from mv_assets.storage.jobs import JobRecord as JobRecord

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
    "JobRecord",
    "View",
    "OnError",
    "UnpackedUDF",
    "Connection",
    "connect",
    "DeclaredView",
    "CatalogNotFoundError",
    "ConcurrentRefreshError",
    "ConcurrentWriteError",
    "MvAssetsError",
    "SourceBehindError",
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
# ``mv_assets.udf.UDF``: that module path keeps resolving, so old catalogs load.
_sys.modules.setdefault("mv_assets.udf", _udf_module)

# Dagster Components (``type: mv_assets.ViewComponent`` in a defs.yaml, ``dg scaffold defs
# mv_assets.ViewComponent``; docs/dagster.md): the Dagster layer's, imported on first use of
# these names only (by dg, through dir() and the registry entry point in pyproject.toml), so
# that importing the engine never imports Dagster (by name: no static import of the wiring here).
_COMPONENTS = ("ViewComponent", "CatalogComponent")


def __getattr__(name: str):
    if name in _COMPONENTS:
        import importlib

        return getattr(importlib.import_module("mv_assets.dagster.components"), name)
    raise AttributeError(f"module 'mv_assets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_COMPONENTS])
