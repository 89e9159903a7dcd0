"""Dagster wiring for mv_assets catalogs. The engine never imports this package."""

from .definitions import RESOURCE_KEY as RESOURCE_KEY
from .definitions import TAG_SCOPE as TAG_SCOPE
from .definitions import TAG_SOURCE_VERSION as TAG_SOURCE_VERSION
from .definitions import build_definitions as build_definitions
from .definitions import catalog_tables as catalog_tables
from .definitions import partitions_def_name as partitions_def_name
from .resource import MvAssetsResource as MvAssetsResource

__all__ = [
    "RESOURCE_KEY",
    "TAG_SCOPE",
    "TAG_SOURCE_VERSION",
    "build_definitions",
    "catalog_tables",
    "partitions_def_name",
    "MvAssetsResource",
]
