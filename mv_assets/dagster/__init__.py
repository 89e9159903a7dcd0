"""Dagster wiring for mv_assets catalogs. The engine never imports this package."""

from mv_assets.dagster.definitions import RESOURCE_KEY as RESOURCE_KEY
from mv_assets.dagster.definitions import TAG_SCOPE as TAG_SCOPE
from mv_assets.dagster.definitions import TAG_SOURCE_VERSION as TAG_SOURCE_VERSION
from mv_assets.dagster.definitions import build_definitions as build_definitions
from mv_assets.dagster.definitions import catalog_tables as catalog_tables
from mv_assets.dagster.definitions import partitions_def_name as partitions_def_name
from mv_assets.dagster.io_manager import IO_MANAGER_KEY as IO_MANAGER_KEY
from mv_assets.dagster.io_manager import MvAssetsIOManager as MvAssetsIOManager
from mv_assets.dagster.pipes_client import PipesLauncher as PipesLauncher
from mv_assets.dagster.pipes_client import view_pipes_extras as view_pipes_extras
from mv_assets.dagster.resource import MvAssetsResource as MvAssetsResource

__all__ = [
    "RESOURCE_KEY",
    "IO_MANAGER_KEY",
    "MvAssetsIOManager",
    "TAG_SCOPE",
    "TAG_SOURCE_VERSION",
    "build_definitions",
    "catalog_tables",
    "partitions_def_name",
    "PipesLauncher",
    "view_pipes_extras",
    "MvAssetsResource",
]
