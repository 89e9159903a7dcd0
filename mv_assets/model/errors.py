"""Exceptions raised by mv_assets. Input mistakes are ``ValueError`` subclasses."""

__all__ = [
    "MvAssetsError",
    "CatalogNotFoundError",
    "TableNotFoundError",
    "TableExistsError",
    "SourceBehindError",
    "ConcurrentRefreshError",
]


class MvAssetsError(Exception):
    """Base class for mv_assets errors that are not plain input mistakes."""


class CatalogNotFoundError(ValueError, MvAssetsError):
    """No catalog at that location (opened with ``connect(uri, create=False)``)."""


class TableNotFoundError(ValueError, MvAssetsError):
    """No table or view of that name in the catalog."""


class TableExistsError(ValueError, MvAssetsError):
    """A table or view of that name already exists (use mode="overwrite")."""


class SourceBehindError(MvAssetsError):
    """A view's source is itself a view that has not caught up with its own source."""


class ConcurrentRefreshError(MvAssetsError):
    """The view changed while a refresh was running; nothing was committed."""
