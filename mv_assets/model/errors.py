"""Exceptions raised by mv_assets. Input mistakes are ``ValueError`` subclasses."""

__all__ = [
    "MvAssetsError",
    "CatalogNotFoundError",
    "TableNotFoundError",
    "TableExistsError",
    "JobNotFoundError",
    "SourceBehindError",
    "ConcurrentRefreshError",
    "ConcurrentWriteError",
    "UdfError",
    "SqlRowsError",
]


class MvAssetsError(Exception):
    """Base class for mv_assets errors that are not plain input mistakes."""


class CatalogNotFoundError(ValueError, MvAssetsError):
    """No catalog at that location (opened with ``connect(uri, create=False)``)."""


class TableNotFoundError(ValueError, MvAssetsError):
    """No table or view of that name in the catalog."""


class JobNotFoundError(ValueError, MvAssetsError):
    """No job of that id in the catalog's records (``db.get_job``)."""


class TableExistsError(ValueError, MvAssetsError):
    """A table or view of that name already exists (use mode="overwrite")."""


class SourceBehindError(MvAssetsError):
    """A view's source is itself a view that has not caught up with its own source."""


class SqlRowsError(ValueError, MvAssetsError):
    """A SQL computed column's expression fails on some rows' values (a cast
    that does not hold for them): ``rows`` names them (stable row ids), and
    the message says what was committed. Raised by an explicit backfill; a
    write (``add``, ``update``, ``add_columns``) leaves those rows stale with
    a warning instead (its own commit stands)."""

    def __init__(self, message: str, rows: list[int], error: str) -> None:
        super().__init__(message)
        self.rows = rows
        self.error = error  # what the expression's evaluation said (Lance's error, short)


class ConcurrentRefreshError(MvAssetsError):
    """The view changed while a refresh was running; nothing was committed."""


class ConcurrentWriteError(MvAssetsError):
    """Other writers kept changing a table while an operation wrote it: a whole
    rewrite (bringing it in with stable row ids) or a commit that conflicted on
    every attempt (a backfill, a column load); nothing was committed."""


class UdfError(MvAssetsError, RuntimeError):
    """A UDF raised on a row and its ``on_error`` policy says fail: the job stops,
    nothing is committed, and the failed row is recorded in the errors table.

    Names the UDF, the column, the row (stable row id of the table the row
    belongs to, for a view its source; the primary key value if that table has
    one) and the remedy. A batched UDF that raises is run again on halves of
    its batch until one row raises alone, which is named; where no row raises
    alone (the batch fails as a whole), the smallest failing part is named
    (first and last row ids). Built where the UDF runs (the row's position in its batch),
    located by the task (column, row ids), attributed on the driver (table,
    primary key); it crosses process boundaries as plain data
    (:meth:`to_dict`, pickling), so a Spark job re-raises it on the driver.
    The user's exception type, message and traceback are kept as text
    (``error_type``, ``message``, ``traceback``); in process also as ``__cause__``.
    """

    _FIELDS = (
        "udf", "error_type", "message", "traceback", "attempts", "row_index", "rows", "column", "fingerprint",
        "row_id", "last_row_id", "row_version", "table", "rows_of", "key", "committed", "skippable", "not_created",
    )

    def __init__(
        self, udf: str, error_type: str, message: str, *, traceback: str = "", attempts: int = 1,
        row_index: int | None = None, rows: int = 1,
    ) -> None:
        super().__init__()
        self.udf, self.error_type, self.message = udf, error_type, message
        self.traceback, self.attempts = traceback, attempts
        self.row_index, self.rows = row_index, rows  # position of the (first) row in the UDF's batch
        self.column: str | None = None
        self.fingerprint: str | None = None
        self.row_id: int | None = None
        self.last_row_id: int | None = None
        self.row_version: int | None = None
        self.table: str | None = None
        self.rows_of: str | None = None  # the table the row ids belong to (a view's source)
        self.key: tuple[str, object] | None = None  # (primary key column, value)
        self.committed: str | None = None  # what the job committed before it failed (None: nothing)
        self.skippable = True  # whether on_error="skip" is a remedy (a UDTF's partition: not)
        # the first refresh of a view created with data failed: the view was dropped, nothing recorded
        self.not_created = False

    def locate(self, *, column: str, fingerprint: str, row_id: int, last_row_id: int, row_version: int) -> None:
        """The task: which column and rows of its batch."""
        self.column, self.fingerprint = column, fingerprint
        self.row_id, self.last_row_id, self.row_version = row_id, last_row_id, row_version

    def attribute(self, *, table: str, rows_of: str, key: "tuple[str, object] | None") -> None:
        """The driver: which table, whose rows, the row's primary key value."""
        self.table, self.rows_of, self.key = table, rows_of, key

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self._FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> "UdfError":
        err = cls(d["udf"], d["error_type"], d["message"])
        for name in cls._FIELDS:
            setattr(err, name, d.get(name, getattr(err, name)))
        if err.key is not None:
            err.key = (err.key[0], err.key[1])
        return err

    def __reduce__(self):
        return (_udf_error_from_dict, (self.to_dict(),))

    def record(self) -> dict:
        """The errors table's record of the failed row (of the batch's first row for a batched UDF)."""
        message = self.message
        if self.rows > 1:
            message += f" (a batch of {self.rows} rows failed: row ids {self.row_id}..{self.last_row_id})"
        return {
            "column": self.column, "udf_name": self.udf, "udf_fingerprint": self.fingerprint, "row_id": self.row_id,
            "row_version": self.row_version, "error_type": self.error_type, "message": message,
            "traceback": self.traceback, "attempts": self.attempts,
        }

    def row_description(self) -> str | None:
        if self.row_id is None:
            return None
        of = f" of {self.rows_of!r}" if self.rows_of else ""
        label = "source row id" if self.rows_of is not None and self.rows_of != self.table else "row id"
        if self.rows > 1:
            return (f"a batch of {self.rows} rows{of} ({label}s {self.row_id}..{self.last_row_id}; a batched UDF "
                    "does not say which row)")
        key = f" ({self.key[0]}={self.key[1]!r})" if self.key is not None else ""
        return f"{label} {self.row_id}{of}{key}"

    def __str__(self) -> str:
        message = self.message if len(self.message) <= 300 else self.message[:300] + "..."
        where = []
        if self.column is not None:
            where.append(f"computing column {self.column!r}" + (f" of {self.table!r}" if self.table else ""))
        row = self.row_description()
        if row is not None:
            where.append(f"on {row}")
        errors = f"`mv-assets errors {self.table}`" if self.table else "`mv-assets errors <table>`"
        if self.not_created:
            return (
                f"UDF {self.udf!r} raised {self.error_type}: {message}"
                + (f" ({', '.join(where)})" if where else "")
                + f". The view {self.table!r} was not created (nothing was written or recorded). Fix the UDF and "
                "create it again, or declare it with on_error=\"skip\" (failing rows get NULL and are recorded), "
                "or create it with with_no_data=True and refresh it: a refresh that fails leaves the view and its "
                "error records."
            )
        return (
            f"UDF {self.udf!r} raised {self.error_type}: {message}"
            + (f" ({', '.join(where)})" if where else "")
            + f". {self.committed or 'Nothing was committed'}. Fix the UDF and run again, or "
            + ("declare it with on_error=\"skip\" (failing rows get NULL and are recorded)" if self.skippable else
               "declare it with on_error=OnError(...) retrying the exceptions that may pass (a partition of a "
               "table function cannot be skipped)")
            + f"; {errors} (Table.get_errors) lists the failed rows."
        )


def _udf_error_from_dict(d: dict) -> UdfError:
    return UdfError.from_dict(d)
