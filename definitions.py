"""Dagster entry point: the asset graph of the catalog at $MV_ASSETS_DB.

Defaults to the demo catalog (``make demo`` seeds it first). Views declared in
code come from the module named by $MV_ASSETS_VIEWS (see docs/dagster.md);
$MV_ASSETS_AUTOMATION picks what launches refreshes: "sensor" (default) or
"conditions" (AutomationConditions, see docs/dagster.md).
Loading this module reads catalog metadata only: it writes nothing, and no JVM
starts until a run refreshes a view.
"""

import os

from mv_assets.dagster import build_definitions

_DEFAULT_DB = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".demo", "catalog")


def _catalog() -> str:
    uri = os.environ.get("MV_ASSETS_DB") or _DEFAULT_DB
    if "://" not in uri and not os.path.isdir(uri):
        hint = "run `make demo` (or `python -m mv_assets.demo seed`) first" if uri == _DEFAULT_DB else "check MV_ASSETS_DB"
        raise FileNotFoundError(f"no mv_assets catalog at {uri}: {hint}")
    return uri


def _views() -> str | None:
    """The module declaring views in code ($MV_ASSETS_VIEWS: dotted name or .py path)."""
    spec = os.environ.get("MV_ASSETS_VIEWS")
    if spec is None and not os.environ.get("MV_ASSETS_DB"):
        return "mv_assets.demo"  # the demo catalog's views are declared in mv_assets/demo.py
    return spec or None


defs = build_definitions(
    _catalog(),
    views=_views(),
    sensor_interval_seconds=int(os.environ.get("MV_ASSETS_SENSOR_INTERVAL", "15")),
    sensors_running=os.environ.get("MV_ASSETS_SENSORS", "running") != "stopped",
    automation=os.environ.get("MV_ASSETS_AUTOMATION") or "sensor",
)
