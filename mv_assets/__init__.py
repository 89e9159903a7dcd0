"""mv_assets: incrementally maintained materialized views with Python UDF
columns over Lance datasets, computed on Spark.

The engine (this package minus :mod:`mv_assets.dagster`) never imports
dagster, and nothing here starts a JVM until a refresh has work to do.
"""

from .backfill import BackfillJob as BackfillJob
from .backfill import BackfillPlan as BackfillPlan
from .backfill import BackfillResult as BackfillResult
from .catalog import Connection as Connection
from .catalog import connect as connect
from .definition import SOURCE_ROW_ID as SOURCE_ROW_ID
from .error_log import ErrorRecord as ErrorRecord
from .errors import ConcurrentRefreshError as ConcurrentRefreshError
from .errors import MvAssetsError as MvAssetsError
from .errors import SourceBehindError as SourceBehindError
from .errors import TableExistsError as TableExistsError
from .errors import TableNotFoundError as TableNotFoundError
from .policy import RefreshPolicy as RefreshPolicy
from .query import Query as Query
from .refresh import RefreshPlan as RefreshPlan
from .refresh import RefreshResult as RefreshResult
from .spark import InlineRunner as InlineRunner
from .spark import SparkRunner as SparkRunner
from .table import MaterializedView as MaterializedView
from .table import Table as Table
from .udf import UDF as UDF
from .udf import Columns as Columns
from .udf import OnError as OnError
from .udf import UnpackedUDF as UnpackedUDF
from .udf import udf as udf

__all__ = [
    "BackfillJob",
    "BackfillPlan",
    "BackfillResult",
    "Columns",
    "ErrorRecord",
    "OnError",
    "UnpackedUDF",
    "Connection",
    "connect",
    "ConcurrentRefreshError",
    "MvAssetsError",
    "SourceBehindError",
    "TableExistsError",
    "TableNotFoundError",
    "Query",
    "RefreshPolicy",
    "SOURCE_ROW_ID",
    "RefreshPlan",
    "RefreshResult",
    "InlineRunner",
    "SparkRunner",
    "MaterializedView",
    "Table",
    "UDF",
    "udf",
]

__version__ = "0.1.0"
