"""What every planner of a view with a table function (chunk views,
table-function views) does before finding its rows: check the arguments,
read the view's refresh state and the source's history, tell whether the
source is the table the view was built from and whether another tool wrote
into the view, decide full / sync / incremental, and return the "already
current" plan when no source commit since changed what the view reads.

The kinds differ only in what they can do incrementally (``scoped``: a chunk
view refreshes a fragment's parents; a table-function view's partitions span
fragments, so it refreshes as a whole; ``sync_ok``: a chunk view compares every
parent with the view when the change feed cannot be read; a table-function view
recomputes everything).
"""

from dataclasses import dataclass

import lance

from mv_assets.model.definition import ViewDefinition, read_field_ids
from mv_assets.model.planning import History, choose_how
from mv_assets.ops.refresh import (
    RefreshPlan,
    _already_current,
    _check_args,
    _check_reads,
    _created_reading,
    _nothing_read_changed,
    _open_source,
    _replacement,
    _scope,
    _source_at,
    read_history,
)
from mv_assets.storage.changes import ForeignWrites, backfill_commits, commits_since, foreign_writes
from mv_assets.storage.identity import table_id
from mv_assets.storage.refs import ViewRef
from mv_assets.storage.state import RefreshState, read_refresh_state

__all__ = ["PlanStart", "start_plan"]


@dataclass
class PlanStart:
    """Where a function view's refresh starts from (see :func:`start_plan`)."""

    definition: ViewDefinition
    src: lance.LanceDataset  # the source at the target version
    view_ds: lance.LanceDataset
    state: RefreshState
    source_id: str | None
    read_fields: dict[str, int]
    foreign: ForeignWrites | None
    scope: list[int] | None
    scope_frags: list | None
    how: str  # "full" | "sync" | "incremental"
    reason: str
    commits: list | None  # the source's commits since the reflected version (incremental)
    computed: list[str]  # computed source columns the view reads

    @property
    def v0(self) -> int | None:
        return self.state.source_version


def start_plan(
    view: ViewRef, src_version: int | None, *, mode: str, fragments: list[int] | None,
    recompute: list[str] | None, max_rows_per_task: int | None, checkpoint_size: int | None, noun: str,
    scoped: bool, sync_ok: bool,
) -> "PlanStart | RefreshPlan":
    """The common start of a function view's plan, or its finished plan when
    the view is already current. ``noun`` names the view's kind in errors."""
    _check_args(mode, max_rows_per_task, checkpoint_size)
    if recompute:
        raise ValueError(
            f"recompute applies to UDF columns of query views; {noun} {view.name!r} is computed again with "
            "mode='full'"
        )
    definition = view.definition
    src_latest = _open_source(view)
    view_ds = view.dataset()
    state = read_refresh_state(view_ds)
    source_id = table_id(src_latest, state.source_id)
    read_fields = read_field_ids(definition, src_latest)
    replaced = _replacement(view, state, source_id, read_fields, mode)
    foreign = foreign_writes(view_ds, state.view_version)
    src = _source_at(view.name, definition, src_latest, src_version)
    _check_reads(view.name, definition, src, state.read_fields or _created_reading(view_ds))
    scope, scope_frags = (_scope(view.name, definition, src, fragments, None)
                          if scoped and replaced is None and foreign is None else (None, None))
    v0 = state.source_version
    # (a source that has not moved has no commits to read: a no-change refresh reads none)
    history = (read_history(src, v0, src.version) if v0 is not None and replaced is None and v0 != src.version
               else History())
    how, reason = choose_how(
        mode=mode, definition_changed=state.definition not in (None, definition.shape_fingerprint()), v0=v0,
        target=src.version, scope=scope, recompute=None, scoped_since_whole=state.scoped_since_whole,
        history=history, source_replaced=replaced,
        # rows another tool wrote into the view cannot be traced to a source row: rebuilt
        view_written=(True, foreign.describe()) if foreign else None,
    )
    computed = definition.computed_reads(src.schema)
    if how != "full" and v0 is not None and src.version < v0:
        how, reason = "full", f"source version {src.version} is older than the reflected version {v0}"
    elif how != "full" and v0 is not None and computed and src.version > v0 and backfill_commits(
            src, v0, src.version, computed):
        how, reason = "full", f"a backfill of {computed} (read by the view) rewrote values without moving row versions"
    if how == "sync" and not sync_ok:  # no change feed to follow (first refresh, cleaned-up history): all
        how = "full"
    if how == "full" and mode == "incremental_strict" and v0 is not None:
        raise ValueError(f"refresh of {view.name!r} cannot be incremental: {reason}")
    if how == "full":
        scope = scope_frags = None
    if fragments is not None and not scoped:
        reason += f" (a {noun} refreshes as a whole: fragments= widened to the whole source)"
    commits = commits_since(src, v0) if how == "incremental" and v0 is not None and v0 <= src.version else None
    if commits is not None and _nothing_read_changed(commits, computed, state):
        return _already_current(view, src.version, view_ds.version, state, source_id=source_id,
                                read_fields=read_fields)
    return PlanStart(definition, src, view_ds, state, source_id, read_fields, foreign, scope, scope_frags, how,
                     reason, commits, computed)
