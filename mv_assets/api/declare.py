"""Views declared in code, reconciled with the catalog.

A user module defines ``views(db) -> {name: query}`` (see docs/dagster.md).
:func:`reconcile` says, without writing anything, how the catalog differs
from that code; :func:`apply` makes the catalog match: it creates missing
views, swaps the UDF of columns whose code changed (``alter_columns``: their
rows become stale, values stay until recomputed) and adds new UDF columns.
Changes to what rows a view holds (source, filter, plain or SQL columns) are
refused: the view has to be dropped and created again.

A value of ``views(db)`` is a query, or a :class:`DeclaredView` (the query
with its asset owners and tags, and maybe its refresh policy): then the code
is the truth for those too, and :func:`apply` writes them to the view when
they differ.
"""

import hashlib
import importlib
import importlib.util
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mv_assets.api.query import Query, function_view_definition
from mv_assets.model.definition import VIEW_METADATA_KEY, ViewDefinition, shape_fingerprint
from mv_assets.model.ownership import OWNERSHIP_METADATA_KEY, Ownership
from mv_assets.model.policy import BUILD_HINT, POLICY_METADATA_KEY, RefreshPolicy

if TYPE_CHECKING:
    from mv_assets.api.catalog import Connection

__all__ = ["Reconcile", "DeclaredView", "load_declared", "reconcile", "apply"]


@dataclass
class Reconcile:
    """How the catalog differs from the code for one view."""

    name: str
    create: bool = False
    altered: list[str] = field(default_factory=list)  # UDF columns whose code changed
    added: list[str] = field(default_factory=list)  # UDF columns new in the code
    problems: list[str] = field(default_factory=list)  # differences apply() refuses
    ownership: bool = False  # the owners or tags declared differ from the stored ones
    policy: bool = False  # the refresh policy declared differs from the stored one

    @property
    def in_sync(self) -> bool:
        return not (self.create or self.altered or self.added or self.problems or self.ownership or self.policy)


class DeclaredView:
    """A view declared in code with its Dagster asset owners (``["team:ml",
    "alice@example.com"]``) and tags (``{"domain": "search"}``): a value
    ``views(db)`` may return instead of a bare query. Validated when built
    (``ValueError``), before anything is written. ``refresh_policy``: the
    view's, when the code says it (None: the catalog's is kept; eager for a
    view created from the code). ``function``: a ``@chunker`` or ``@udtf``
    making the view's rows from the query's (a chunk or table-function view,
    as ``create_udtf_view`` makes)."""

    def __init__(self, query: Query, *, owners: list[str] | None = None, tags: dict[str, str] | None = None,
                 refresh_policy: RefreshPolicy | None = None, function: Any = None, name: str = "declared"):
        if not isinstance(query, Query):
            raise ValueError(f"DeclaredView() needs a query (table.search(None)...), got {type(query).__name__}")
        if refresh_policy is not None and not isinstance(refresh_policy, RefreshPolicy):
            raise ValueError(f"DeclaredView(refresh_policy=) takes a RefreshPolicy, got {refresh_policy!r}: {BUILD_HINT}")
        from mv_assets.model.chunker import UDTF, Chunker

        if function is not None and not isinstance(function, Chunker | UDTF):
            raise ValueError(f"DeclaredView(function=) takes a @chunker or @udtf, got {type(function).__name__}")
        self.query = query
        self.ownership = Ownership.of(owners, tags)
        self.refresh_policy = refresh_policy
        self.function = function
        self.to_definition(name)  # (refused now, in words)

    def to_definition(self, name: str = "declared") -> ViewDefinition:
        if self.function is not None:
            return function_view_definition(self.query, self.function, name)
        return self.query.to_definition()


def load_declared(spec: str, db: "Connection") -> dict[str, Query | DeclaredView]:
    """Call ``views(db)`` of a module given by dotted name or ``.py`` path."""
    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec)
        name = "mv_assets_declared_" + hashlib.sha256(path.encode()).hexdigest()[:8]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot load views module {spec!r}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(spec)
    func = getattr(module, "views", None)
    if not callable(func):
        raise ValueError(f"views module {spec!r} has no views(db) function returning {{name: query}}")
    declared = func(db)
    if not isinstance(declared, dict) or not all(isinstance(q, Query | DeclaredView) for q in declared.values()):
        raise ValueError(f"{spec}.views(db) must return a dict of view name -> query (table.search(None)...) or "
                         "DeclaredView(query, owners=..., tags=...)")
    return declared


def _stored(db: "Connection", name: str) -> dict | None:
    md = db.open_table(name).schema.metadata or {}
    raw = md.get(VIEW_METADATA_KEY.encode())
    return json.loads(raw) if raw is not None else None


def reconcile(db: "Connection", name: str, query: Query | DeclaredView | ViewDefinition,
              ownership: Ownership | None = None, policy: RefreshPolicy | None = None) -> Reconcile:
    """Compare the declared query (or its definition) with the stored view (no
    UDF is unpickled, and none pickled). ``ownership``: the owners and tags
    declared (a DeclaredView's); None: the code says nothing of them. The same
    for ``policy``, the refresh policy."""
    out = Reconcile(name)
    if isinstance(query, DeclaredView):  # (its definition: with its function, if it has one)
        ownership, policy = ownership or query.ownership, policy or query.refresh_policy
        query = query.to_definition(name)
    if name not in db:
        out.create = True
        return out
    stored = _stored(db, name)
    if stored is None:
        out.problems.append(f"{name!r} is a table in the catalog, not a view")
        return out
    if ownership is not None:
        md = db.open_table(name).schema.metadata or {}
        out.ownership = Ownership.from_json(md.get(OWNERSHIP_METADATA_KEY.encode())) != ownership
    if policy is not None:
        md = db.open_table(name).schema.metadata or {}
        out.policy = RefreshPolicy.from_json(md.get(POLICY_METADATA_KEY.encode())) != policy
    declared = query.to_definition() if isinstance(query, Query) else query
    declared_cols = {c.name: c for c in declared.columns}
    stored_cols = {c["name"]: c for c in stored["columns"]}
    # the shape leaves UDF columns out: build it without them (no UDF pickled)
    plain = tuple(c for c in declared.columns if c.kind != "udf")
    code = ViewDefinition(declared.source, plain, declared.filter, declared.shuffle, declared.seed, declared.limit,
                          declared.function).to_json()
    for c in code["columns"]:  # columns added after creation are marked so in the catalog only
        if stored_cols.get(c["name"], {}).get("added"):
            c["added"] = True
    if shape_fingerprint(code) != shape_fingerprint(stored):
        out.problems.append(
            f"the declared source, filter, limit or plain columns of {name!r} differ from the stored view; "
            f"drop it (db.drop_table({name!r})) to create it again from the code"
        )
    for col_name, col in declared_cols.items():
        if col.kind != "udf":
            continue
        old = stored_cols.get(col_name)
        if old is None:
            out.added.append(col_name)
        elif old["kind"] != "udf":
            out.problems.append(f"column {col_name!r} of {name!r} is a UDF in the code but not in the stored view")
        elif old["udf"]["fingerprint"] != col.udf.fingerprint:  # type: ignore[union-attr]
            if old["udf"]["data_type"] != str(col.udf.data_type):  # type: ignore[union-attr]
                out.problems.append(
                    f"UDF column {col_name!r} of {name!r} changed type from {old['udf']['data_type']} to "
                    f"{col.udf.data_type}: drop and create the view again"  # type: ignore[union-attr]
                )
            else:
                out.altered.append(col_name)
    for col_name, old in stored_cols.items():
        if old["kind"] == "udf" and col_name not in declared_cols:
            out.problems.append(f"UDF column {col_name!r} of {name!r} is no longer declared; drop and create the view again")
    return out


def apply(db: "Connection", name: str, query: Query | DeclaredView, **create_kwargs: Any) -> Reconcile:
    """Make the catalog match the declared query (see the module docstring)."""
    diff = reconcile(db, name, query)
    if diff.problems:
        raise ValueError("; ".join(diff.problems))
    ownership = query.ownership if isinstance(query, DeclaredView) else None
    policy = query.refresh_policy if isinstance(query, DeclaredView) else None
    function = query.function if isinstance(query, DeclaredView) else None
    declared: ViewDefinition = query.to_definition(name) if isinstance(query, DeclaredView) else query.to_definition()
    query = query.query if isinstance(query, DeclaredView) else query
    if diff.create:
        if ownership is not None:
            create_kwargs = {"owners": list(ownership.owners), "tags": ownership.tags, **create_kwargs}
        if policy is not None:
            create_kwargs = {"refresh_policy": policy, **create_kwargs}
        if function is not None:
            db.create_udtf_view(name, query, function, **create_kwargs)
        else:
            db.create_materialized_view(name, query, **create_kwargs)
        return diff
    specs = {c.name: c for c in declared.columns}
    view = db.open_table(name)
    if diff.ownership and ownership is not None:
        view.set_owners(list(ownership.owners))  # type: ignore[attr-defined]  (a view: reconcile said so)
        view.set_tags(ownership.tags)  # type: ignore[attr-defined]
    if diff.policy and policy is not None:
        view.set_refresh_policy(policy)  # type: ignore[attr-defined]
    if diff.altered:
        view.alter_columns(*({"path": c, "udf": specs[c].udf} for c in diff.altered))
    if diff.added:
        view.add_columns({c: specs[c].udf for c in diff.added})
    return diff
