"""Small frozen references to tables and views: what work code (planning,
execution, commits, status) is given instead of the public handles, so it
never calls back into the API layer."""

from dataclasses import dataclass

import lance

from .definition import ViewDefinition
from .layout import Layout

__all__ = ["ViewRef"]


@dataclass(frozen=True)
class ViewRef:
    """A materialized view: its name, dataset, definition, source dataset and catalog layout."""

    name: str
    uri: str
    definition: ViewDefinition
    source_uri: str
    layout: Layout

    @property
    def source(self) -> str:
        return self.definition.source

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        return lance.dataset(self.uri, version=version)

    def source_dataset(self, version: int | None = None) -> lance.LanceDataset:
        return lance.dataset(self.source_uri, version=version)
