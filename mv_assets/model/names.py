"""Every internal column name, scan alias and kind, in one place.

All internal names start with ``__``: users cannot give a column such a name
(:func:`is_reserved_name`), so none of them can collide with user data.
"""

from enum import StrEnum

__all__ = [
    "SOURCE_ROW_ID", "SOURCE_ROW_VERSION", "VIEW_KEY_COLUMNS", "CHUNK_INDEX", "CHUNK_INPUTS", "PARTITION", "AGG_PREFIX", "JOINED_ROW_ID_PREFIX", "is_internal_column", "COMPUTED_PREFIX", "SOURCE_MARKER_PREFIX",
    "LANCE_ROW_COLUMNS", "RESERVED_PREFIX", "Alias", "ColumnKind", "UdfKind", "computed_marker", "source_marker",
    "is_marker", "is_reserved_name", "check_column_name", "input_alias", "input_marker_alias", "nth_marker_alias", "PRIMARY_KEY_METADATA_KEY",
]

# -- stored in every view row --------------------------------------------------
SOURCE_ROW_ID = "__source_row_id"  # the stable row id of the source row it came from
SOURCE_ROW_VERSION = "__source_row_version"  # that row's last-updated version when computed
VIEW_KEY_COLUMNS = frozenset({SOURCE_ROW_ID, SOURCE_ROW_VERSION})
# -- stored in every row of a chunk view (kind "chunker": a source row gives 0..n rows) --
CHUNK_INDEX = "__chunk_index"  # the row's position among its parent's children
CHUNK_INPUTS = "__chunk_inputs"  # digest of the parent's chunker inputs the row was made from
# -- stored in every row of a table-function view (kind "udtf": a partition's rows give 0..n rows) --
PARTITION = "__partition"  # the key of the partition the row was made from (model.udtf_view.partition_key)
# -- stored in every row of a join view (kind "join"): + i, the i-th joined table's stable row id --
JOINED_ROW_ID_PREFIX = "__join_row_id_"
# -- stored in every row of an aggregate view (kind "aggregate": one row per group) --
AGG_PREFIX = "__agg__"  # + what: a group's hidden state (row count, non-NULL counts, sums; model.agg_view)

# -- a table's schema metadata: its primary key column (if it has one) -------------
PRIMARY_KEY_METADATA_KEY = "mv_assets.primary_key"

# -- per-row markers of computed columns ------------------------------------------
COMPUTED_PREFIX = "__computed__"  # + column: the fingerprint that computed the row's value
SOURCE_MARKER_PREFIX = "__source_computed__"  # + column: a view's copy of its source's marker

# -- Lance's own row columns --------------------------------------------------------
LANCE_ROW_COLUMNS = frozenset(
    {"_rowid", "_rowaddr", "_rowoffset", "_row_created_at_version", "_row_last_updated_at_version"}
)

RESERVED_PREFIX = "__"


class Alias(StrEnum):
    """Names given to columns inside one scan or checkpoint file (never stored in tables)."""

    ROW_VERSION = "__row_version"  # planning scans: the source row's last-updated version
    TASK_ROW_VERSION = "__mv_assets_row_version"  # task scans: the same, next to the view's columns
    PROBE = "__mv_assets_probe"  # SQL validation: a real column so literal-only projections plan
    CHECKPOINT_ROW_ID = "__ckpt_row_id"
    CHECKPOINT_ROW_VERSION = "__ckpt_row_version"
    CHECKPOINT_INPUTS = "__ckpt_inputs"  # markers of the computed columns the UDFs read
    INPUT_ID = "__in_id"  # backfill plans: the input row's id, version, address; the target row's id
    INPUT_VERSION = "__in_ver"
    INPUT_ADDRESS = "__in_addr"
    TARGET_ID = "__target_id"
    TARGET_ADDRESS = "__target_addr"  # the target row's address (a view's one-pass backfill writes by it)
    MATCHED = "__matched"
    KEY = "__key"  # a row's key (view: its source row id) in a one-off scan


class ColumnKind(StrEnum):
    """What computes a view or table column."""

    COLUMN = "column"  # a source column, copied
    SQL = "sql"  # a SQL expression (Lance/DataFusion)
    UDF = "udf"  # a Python UDF


class UdfKind(StrEnum):
    """How a UDF is called."""

    SCALAR = "scalar"  # once per row, Python values
    ARRAY = "array"  # once per batch, one pa.Array per parameter
    BATCH = "batch"  # once per batch, a pa.RecordBatch of its (fixed) input columns


def computed_marker(column: str) -> str:
    """The hidden column recording, per row, the fingerprint that computed
    ``column`` (NULL: never computed, or the UDF failed on the row)."""
    return f"{COMPUTED_PREFIX}{column}"


def source_marker(column: str) -> str:
    """The hidden view column holding the source's marker of computed column
    ``column`` as of when the view row was computed (views that read it)."""
    return f"{SOURCE_MARKER_PREFIX}{column}"


def is_marker(name: str) -> bool:
    """Hidden bookkeeping columns: computed markers and their copies in views."""
    return name.startswith(COMPUTED_PREFIX) or name.startswith(SOURCE_MARKER_PREFIX)


def is_internal_column(name: str) -> bool:
    """Columns readers other than mv_assets can ignore: a view's key columns and markers.

    >>> [is_internal_column(n) for n in ("__source_row_id", "__computed__y", "y")]
    [True, True, False]
    """
    return (name in VIEW_KEY_COLUMNS or name == CHUNK_INPUTS or is_marker(name) or name.startswith(AGG_PREFIX)
            or name.startswith(JOINED_ROW_ID_PREFIX))


def is_reserved_name(name: str) -> bool:
    """Names users cannot give a column: Lance's row columns and anything
    starting with ``__`` (markers, view bookkeeping, scan aliases), which would
    silently collide with internals.

    >>> is_reserved_name("__in__x"), is_reserved_name("_rowid"), is_reserved_name("x")
    (True, True, False)
    """
    return name.startswith(RESERVED_PREFIX) or name in LANCE_ROW_COLUMNS


def check_column_name(name: str, what: str = "column name") -> None:
    """Refuse a name no column of a table or view can take, in words, before
    anything is written: a reserved one (:func:`is_reserved_name`), or one with
    a ``.`` (Lance reads it as a nested field's path: its writer failed with
    "Top level field a.b cannot contain `.`" after the checks had passed).

    >>> check_column_name("a.b")
    Traceback (most recent call last):
    ...
    ValueError: column name 'a.b' contains '.', which Lance reads as the path of a nested field; choose a name without it
    """
    if is_reserved_name(name):
        raise ValueError(f"{what} {name!r} is reserved (names starting with '__' and Lance's row columns)")
    if "." in name:
        raise ValueError(f"{what} {name!r} contains '.', which Lance reads as the path of a nested field; "
                         "choose a name without it")


def input_alias(column: str) -> str:
    """A UDF input column inside a task scan."""
    return f"__in__{column}"


def nth_marker_alias(i: int) -> str:
    """The i-th marker column of a scan reading several markers."""
    return f"__inm{i}"


def input_marker_alias(column: str) -> str:
    """The marker of a computed UDF input column inside a task scan."""
    return f"__in_marker__{column}"


# the join kept under a join aggregate view ``<name>`` (model.join_agg_view) is the
# dataset ``__mvjoin__<name>``: never listed, refused as a name
JOIN_UNDER_PREFIX = "__mvjoin__"
