"""Planning a chunk view's refresh (kind ``"chunker"``, :mod:`mv_assets.model.chunk_view`).

The refresh runs through the same pipeline as a query view's: this plan, the
runner's tasks (:mod:`mv_assets.execution.chunk_tasks`), and one Lance commit
with the refresh state (:func:`mv_assets.ops.refresh.execute_refresh`).
Keys are parents (source row ids); a view row is a child of one.

* **incremental**: parents written since the reflected version are chunked
  again (their old children removed), deleted parents and parents that no
  longer pass the filter lose their children; no chunker call for them. An
  updated parent whose chunker inputs are unchanged (digest) has its children
  copied with the new inherited columns: no call either. Compaction and
  commits touching nothing the view reads cost nothing.
* **sync** (fragment-scoped, after a history cleanup, after scoped refreshes):
  every passing parent (in scope) is compared with the view: current when its
  children carry its version, or when it has none and was not written since
  the version the whole view reflects (chunked then, into no rows).
* **full**: everything chunked again (first refresh, new chunker or query,
  recreated source, a write into the view by another tool, an older target
  version, a backfill of a source column the view reads).

``rows_to_insert`` / ``rows_to_update`` / ``rows_to_delete`` count parents;
``udf_rows`` the chunker calls (parents chunked), exactly.
"""

import lance
import numpy as np
import pyarrow as pa

from mv_assets.model.chunk_view import input_digests, processed_without_children
from mv_assets.model.names import CHUNK_INPUTS, SOURCE_ROW_ID, SOURCE_ROW_VERSION
from mv_assets.model.planning import (
    KeyPlan,
    fit_to_fragments,
    isin,
    pieces_from_rows,
    positions,
    task_rows,
)
from mv_assets.model.planning import column_ids as _ids
from mv_assets.ops.function_plan import start_plan
from mv_assets.ops.refresh import (
    ROW_VERSION_ALIAS,
    RefreshPlan,
    ViewKeys,
    _gone_since,
    _no_rows,
    _place,
    _scan,
    and_filters,
)
from mv_assets.storage.changes import deleted_since, gone_rows, written_fragments
from mv_assets.storage.lance_compat import take_rows
from mv_assets.storage.refs import ViewRef
from mv_assets.storage.state import scoped_since_whole

__all__ = ["plan_chunk_refresh"]


def plan_chunk_refresh(
    view: ViewRef,
    src_version: int | None = None,
    *,
    mode: str = "auto",
    fragments: list[int] | None = None,
    recompute: list[str] | None = None,
    max_rows_per_task: int | None = None,
    checkpoint_size: int | None = None,
    parallelism: int = 1,
    exact: bool = True,  # (its counts are always exact)
) -> RefreshPlan:
    """Plan a refresh of chunk view ``view`` (see the module docstring);
    arguments as :func:`mv_assets.ops.refresh.plan_refresh`'s."""
    start = start_plan(view, src_version, mode=mode, fragments=fragments, recompute=recompute,
                       max_rows_per_task=max_rows_per_task, checkpoint_size=checkpoint_size, noun="chunk view",
                       scoped=True, sync_ok=True)
    if isinstance(start, RefreshPlan):
        return start
    definition, src, view_ds, state, how, v0 = start.definition, start.src, start.view_ds, start.state, start.how, start.v0
    scope, commits = start.scope, start.commits
    chunker = definition.table_function

    # the fragments that can hold rows written since v0 ([]: deletes only), or None: any
    moved = written_fragments(src, v0, commits) if commits is not None else None
    keys, parents, reuse, vk = _changes(view_ds, src, definition, how, v0, start.scope_frags, moved)
    n = len(_ids(parents))

    largest = max((f.count_rows() for f in src.get_fragments()), default=0)
    per_task = max_rows_per_task or fit_to_fragments(task_rows(n, state.seconds_per_row, parallelism), largest)
    where = _place(view, src, view_ds, f"chunker|{v0}|{how}|{scope}", per_task, checkpoint_size,
                   balanced=max_rows_per_task is None)
    tasks = where.tasks(pieces_from_rows(_ids(parents, "_rowaddr"), _ids(parents), where.max_rows_per_task)) if n else []
    reuse_by_fragment = _reuse_by_fragment(reuse, parents)
    for t in tasks:
        t.view_version = view_ds.version
        rows = [r for f in dict.fromkeys(t.fragment_ids) for r in reuse_by_fragment.get(f, [])]
        t.reuse_rows = rows or None
    copied = len({int(p) for p, _ in reuse})
    return RefreshPlan(
        view=view.name, source=definition.source, from_version=v0, to_version=src.version,
        view_version=view_ds.version, full=how == "full", reason=start.reason, rows_to_insert=int(len(keys.insert)),
        rows_to_update=int(len(keys.update)), rows_to_delete=int(len(keys.delete)),
        udf_rows={chunker.name: n - copied}, tasks=tasks, keys=keys,
        view_key_addrs=(_ids(vk, SOURCE_ROW_ID), _ids(vk, "_rowaddr")),
        checkpoint_dir=where.checkpoint_dir, definition_raw=definition.encode(), load_number=state.load_number,
        scope=scope, scoped_since_whole=state.scoped_since_whole, seconds_per_row=state.seconds_per_row,
        source_id=start.source_id, repaired=start.foreign is not None, read_fields=start.read_fields,
    )


def _changes(view_ds: lance.LanceDataset, src: lance.LanceDataset, definition, how: str, v0: int | None,
             scope_frags: list | None, moved: list | None = None):
    """The key plan (by parent), the parents to compute (ids, addresses), the
    view rows to reuse ``[(parent id, view row id)]`` and the view's rows of
    the parents the plan touches (their keys and addresses, for the deletions)."""
    empty = np.empty(0, np.int64)
    if how == "full":
        parents = _scan(src, definition.filter, with_version=False)
        vk = view_ds.to_table(columns=[SOURCE_ROW_ID], with_row_address=True)
        held = np.unique(_ids(vk, SOURCE_ROW_ID))
        ids = _ids(parents)
        in_view = isin(ids, held)
        return KeyPlan(ids[~in_view], ids[in_view], held[~isin(held, ids)]), parents, [], vk
    parents, touched = _no_rows([]), empty  # (the sync branch below reads both)
    if how == "incremental":
        assert v0 is not None
        since = f"_row_last_updated_at_version > {int(v0)}"
        if moved is not None and not moved:  # deletes only: no parent was written
            parents = _no_rows([])
            changed = empty
        else:
            parents = _scan(src, and_filters(since, definition.filter), moved)
            changed = _ids(_scan(src, since, moved, with_version=False)) if definition.filter else _ids(parents)
        deleted = (_ids(src.delta(begin_version=v0, end_version=src.version).get_deleted_row_ids().read_all())
                   if src.version > v0 else empty)
        touched = np.concatenate([changed, deleted])
    # the children's parent keys (and, to compare, their versions); row ids (for the digests of
    # the touched ones) only when some parent may be copied
    columns = [SOURCE_ROW_ID] + ([SOURCE_ROW_VERSION] if how != "incremental" else [])
    streamed = ViewKeys(view_ds, columns, with_row_id=how != "incremental" or parents.num_rows > 0)
    feed = deleted_since(src, v0) if how != "incremental" and scope_frags is not None else None
    in_scope = empty
    if how != "incremental":  # sync: every passing parent (in scope), and every row in scope
        parents = _scan(src, definition.filter, scope_frags)
        if scope_frags is not None:
            in_scope = _ids(_scan(src, None, scope_frags, with_version=False))
    if how == "incremental":  # only the children of the parents that changed: streamed, those kept
        vk = streamed.touching(touched)
    elif feed is not None:
        # fragment-scoped with the change feed: the children of the parents in scope, and of
        # those deleted anywhere (since v0, or brought in by scoped refreshes since and gone)
        assert v0 is not None
        vk = streamed.touching(np.concatenate([in_scope, feed, _gone_since(view_ds, src, v0, feed)]))
    else:  # every child: a sync of the whole view, or no change feed to read
        vk = view_ds.to_table(columns=columns, with_row_id=streamed.with_row_id, with_row_address=True)
    view_keys = _ids(vk, SOURCE_ROW_ID)
    if how != "incremental":  # sync: the parents against the view's children
        ids, vers = _ids(parents), _ids(parents, ROW_VERSION_ALIAS)
        pos = positions(ids, view_keys)  # one child of each parent the view holds
        has = pos >= 0
        # a parent is current when its children (written together: one version) carry its version
        holds = has & (_ids(vk, SOURCE_ROW_VERSION)[np.where(has, pos, 0)] == vers) if has.any() else has
        scoped = scoped_since_whole(view_ds)
        current = holds
        if not any(s > src.version for s in scoped.values()):
            # (a refresh to a version before a scoped refresh's: that one removed the children of
            # parents deleted after it, which this version holds, so a parent without children
            # may be one of them: every such parent is chunked again)
            current = holds | processed_without_children(vers, has, v0, _ids(parents, "_rowaddr") >> 32, scoped)
        parents = parents.filter(pa.array(~current))
        if scope_frags is not None:
            # (the view's rows whose parent is gone anywhere: from the change feed, no scan of the source's ids)
            elsewhere = gone_rows(src, view_keys, _ids(vk, SOURCE_ROW_VERSION), v0, feed)
            gone = np.concatenate([in_scope[~isin(in_scope, ids)], view_keys[elsewhere]])
        else:
            gone = view_keys[~isin(view_keys, ids)]
        touched = np.concatenate([_ids(parents), gone])
    if how != "incremental":  # (streamed: only touched parents' children were kept already)
        mask = isin(view_keys, touched)
        vk = vk.filter(pa.array(mask))
    if vk.num_rows and "_rowid" in vk.column_names:
        digests = take_rows(view_ds, _ids(vk, "_rowid").tolist(), [CHUNK_INPUTS]).column(CHUNK_INPUTS)
        vk = vk.append_column(CHUNK_INPUTS, digests)
    held = np.unique(_ids(vk, SOURCE_ROW_ID))
    compute = _ids(parents)
    in_view = isin(compute, held)
    keys = KeyPlan(np.sort(compute[~in_view]), np.sort(compute[in_view]), held[~isin(held, compute)])
    reuse = _reusable(src, definition, parents.filter(pa.array(in_view)), vk) if in_view.any() else []
    return keys, parents, reuse, vk


def _reusable(src: lance.LanceDataset, definition, updated: pa.Table, vk: pa.Table) -> list[tuple[int, int]]:
    """``[(parent id, view row id)]`` of children whose parent was updated but
    whose chunker inputs are what they were made from: copied, not chunked."""
    if updated.num_rows == 0:
        return []
    inputs = list(definition.table_function.input_columns)
    ids = _ids(updated)
    now = take_rows(src, [int(i) for i in ids], inputs)
    digests = dict(zip(ids.tolist(), input_digests(now, inputs).to_pylist(), strict=True))
    out = []
    for key, digest, row_id in zip(_ids(vk, SOURCE_ROW_ID).tolist(), vk.column(CHUNK_INPUTS).to_pylist(),
                                   _ids(vk, "_rowid").tolist(), strict=True):
        if digests.get(key) == digest:
            out.append((key, row_id))
    return out


def _reuse_by_fragment(reuse: list[tuple[int, int]], parents: pa.Table) -> dict[int, list[int]]:
    """The view rows to reuse, by the source fragment of their parent (a task reads whole fragments' pieces)."""
    if not reuse:
        return {}
    frag_of = dict(zip(_ids(parents).tolist(), (_ids(parents, "_rowaddr") >> 32).tolist(), strict=True))
    out: dict[int, list[int]] = {}
    for parent, row in reuse:
        out.setdefault(int(frag_of[parent]), []).append(int(row))
    return out

