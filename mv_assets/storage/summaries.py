"""What each dataset of a catalog is, remembered across processes, so a new
process (the definitions load, ``mv-assets status``) pays one listing for a
table that did not change instead of a listing and a manifest read.

A view's definition is in its schema's metadata, so telling views from tables
meant reading every dataset's newest manifest. This file keeps, per dataset:

- a table: its newest manifest's name and *stamp* (size and e-tag on an object
  store; size, inode and modification time on a local disk) with what was read
  from that manifest (version, identity, columns, visible schema). An entry is
  used only while the listing of the table's ``_versions/`` still shows that
  same object as the newest: any commit, by any tool, writes a new manifest,
  and a table dropped and created again has new objects, so a stale entry is
  never served, only missed;
- a view: only that it is one, so it is opened without a listing of ours
  first (its status and description need its newest commit whatever this file
  says); a name that stopped being a view is seen when it is opened. A name
  the file does not know is opened the same way, and only its kind learned.

The file is a cache: written whole, last writer wins, read once per call. A
missing, damaged or foreign file is an empty one, and a write that fails is
ignored: nothing here is ever the only copy of anything.
"""

import json
import logging
import threading
from dataclasses import dataclass

from mv_assets.storage import objects

__all__ = ["Newest", "Summaries", "manifest_version", "newest_manifest"]

log = logging.getLogger(__name__)

FORMAT = 1
_V2_OFFSET = 2**64 - 1  # Lance's V2 manifest names: u64::MAX - version, 20 digits


@dataclass(frozen=True)
class Newest:
    """A dataset's newest manifest, as its ``_versions/`` listing shows it."""

    version: int
    name: str
    stamp: str


def manifest_version(name: str) -> int | None:
    """The version a file of ``_versions/`` holds the manifest of (Lance's V1
    names ``<version>.manifest`` and V2 names ``<u64::MAX - version>.manifest``,
    20 digits); None for any other file (detached versions, temporary files)."""
    stem, _, ext = name.partition(".")
    if ext != "manifest" or not stem.isdigit():
        return None
    n = int(stem)
    return _V2_OFFSET - n if len(stem) == 20 and n >= 2**63 else n


def newest_manifest(uri: str) -> Newest | None:
    """The newest manifest of the dataset at ``uri`` (None: no dataset there,
    or a creation that never committed): one listing."""
    found = [(v, n, s) for n, s in objects.stamped(objects.join(uri, "_versions"))
             if (v := manifest_version(n)) is not None]
    if not found:
        return None
    return Newest(*max(found))


@dataclass(frozen=True)
class TableSummary:
    """What a table's newest manifest said (the parts the catalog's
    description and a view's status ask for)."""

    version: int
    table_id: str | None
    columns: list
    schema: list
    field_names: list


class Summaries:
    """The catalog's remembered datasets (``<root>/_mv_assets/summaries.json``):
    read once when made, written back once by :meth:`save` if something new
    was learned. Safe to use from several threads."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._lock = threading.Lock()
        self._learned = False
        self._entries: dict[str, dict] = {}
        try:
            raw = objects.get_bytes(uri)
            doc = json.loads(raw) if raw else {}
            if isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("datasets"), dict):
                self._entries = doc["datasets"]
        except Exception as exc:  # damaged or unreadable: as if empty (a cache, never the only copy)
            log.debug("ignoring the catalog's summaries at %s: %s", uri, exc)

    def is_table(self, name: str) -> bool:
        """Whether ``name`` was a table when last seen: worth listing its
        versions first (an unchanged one is then served from here). A name
        never seen is opened as it was before there were summaries (its
        listing and its manifest), and only its kind is remembered: with
        credentials that cannot write the file, nothing costs more."""
        with self._lock:
            return (self._entries.get(name) or {}).get("kind") == "table"

    def table(self, name: str, newest: Newest) -> TableSummary | None:
        """What table ``name``'s manifest said, if ``newest`` is still the one it was read from."""
        with self._lock:
            e = self._entries.get(name)
        if not e or e.get("kind") != "table" or e.get("manifest") != [newest.name, newest.stamp]:
            return None
        try:
            return TableSummary(int(e["version"]), e.get("table_id"), list(e["columns"]),
                                [tuple(f) for f in e["schema"]], list(e["field_names"]))
        except (KeyError, TypeError, ValueError):
            return None

    def learn_table(self, name: str, newest: Newest, summary: TableSummary) -> None:
        entry = {"kind": "table", "manifest": [newest.name, newest.stamp], "version": summary.version,
                 "table_id": summary.table_id, "columns": summary.columns,
                 "schema": [list(f) for f in summary.schema], "field_names": summary.field_names}
        self._learn(name, entry)

    def learn_kind(self, name: str, is_view: bool) -> None:
        """Remember that ``name`` is a view or a table (a table's manifest, not listed, is not)."""
        with self._lock:
            if (self._entries.get(name) or {}).get("kind") == ("view" if is_view else "table"):
                return  # (what is known of it stays)
        self._learn(name, {"kind": "view" if is_view else "table"})

    def forget(self, name: str) -> None:
        with self._lock:
            if self._entries.pop(name, None) is not None:
                self._learned = True

    def _learn(self, name: str, entry: dict) -> None:
        with self._lock:
            if self._entries.get(name) != entry:
                self._entries[name] = entry
                self._learned = True

    def save(self, names: list[str] | None = None) -> None:
        """Write back what was learned (best effort), keeping only ``names``
        (the catalog's listing) when given: dropped datasets are forgotten."""
        with self._lock:
            if names is not None:
                listed = set(names)
                kept = {n: e for n, e in self._entries.items() if n in listed}
                self._learned |= len(kept) != len(self._entries)
                self._entries = kept
            if not self._learned:
                return
            body = json.dumps({"format": FORMAT, "datasets": self._entries}, separators=(",", ":")).encode()
            self._learned = False
        try:
            objects.put_bytes(self.uri, body, durable=False)
        except Exception as exc:  # a cache: the next call learns it again
            log.debug("could not write the catalog's summaries at %s: %s", self.uri, exc)
