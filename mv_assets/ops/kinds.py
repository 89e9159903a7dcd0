"""View kinds and the planner that refreshes each (the rest of a refresh, its
tasks' execution and its one commit, is shared: :func:`mv_assets.ops.refresh.execute_refresh`).

* ``"query"``: one view row per passing source row (:mod:`mv_assets.ops.refresh`);
* ``"chunker"``: zero or more rows per passing source row (:mod:`mv_assets.ops.chunk_refresh`);
* ``"udtf"``: zero or more rows per partition of the passing source rows (:mod:`mv_assets.ops.udtf_refresh`);
* ``"aggregate"``: one row per group of the passing source rows (:mod:`mv_assets.ops.agg_refresh`);
* ``"join"``: one row per row of an equi-join of several sources (:mod:`mv_assets.ops.join_refresh`);
* ``"join_aggregate"``: one row per group of a join's rows (:mod:`mv_assets.ops.join_agg_refresh`).
"""

from collections.abc import Callable

from mv_assets.ops.agg_refresh import plan_agg_refresh
from mv_assets.ops.chunk_refresh import plan_chunk_refresh
from mv_assets.ops.join_agg_refresh import plan_join_agg_refresh
from mv_assets.ops.join_refresh import plan_join_refresh
from mv_assets.ops.refresh import RefreshPlan, plan_refresh
from mv_assets.ops.udtf_refresh import plan_udtf_refresh
from mv_assets.storage import objects
from mv_assets.storage.refs import ViewRef

__all__ = ["PLANNERS", "plan_view_refresh"]

PLANNERS: dict[str, Callable[..., RefreshPlan]] = {
    "query": plan_refresh, "chunker": plan_chunk_refresh, "udtf": plan_udtf_refresh, "aggregate": plan_agg_refresh,
    "join": plan_join_refresh, "join_aggregate": plan_join_agg_refresh,
}


def plan_view_refresh(view: ViewRef, *args, **kwargs) -> RefreshPlan:
    """The refresh plan of ``view`` by its kind's planner (arguments as :func:`plan_refresh`'s)."""
    kind = view.definition.kind
    planner = PLANNERS.get(kind)
    if planner is None:
        raise ValueError(f"view {view.name!r} is a {kind!r} view, which this version of mv_assets cannot refresh")
    plan = planner(view, *args, **kwargs)
    if kwargs.get("exact", True) is False and plan.view_stamp is None:
        # a refresh's plan: the manifest of the version it read, as stored, is checked at its commit
        # (a dry run commits nothing: no stat, no HEAD on an object store)
        plan.view_stamp = objects.version_signature(view.uri, plan.view_version)
    return plan
