"""A view's refresh state: the source version it reflects, its load number,
definition and whether fragment-scoped refreshes happened since the last whole
refresh. It is stored in the transaction properties of the view's refresh
commits (atomic with the data it describes); this module reads it, and
carries it forward when compaction or cleanup would otherwise lose it.
"""

import json
from dataclasses import dataclass

import lance
from lance import LanceOperation, Transaction

from mv_assets.storage import objects
from mv_assets.storage.changes import STATE_KEY

__all__ = ["RefreshState", "read_refresh_state", "carry_refresh_state"]


@dataclass(frozen=True)
class RefreshState:
    """What the view's last refresh recorded (None fields: never refreshed)."""

    source_version: int | None = None
    view_version: int | None = None  # the view version that recorded it
    definition: str | None = None
    load_number: int = 0
    refreshed_at: float | None = None
    node: str | None = None  # the host whose refresh committed it (None: not recorded)
    # A fragment-scoped refresh committed after the last whole refresh: the view
    # may hold rows (or row versions) of other source versions than
    # ``source_version``: the next whole refresh takes them into account
    # (model.planning.choose_how: incremental when they were all at versions in
    # between, else every row compared).
    scoped_since_whole: bool = False
    # the lowest and highest source version of those scoped refreshes (None:
    # none, or not recorded by the refreshes that made them)
    scoped_versions: tuple[int, int] | None = None
    # measured cost of the last refresh that computed rows: task seconds per row
    seconds_per_row: float | None = None
    # the identity of the source the view was built from (storage.identity;
    # None: recorded before identities were kept)
    source_id: str | None = None
    # Lance field ids of the source columns the view reads, when it last
    # refreshed: a column dropped and added again gets a new id (its values
    # changed without any row version moving)
    read_fields: dict[str, int] | None = None
    # the largest fragment id of the source at the version the newest refresh
    # reflects (ids only grow: fragments above it were written since)
    source_top_fragment: int | None = None
    # a view of several sources (a join view): the version of each source
    # (by name) and each source's identity, as its newest refresh recorded them
    sources: dict[str, int] | None = None
    source_ids: dict[str, str | None] | None = None
    # a join view: the Lance field ids of the columns it reads of each source (by name), as its newest
    # refresh read them (a column renamed or dropped and added again has another id: rebuilt)
    source_fields: dict[str, dict[str, int]] | None = None
    # a join view's newest refresh: the arrangements its plan probed (name -> what was done, seconds)
    arrangements: dict[str, dict] | None = None

    @property
    def refreshed(self) -> bool:
        return self.source_version is not None


def read_refresh_state(view_ds: lance.LanceDataset) -> RefreshState:
    """The view's refresh state, read from its commits' transaction properties.

    ``source_version`` comes from the newest refresh of the whole view (a
    fragment-scoped refresh does not make the whole view reflect a version;
    it carries the last whole one forward as ``whole_source_version``); the
    load number, time and definition from the newest refresh of any kind.
    """
    latest: dict | None = None
    v = view_ds.version
    while v >= 1:
        try:
            txn = objects.read_transaction(view_ds, v)
        except Exception:  # transaction file cleaned up: nothing older is readable either
            break
        props = (txn.transaction_properties or {}) if txn is not None else {}
        raw = props.get(STATE_KEY)
        if raw:
            d = json.loads(raw)
            if latest is None:
                latest = {**d, "view_version": v}
            whole = d.get("scope") is None
            if whole or "whole_source_version" in d:
                found = d["source_version"] if whole else d["whole_source_version"]
                return RefreshState(
                    source_version=None if found is None else int(found),
                    view_version=latest["view_version"],
                    definition=latest.get("definition"),
                    load_number=int(latest.get("load_number", 0)),
                    refreshed_at=latest.get("refreshed_at"),
                    node=latest.get("node"),
                    scoped_since_whole=latest.get("scope") is not None,
                    scoped_versions=_scoped_versions(latest),
                    seconds_per_row=latest.get("seconds_per_row"),
                    source_id=latest.get("source_id"),
                    read_fields=latest.get("read_fields"),
                    # recorded for the version this record reflects: only a newest whole refresh's is ours
                    source_top_fragment=latest.get("source_top_fragment") if whole and latest["view_version"] == v else None,
                    sources=latest.get("sources"),
                    source_ids=latest.get("source_ids"),
                    source_fields=latest.get("source_fields"),
                    arrangements=latest.get("arrangements"),
                )
        v -= 1
    if latest is None:
        return RefreshState()
    return RefreshState(
        source_version=None,
        view_version=latest["view_version"],
        definition=latest.get("definition"),
        load_number=int(latest.get("load_number", 0)),
        refreshed_at=latest.get("refreshed_at"),
        node=latest.get("node"),
        scoped_since_whole=True,
        source_id=latest.get("source_id"),
    )


def _scoped_versions(record: dict) -> tuple[int, int] | None:
    """The range of source versions a fragment-scoped refresh's record says
    the scoped refreshes since the last whole one were at."""
    found = record.get("scoped_versions") if record.get("scope") is not None else None
    if not isinstance(found, list) or len(found) != 2:
        return None
    return int(found[0]), int(found[1])


def scoped_since_whole(view_ds: lance.LanceDataset) -> dict[int, int]:
    """The source fragments fragment-scoped refreshes covered since the newest
    whole refresh, each with the newest source version it was refreshed to
    (every row in it then was processed)."""
    out: dict[int, int] = {}
    v = view_ds.version
    while v >= 1:
        try:
            txn = objects.read_transaction(view_ds, v)
        except Exception:
            break
        raw = ((txn.transaction_properties or {}) if txn is not None else {}).get(STATE_KEY)
        if raw:
            d = json.loads(raw)
            if d.get("scope") is None:
                break
            for f in d["scope"]:
                out[int(f)] = max(out.get(int(f), 0), int(d["source_version"]))
        v -= 1
    return out


# A view keeps few fragments: once more than this many hold fewer than half the
# target rows each, the refresh that made them compacts them (row ids, row
# versions and the order of rows are kept; readers see no change).


def carry_refresh_state(view_ds: lance.LanceDataset) -> int | None:
    """Make the view's newest commit carry its refresh state (a commit that
    changes nothing else), unless it already does. Returns the new version.

    Compaction and column backfills commit without the state; once history
    cleanup removed the refresh commit behind them, the view would forget
    which source version it reflects.
    """
    try:
        txn = view_ds.read_transaction(view_ds.version)
    except Exception:
        txn = None
    if txn is not None and STATE_KEY in (txn.transaction_properties or {}):
        return None
    state = read_refresh_state(view_ds)
    if state.view_version is None:
        return None  # never refreshed: nothing to carry
    newest = view_ds.read_transaction(state.view_version)
    props = (newest.transaction_properties or {}) if newest is not None else {}
    if STATE_KEY not in props:
        return None
    record = json.loads(props[STATE_KEY])
    if record.get("scope") is not None:
        record["whole_source_version"] = state.source_version
    record["carried_from"] = state.view_version
    carried = Transaction(
        read_version=view_ds.version,
        operation=LanceOperation.UpdateConfig(),
        transaction_properties={STATE_KEY: json.dumps(record)},
    )
    return objects.commit(view_ds.uri, carried, read_version=view_ds.version).version
