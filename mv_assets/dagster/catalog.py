"""What the wiring knows of a catalog: the engine's descriptions
(:meth:`Connection.describe`, stored metadata only: no UDF is unpickled and no
JVM starts) with the lineage and the views declared in code on top."""

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from mv_assets.api.catalog import Connection
from mv_assets.api.declare import DeclaredView, Reconcile, reconcile
from mv_assets.api.describe import TableDescription
from mv_assets.model.definition import definition_reads
from mv_assets.model.join_view import JOIN_KIND, Join
from mv_assets.model.kinds import kind_of
from mv_assets.model.ownership import Ownership
from mv_assets.model.policy import RefreshPolicy

__all__ = ["TableInfo", "catalog_tables"]

log = logging.getLogger(__name__)

@dataclass
class TableInfo:
    """A table or view as the Dagster wiring sees it."""

    name: str
    uri: str
    is_view: bool
    source: str | None = None
    filter: str | None = None
    limit: int | None = None
    columns: list[dict] = field(default_factory=list)
    policy: RefreshPolicy = field(default_factory=RefreshPolicy)
    schema: list[tuple[str, str]] = field(default_factory=list)  # visible (name, type) pairs
    reads: list[str] = field(default_factory=list)  # computed / UDF columns of the source it reads
    root: str = ""  # the base table at the start of the lineage
    over_view: bool = False  # the source is itself a view
    definition: dict = field(default_factory=dict, repr=False)  # the stored view definition (JSON)
    declared: Any = field(default=None, repr=False)  # the query declaring it in code (code-first views)
    declared_definition: Any = field(default=None, repr=False)  # its ViewDefinition, derived once at load
    code_changes: Any = field(default=None, repr=False)  # how the catalog differs from that code
    row_columns: list[dict] = field(default_factory=list)  # a chunk view's columns computed from its rows
    ownership: Ownership = field(default_factory=Ownership)  # a view's asset owners and tags
    # a join view: the computed columns of each joined source it reads (assets of their own)
    joined_reads: dict[str, list[str]] = field(default_factory=dict)
    # a join view: the base tables at the start of its joined sources' lineages (their sensors refresh it too)
    watchers: list[str] = field(default_factory=list)
    # its asset is partitioned (by its root's fragments): a view, or a base table with views or computed columns
    partitioned: bool = False

    @property
    def source_name(self) -> str:
        """The source of a view (ValueError for a base table)."""
        if self.source is None:
            raise ValueError(f"{self.name!r} is a table: it has no source")
        return self.source

    @property
    def udf_columns(self) -> list[dict]:
        return [c for c in self.columns if c["kind"] == "udf"]

    @property
    def scoped(self) -> bool:
        """Whether a partition (source fragment) can be refreshed on its own:
        views over a base table without a limit (chunk views too: a fragment's
        parents). Others (views over views, limited views, table-function,
        aggregate and join views) refresh as a whole whatever partitions a run names."""
        # a table-function view's partitions are its partition_by values, an aggregate view's rows are
        # groups, a join view's rows come from rows of every source: none maps to first-source fragments
        return (self.is_view and self.limit is None and not self.over_view
                and kind_of(self.definition).by_fragment)

    @property
    def join(self) -> Join | None:
        """A join view's stored join (None for other tables and views)."""
        function = self.definition.get("function") or {}
        return Join.from_spec(function) if function.get("kind") == JOIN_KIND else None

    @property
    def sources(self) -> list[str]:
        """Every table or view it reads: a join view's sources (the first one
        its ``source``), another view's source; none for a base table."""
        join = self.join
        if join is not None:
            return list(dict.fromkeys(join.sources))  # (a self-join reads its table once)
        if self.kind == "join_aggregate":  # its join's tables (the join kept under it is the engine's)
            return kind_of(self.definition).sources_of(self.definition)
        return [self.source] if self.source is not None else []

    @property
    def joined(self) -> list[str]:
        """A join view's joined sources (all but the first; a table joined with
        itself is not joined apart from it); [] for anything else."""
        return self.sources[1:] if self.join is not None or self.kind == "join_aggregate" else []

    @property
    def kind(self) -> str:
        """A view's kind ("query", "chunker", "udtf", "aggregate", "join"); "table" for a base table."""
        if not self.is_view:
            return "table"
        return (self.definition.get("function") or {}).get("kind") or "query"

    @property
    def computed(self) -> list[str]:
        """Columns other views can depend on as assets of their own."""
        return [c["name"] for c in (self.udf_columns + self.row_columns if self.is_view else self.columns)]


def _info(d: TableDescription) -> TableInfo:
    source = d.source
    if d.is_view and kind_of(d.definition).name == "join_aggregate":  # (its first table, as its users see it)
        source = kind_of(d.definition).sources_of(d.definition)[0]
    return TableInfo(
        d.name, d.uri, d.is_view, source, d.filter, d.limit, list(d.columns), d.policy, list(d.schema),
        list(d.reads), root=d.name if not d.is_view else "", definition=d.definition, row_columns=list(d.row_columns),
        ownership=d.ownership,
    )


def _declare(out: dict[str, "TableInfo"], names: dict[str, list[str]], db: Connection, declared: dict) -> None:
    """Overlay views declared in code: their UDF columns (and so code versions)
    come from the code; views not created yet are described from the query."""
    for name, query in declared.items():
        definition = query.to_definition()
        ownership = query.ownership if isinstance(query, DeclaredView) else None  # None: the code says nothing
        policy = query.refresh_policy if isinstance(query, DeclaredView) else None
        diff = reconcile(db, name, definition, ownership, policy)
        if diff.create:
            try:
                described = db.describe_query(name, definition)
            except ValueError as exc:
                # the query cannot be built over its source as it is (say, a table without
                # stable row ids): that view is not loaded, every other asset is
                problem = f"view {name!r} declared in code is not loaded: {exc}"
                log.warning(problem)
                src = out.get(definition.source)
                if src is not None:
                    before = src.code_changes.problems if src.code_changes is not None else []
                    src.code_changes = Reconcile(definition.source, problems=[*before, problem])
                continue
            info = out[name] = _info(described)
            names[name] = described.field_names
        elif not out[name].is_view:
            # the name is taken by a base table: the declared view cannot be loaded. Said
            # at load, and in the table's asset description (where views show theirs)
            problem = (
                f"view {name!r} declared in code is not loaded: {name!r} is a table in the catalog; "
                "rename the view in the code or drop the table"
            )
            log.warning(problem)
            out[name].code_changes = Reconcile(name, problems=[problem])
            continue
        else:
            info = out[name]
            # (its JSON as encoded when to_definition() validated it: the UDFs are not pickled again)
            code = {c["name"]: c for c in json.loads(definition.encode())["columns"]}
            info.columns = [code.get(c["name"], c) if c["kind"] == "udf" else c for c in info.columns]
            info.columns += [code[c] for c in diff.added]
        info.declared, info.declared_definition, info.code_changes = query, definition, diff
        for problem in diff.problems:  # (said at load too: a run applying the code refuses it)
            log.warning(f"view {name!r} declared in code cannot be applied: {problem}")
        if ownership is not None:  # the code is the truth for owners and tags too
            info.ownership = ownership
        if policy is not None:  # and for the refresh policy it declares
            info.policy = policy


def catalog_tables(db: Connection, declared: dict | None = None,
                   unreadable: dict[str, str] | None = None) -> dict[str, TableInfo]:
    """Every table and view of ``db`` with its lineage; ``declared`` (name ->
    query) overlays views declared in code (see :mod:`mv_assets.declare`).
    Datasets that cannot be read are left out, with the reason in ``unreadable``
    (name -> why): the others still load."""
    unreadable = {} if unreadable is None else unreadable
    described = db.describe(unreadable=unreadable)
    for name, why in sorted(unreadable.items()):  # (`mv-assets status` lists it too)
        log.warning(f"{name!r} of catalog {db.uri} is left out of the lineage (shown as UNREADABLE): {why}")
    out = {name: _info(d) for name, d in described.items()}
    names = {name: d.field_names for name, d in described.items()}
    if declared:
        _declare(out, names, db, declared)
    for info in out.values():
        if not info.is_view or info.source not in out:
            continue
        src = out[info.source]
        info.over_view = src.is_view
        join = info.join
        if join is not None:  # the computed columns of each source it reads (Join.reads: keys, names used)
            reads: dict[str, list[str]] = {}
            for i, s in enumerate(join.sources):  # (a table joined with itself: what each occurrence reads)
                reads[s] = list(dict.fromkeys(reads.get(s, []) + [c for c in join.reads(i)
                                                                   if s in out and c in out[s].computed]))
            info.reads = reads[info.source]
            info.joined_reads = {s: reads[s] for s in dict.fromkeys(join.sources[1:]) if s in out}
        elif src.is_view:  # which UDF columns of the upstream view it reads
            info.reads = definition_reads(info.definition, src.computed, names[src.name])
        else:  # a table's computed columns it reads, whatever its kind (only a query view keeps copies of
            # their markers: an aggregate's were none, so it was no downstream of their assets, and a run
            # backfilling one refreshed it at the version before the backfill)
            info.reads = list(dict.fromkeys([*info.reads, *definition_reads(info.definition, src.computed,
                                                                             names[src.name])]))
        root, seen = src, {info.name}
        while root.is_view and root.source in out and root.name not in seen:
            seen.add(root.name)
            root = out[root.source]
        info.root = root.name
    rooted = {info.root for info in out.values() if info.is_view and info.root}
    for info in out.values():  # (every root known now)
        info.watchers = list(dict.fromkeys(out[s].root for s in info.joined if s in out and out[s].root))
        info.partitioned = bool(info.root) if info.is_view else bool(info.columns) or info.name in rooted
    return out
