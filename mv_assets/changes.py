"""What changed in a table between two versions, by fragment.

Used by the Dagster sensors (one partition per source fragment), but plain
engine code: no dagster import. Cost is proportional to the number of
fragments (metadata) plus the rows that changed, never to the table size.
"""

from dataclasses import dataclass, field

import lance
import numpy as np

__all__ = ["FragmentChanges", "fragment_changes"]


@dataclass
class FragmentChanges:
    """Fragment-level changes of a table since a version.

    * ``fragments``: every fragment id at ``version``.
    * ``added``: fragment ids that are not yet known partitions.
    * ``retired``: known partitions whose fragment is gone (compaction, or all
      rows moved by updates); their rows live on in other fragments.
    * ``changed``: fragments holding rows inserted or updated since the
      cursor, or whose deletion vector grew.
    """

    version: int
    since: int | None
    fragments: list[int] = field(default_factory=list)
    added: list[int] = field(default_factory=list)
    retired: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)

    @property
    def to_refresh(self) -> list[int]:
        """Partitions a refresh should cover: added or changed, still existing."""
        present = set(self.fragments)
        return sorted((set(self.added) | set(self.changed)) & present)


def _deletion_counts(ds: lance.LanceDataset) -> dict[int, int]:
    out = {}
    for frag in ds.get_fragments():
        deletion = frag.metadata.deletion_file
        out[frag.fragment_id] = deletion.num_deleted_rows if deletion is not None else 0
    return out


def fragment_changes(uri: str, since: int | None, known: set[int] | list[int], version: int | None = None) -> FragmentChanges:
    """Compare the table at ``version`` (default latest) with version ``since``."""
    ds = lance.dataset(uri, version=version)
    known_set = {int(k) for k in known}
    now_dels = _deletion_counts(ds)
    fragments = sorted(now_dels)
    result = FragmentChanges(version=ds.version, since=since, fragments=fragments)
    result.added = [f for f in fragments if f not in known_set]
    result.retired = sorted(known_set - set(fragments))
    if since is None:
        result.changed = list(fragments)
        return result
    if since >= ds.version:
        return result
    rows = ds.to_table(columns=[], filter=f"_row_last_updated_at_version > {int(since)}", with_row_address=True)
    changed = set()
    if rows.num_rows:
        changed |= {int(f) for f in np.unique(rows.column("_rowaddr").to_numpy() >> 32)}
    try:
        old_dels = _deletion_counts(lance.dataset(uri, version=since))
    except (ValueError, OSError):  # the old version was cleaned up: treat everything as changed
        old_dels = {}
        changed |= set(fragments)
    changed |= {f for f, n in now_dels.items() if n > old_dels.get(f, 0) and f in old_dels}
    changed |= _backfilled_fragments(ds, since) & set(fragments)
    result.changed = sorted(changed)
    return result


def _backfilled_fragments(ds: lance.LanceDataset, since: int) -> set[int]:
    """Fragments whose computed columns a backfill rewrote after ``since``: it
    moves no row versions, but views reading those columns must look."""
    from .refresh import backfill_commits

    return {
        int(f.id) for _, txn in backfill_commits(ds, since, ds.version)
        for f in getattr(txn.operation, "updated_fragments", [])
    }
