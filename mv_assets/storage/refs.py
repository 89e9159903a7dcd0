"""Small frozen references to tables and views: what work code (planning,
execution, commits, status) is given instead of the public handles, so it
never calls back into the API layer."""

from dataclasses import dataclass

import lance

from mv_assets.model.definition import ColumnSpec, ViewDefinition, stored_columns
from mv_assets.storage import objects
from mv_assets.storage.layout import Layout

__all__ = ["TableRef", "ViewRef", "Ref"]


@dataclass(frozen=True)
class TableRef:
    """A base table: its name, dataset and catalog layout."""

    name: str
    uri: str
    layout: Layout

    is_view = False

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        return objects.dataset(self.uri, version=version)

    def input_dataset(self) -> lance.LanceDataset:
        """Where computed columns read their inputs: the table itself."""
        return self.dataset()

    def computed_columns(self) -> list[ColumnSpec]:
        """Columns computed by a UDF or SQL expression (stored in the schema metadata)."""
        return stored_columns(self.dataset().schema)

    def lock(self, timeout: float | None = 600.0):
        """The lock serialising column writes and refreshes of this table or view."""
        return self.layout.lock(self.name, timeout)


@dataclass(frozen=True)
class ViewRef:
    """A materialized view: its name, dataset, definition, source dataset and catalog layout."""

    name: str
    uri: str
    definition: ViewDefinition
    source_uri: str
    layout: Layout

    is_view = True

    @property
    def source(self) -> str:
        return self.definition.source

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        return objects.dataset(self.uri, version=version)

    def source_dataset(self, version: int | None = None) -> lance.LanceDataset:
        return objects.dataset(self.source_uri, version=version)

    def source_missing(self, name: str | None = None) -> str:
        """What to tell a user whose view's source dataset (or a join's
        ``name``) is gone."""
        name = name or self.source
        uri = self.source_uri if name == self.source else self.layout.table_uri(name)
        return (
            f"the source {name!r} of view {self.name!r} is missing: no Lance dataset at {uri} "
            "(removed outside mv_assets?); recreate it (the view is then rebuilt) or drop the view"
        )

    def input_dataset(self) -> lance.LanceDataset:
        """Where the view's own computed columns read their inputs: its source."""
        return self.source_dataset()

    def computed_columns(self) -> list[ColumnSpec]:
        """UDF columns and columns added with ``add_columns``."""
        return [c for c in self.definition.columns if c.kind == "udf" or c.added]

    def lock(self, timeout: float | None = 600.0):
        return self.layout.lock(self.name, timeout)


Ref = TableRef | ViewRef
