"""What an asset of the user's gets for a parameter named after a table, a
view or a column of the catalog: the table's or view's handle.

The lineage op writes nothing through Dagster: a refresh commits to Lance, and
its materializations are events of its own (see ``_outputs`` in
:mod:`mv_assets.dagster.assets`). So the catalog's assets are loaded, not
stored: ``load_input`` opens the table or view from the catalog (a UDF
column's or a computed column's asset: the table or view holding it), at its
latest version, with the run's resource (no JVM until something asks Spark for
work). ``handle_output`` takes the lineage op's empty outputs and refuses any
other value: nothing is ever pickled next to a Lance dataset.
"""

from typing import Any

import dagster as dg

from mv_assets.dagster.resource import MvAssetsResource
from mv_assets.model.errors import TableNotFoundError

IO_MANAGER_KEY = "mv_assets_io_manager"


class MvAssetsIOManager(dg.ConfigurableIOManager):
    """Loads a catalog asset as its table or view handle (``Table``,
    ``MaterializedView``): ``def report(docs_view: mv.MaterializedView)``
    or ``ins={"v": dg.AssetIn(key=dg.AssetKey(["docs_view", "embedding"]))}``."""

    mv_assets: dg.ResourceDependency[MvAssetsResource]

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is not None:
            key = context.asset_key.to_user_string() if context.has_asset_key else context.name
            raise TypeError(
                f"{IO_MANAGER_KEY} stores nothing: it loads the tables and views of the mv_assets catalog, which "
                f"their refreshes write to Lance; {key} returned a {type(obj).__name__}. Give that asset another "
                "io_manager_key."
            )

    def load_input(self, context: dg.InputContext) -> Any:
        key = context.asset_key
        name = key.path[0]
        try:
            return self.mv_assets.connection().open_table(name)
        except TableNotFoundError as exc:
            raise dg.Failure(
                description=f"{key.to_user_string()} cannot be loaded: {exc} (dropped since the definitions were "
                            "loaded? reload them)") from exc
