"""Planning a join aggregate's refresh (kind ``"join_aggregate"``,
:mod:`mv_assets.model.join_agg_view`): joins and ``GROUP BY`` in one view.

The join under the view (its own join view, never listed) is brought up to
date first, by the delta rule (:mod:`mv_assets.ops.join_refresh`), by the
view's refresh (``MaterializedView.refresh``: it has the runner). This plan
is then the aggregate's over the join's own changes
(:mod:`mv_assets.ops.agg_refresh`: the join rows written since are added to
their groups, the rows removed taken out; only the touched groups are
rewritten), and it records the version of every table the join reads, as a
join view's refresh does, so the status and the sensors see any of them move.

A dry run (``plan_refresh()``) while the join is behind its tables is the
join's plan: the joined rows a refresh computes (the groups they touch are
counted by the refresh).
"""

from mv_assets.model.join_agg_view import JOIN_AGG_KIND
from mv_assets.ops.agg_refresh import plan_agg_refresh
from mv_assets.ops.join_refresh import plan_join_refresh
from mv_assets.ops.refresh import RefreshPlan
from mv_assets.storage.refs import ViewRef
from mv_assets.storage.state import read_refresh_state

__all__ = ["plan_join_agg_refresh", "join_under_ref"]


def join_under_ref(view: ViewRef) -> ViewRef:
    """The join kept under join aggregate ``view`` (its source), as a view."""
    from mv_assets.model.definition import VIEW_METADATA_KEY, ViewDefinition

    ds = view.source_dataset()
    raw = (ds.schema.metadata or {}).get(VIEW_METADATA_KEY.encode())
    if raw is None:
        raise ValueError(f"the join under {view.name!r} ({view.source!r}) is not a join view")
    definition = ViewDefinition.decode(raw)
    return ViewRef(view.source, view.source_uri, definition, view.layout.table_uri(definition.source), view.layout)


def plan_join_agg_refresh(view: ViewRef, src_version: int | None = None, *, mode: str = "auto",
                          exact: bool = True, **kwargs) -> RefreshPlan:
    """Plan a refresh of join aggregate ``view`` (see the module docstring);
    arguments as :func:`mv_assets.ops.refresh.plan_refresh`'s (``src_version``:
    of the join's first table, given to the join's refresh)."""
    if view.definition.kind != JOIN_AGG_KIND:
        raise ValueError(f"{view.name!r} is not a join aggregate")
    under = join_under_ref(view)
    if exact:  # a dry run: the join's work first, when it has some
        join_plan = plan_join_refresh(under, src_version, mode=mode, exact=True, **kwargs)
        if join_plan.has_work or join_plan.full:
            join_plan.view = view.name
            join_plan.reason = f"the join under it: {join_plan.reason}"
            return join_plan
    plan = plan_agg_refresh(view, None, mode=mode, exact=exact, **kwargs)
    return with_tables(view, plan)


def with_tables(view: ViewRef, plan: RefreshPlan) -> RefreshPlan:
    """``plan`` recording, besides the join's version, the version and
    identity of every table the join reads (what it reflects now): a state
    commit even when no group changed, once any table moved."""
    ds = view.dataset()
    recorded = read_refresh_state(ds).sources or {}
    under = read_refresh_state(view.source_dataset())
    sources = {view.source: view.source_dataset().version, **(under.sources or {})}
    plan.details = {**plan.details, "sources": sources,
                    "source_ids": {**(under.source_ids or {}), view.source: plan.source_id}}
    if {k: v for k, v in recorded.items() if k != view.source} != (under.sources or {}):
        plan.details["sources_moved"] = True
        if not plan.definition_raw:
            plan.definition_raw = view.definition.encode()
    return plan
