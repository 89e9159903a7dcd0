"""The catalog: a directory of Lance datasets, one per table or view."""

import contextlib
import contextvars
import datetime as dt
import json
import os
import re
import time
import typing
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

import pyarrow as pa

from mv_assets.api import geneva
from mv_assets.api.describe import TableDescription, describe_dataset, describe_definition
from mv_assets.api.query import Query, function_view_definition
from mv_assets.api.table import (
    PRIMARY_KEY_METADATA_KEY,
    MaterializedView,
    Table,
    check_primary_key,
    to_arrow_table,
    vectors_as_lancedb_makes_them,
)
from mv_assets.api.views import View, read_view_definition, remove_view, view_names, write_view_definition
from mv_assets.execution.spark import Runner, default_runner
from mv_assets.model.chunker import UDTF, Chunker
from mv_assets.model.definition import VIEW_METADATA_KEY, ViewDefinition, is_reserved_name, short_error
from mv_assets.model.errors import (
    CatalogNotFoundError,
    JobNotFoundError,
    SourceBehindError,
    TableExistsError,
    TableNotFoundError,
    UdfError,
)
from mv_assets.model.join_agg_view import hidden_join_refusal, in_users_words, is_join_under, join_under
from mv_assets.model.kinds import kind_of
from mv_assets.model.names import JOIN_UNDER_PREFIX
from mv_assets.model.ownership import OWNERSHIP_METADATA_KEY, Ownership
from mv_assets.model.policy import BUILD_HINT, POLICY_METADATA_KEY, RefreshPolicy
from mv_assets.model.volatility import check_deterministic
from mv_assets.ops.jobs import Job, process_jobs
from mv_assets.ops.refresh import RefreshResult
from mv_assets.storage import keys, objects
from mv_assets.storage.error_log import drop_errors, failures_unrecorded
from mv_assets.storage.identity import VIEW_ID_KEY, ensure_table_id, table_id
from mv_assets.storage.jobs import JobRecord, drop_job_records, job_record, job_records
from mv_assets.storage.layout import Layout
from mv_assets.storage.row_ids import (
    AdoptResult,
    adopt,
    finish_interrupted,
    is_legacy_format,
    require_current_format,
    require_stable_row_ids,
)
from mv_assets.storage.status import (
    ViewStatus,
    clear_load_state,
    load_record,
    pending_source_versions,
    recorded_views,
    status_table,
    unreadable_status,
    view_status,
)
from mv_assets.storage.summaries import Newest, Summaries, TableSummary, newest_manifest
from mv_assets.storage.threads import pool

__all__ = ["Connection", "connect", "validate_name"]


def _refuse_hidden(name: str) -> None:
    """The join kept under a join aggregate is never refreshed, planned or
    shown on its own: TableNotFoundError naming the aggregate."""
    refusal = hidden_join_refusal(name) if isinstance(name, str) else None
    if refusal is not None:
        raise TableNotFoundError(refusal)

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]{0,127}$")


def validate_new_name(name: str) -> str:
    """A name for a new table or view: :func:`validate_name`, and not one of the engine's."""
    validate_name(name)
    if name.startswith(JOIN_UNDER_PREFIX):
        raise ValueError(f"invalid table name {name!r}: names starting with {JOIN_UNDER_PREFIX!r} are the engine's "
                         "(the joins kept under join aggregate views)")
    return name


def validate_name(name: str) -> str:
    """Table names are plain identifiers: no path separators, no ``..``."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise ValueError(
            f"invalid table name {name!r}: use letters, digits, '_' and '-' (at most 128), "
            "no path separators"
        )
    return name


# object stores pylance opens (its object_store backends)
_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "memory", "oss")


def _storage_options(options: dict | None) -> dict[str, str] | None:
    """Explicit options, else ``$MV_ASSETS_STORAGE_OPTIONS`` (a JSON object)."""
    if options is None:
        raw = os.environ.get("MV_ASSETS_STORAGE_OPTIONS")
        if not raw:
            return None
        try:
            options = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"MV_ASSETS_STORAGE_OPTIONS is not a JSON object: {exc}") from exc
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ValueError("storage_options must be a dict of option name -> value")
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}


# How long the root's listing taken by connect(create=False) serves the catalog's first listing (s)
ROOT_LISTING_REUSE_S = 2.0

# (catalog uri, view) pairs a chain refreshed just before, in this thread (Connection.refreshing_after)
_REFRESHED_UPSTREAM: contextvars.ContextVar[frozenset] = contextvars.ContextVar("mv_assets_refreshed_upstream",
                                                                               default=frozenset())


@dataclass(frozen=True)
class ListTablesResponse:
    """A page of :meth:`Connection.list_tables`: the names, and the token of the next page (None: the last)."""

    tables: list[str]
    page_token: str | None = None


class Connection:
    """A catalog of tables and materialized views rooted at ``uri``.

    Every table and view is the Lance dataset ``<uri>/<name>.lance`` created
    with stable row ids, so ``lance.dataset(...)`` opens it directly.
    """

    def __init__(
        self, uri: "str | os.PathLike[str]", *, runner: Runner | None = None,
        storage_options: dict[str, str] | None = None, create: bool = True,
    ) -> None:
        if isinstance(uri, os.PathLike):  # Geneva's examples connect with a pathlib.Path
            uri = os.fspath(uri)
        if not isinstance(uri, str) or not uri:
            raise ValueError("connect() needs a catalog URI")
        if uri.startswith("file://"):
            uri = uri[len("file://") :]
        if objects.is_local(uri):
            uri = os.path.abspath(uri)
            if os.path.exists(uri) and not os.path.isdir(uri):
                raise CatalogNotFoundError(f"{uri} is a file, not a catalog directory")
            if create:
                try:
                    os.makedirs(uri, exist_ok=True)
                except OSError as exc:  # say, a file where a parent directory should be
                    raise ValueError(f"cannot create the catalog directory {uri}: {exc.strerror or exc}") from exc
        else:
            scheme = uri.split("://", 1)[0].lower()
            if scheme not in _SCHEMES or not uri.split("://", 1)[1].strip("/"):
                raise ValueError(
                    f"unsupported catalog URI {uri!r}: use a local path or {', '.join(s + '://bucket/path' for s in _SCHEMES[:4])}"
                )
            uri = uri.rstrip("/")
        self.uri = uri
        self.storage_options = _storage_options(storage_options)
        self.storage_options_given = storage_options is not None  # else from the environment (or none)
        previous = objects.registered_at(uri)
        replaced = objects.register(uri, self.storage_options)
        self.layout = Layout(uri)
        # (when, names): the root's listing taken here to tell a catalog is there, reused once (_root_names)
        self._root_listing: tuple[float, list[str]] | None = None
        if not create:
            try:
                names = objects.listdir(uri)
                if not self.layout.holds_catalog(names):
                    raise CatalogNotFoundError(f"no catalog at {uri}")
            except BaseException:
                # a connect that fails changes nothing: the connections made before keep their options
                objects.restore(uri, previous)
                raise
            self._root_listing = (time.monotonic(), names)
        if replaced is not None:
            # (one set of options per catalog URI in a process: the connections made before use these too)
            warnings.warn(f"connect({uri!r}) with storage options other than an earlier connection's: every "
                          "connection to it in this process now uses these (endpoint and credentials included)",
                          stacklevel=3)
        self._runner = runner

    def __repr__(self) -> str:
        return f"Connection({self.uri!r})"

    @staticmethod
    def local_ray_context(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager:
        """Geneva's context that starts a local Ray for the jobs inside it: a
        context that does nothing here (jobs run on their connection's runner,
        inline or on Spark, which needs no context); its arguments are Ray's.
        A static method, as Geneva's: ``Connection.local_ray_context()`` (its
        docs call it on the class) and ``db.local_ray_context()`` alike."""
        return contextlib.nullcontext()

    def is_remote(self) -> bool:
        """Geneva's: whether this is a LanceDB Cloud connection (``db://``). Never
        here: every catalog is a directory, local or in an object store."""
        return False

    @property
    def runner(self) -> Runner:
        """Where refresh tasks run: the lazily started Spark runner unless set."""
        return self._runner or default_runner()

    @runner.setter
    def runner(self, runner: Runner | None) -> None:
        self._runner = runner

    # -- paths -----------------------------------------------------------
    def table_uri(self, name: str) -> str:
        """Where the Lance dataset of table or view ``name`` lives."""
        return objects.join(self.uri, f"{validate_name(name)}.lance")

    _table_uri = table_uri

    def _state_dir(self, *parts: str) -> str:
        return self.layout.state(*parts)

    def _clear_stale_checkpoints(self, view: str, keep: str | None) -> None:
        self.layout.clear_stale_checkpoints(view, keep)

    # -- catalog ---------------------------------------------------------
    def table_names(self, page_token: str | None = None, limit: int | None = None) -> list[str]:
        """Tables and views, sorted: the datasets Lance's directory namespace
        lists at the root (a dataset whose creation never committed is left out).
        By pages, as lancedb's ``table_names``: the names after ``page_token``
        (a name: the last of the page before), at most ``limit`` of them
        (None: all; lancedb's default is 10)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit is a number of names >= 0 (None: all), got {limit!r}")
        if page_token is not None and not isinstance(page_token, str):
            raise ValueError(f"page_token is a table name (the last of the page before), got {page_token!r}")
        if limit == 0:
            return []
        found = self._listed()
        if page_token is not None:
            found = [n for n in found if n > page_token]
        # each a small read on an object store: concurrently, a page's worth at a time
        step = limit or len(found) or 1
        names: list[str] = []
        for at in range(0, len(found), step):
            batch = found[at:at + step]
            names += [n for n, ok in zip(batch, _concurrently(
                lambda n: objects.is_dataset(self.table_uri(n)), batch, "catalog-list", self.uri), strict=True) if ok]
            if limit and len(names) >= limit:
                return names[:limit]
        return names

    def list_tables(self, namespace_path: list[str] | None = None, page_token: str | None = None,
                    limit: int | None = None) -> "ListTablesResponse":
        """Listing by pages: ``.tables`` (as :meth:`table_names` gives them)
        and ``.page_token`` to pass for the next page (None: no more). The
        token is the page's last name, where lancedb's is its directory entry
        (``"b.lance/"``, from which lancedb lists ``b`` again): pass back the
        token a page gave. The catalog has one namespace, the root."""
        if namespace_path:
            raise ValueError(f"the catalog has one namespace, the root ([]), got {namespace_path!r}")
        if not limit:  # (None: every name; 0: none, as table_names)
            return ListTablesResponse(tables=self.table_names(page_token=page_token, limit=limit))
        names = self.table_names(page_token=page_token, limit=limit + 1)  # (one more says whether a page follows)
        tables = names[:limit]
        return ListTablesResponse(tables=tables, page_token=tables[-1] if len(names) > limit else None)

    def __getitem__(self, name: str) -> Table:
        return self.open_table(name)

    def __len__(self) -> int:
        return len(self.table_names())

    def drop_all_tables(self) -> None:
        """Drop every table and view (materialized or not), each view before
        what it reads."""
        for name in self.view_names():
            self.drop_table(name)
        left = [n for n in self.table_names() if not is_join_under(n)]
        while left:
            leaves = [n for n in left if not self.dependents(n)]
            if not leaves:  # (not reached: views form no cycle)
                raise RuntimeError(f"cannot order the drop of {left}")
            for name in leaves:
                self.drop_table(name)
            left = [n for n in left if n not in leaves]

    def _listed(self) -> list[str]:
        """The folders ``<name>.lance`` at the root, sorted, in one listing:
        each a dataset, or one whose creation never committed (no manifest
        yet). As lancedb lists a directory catalog: a dataset deregistered
        through Lance's directory namespace (a ``.lance-deregistered`` marker
        beside files it keeps) is listed too; looking for that marker cost a
        listing per dataset, a third of the status's requests."""
        return sorted(n[: -len(".lance")] for n in self._root_names()
                      if n.endswith(".lance") and len(n) > len(".lance") and not n.startswith(JOIN_UNDER_PREFIX))

    def _root_names(self) -> list[str]:
        """The names at the root: one listing, or the one ``connect(create=False)``
        took to tell a catalog is there, if taken less than
        ``ROOT_LISTING_REUSE_S`` ago (once: a CLI command's first look at the
        catalog is that listing, not a second one a moment later)."""
        taken, self._root_listing = self._root_listing, None
        if taken is not None and time.monotonic() - taken[0] < ROOT_LISTING_REUSE_S:
            return taken[1]
        return objects.listdir(self.uri)

    def describe(self, name: str | None = None, *, unreadable: dict[str, str] | None = None
                 ) -> dict[str, TableDescription]:
        """Descriptions of every table and view (or of ``name``) from stored
        metadata only: no UDF is unpickled (see :mod:`mv_assets.api.describe`).
        ``unreadable``: a dict that receives the datasets that cannot be read
        (damaged files: name -> why) instead of the first one raising."""
        if name is not None and name not in self.table_names():
            raise TableNotFoundError(f"no table or view named {name!r} in {self.uri}")
        names = self._listed() if name is None else [name]
        known = self._summaries()

        def one(n: str) -> "TableDescription | Exception | None":
            uri = self.table_uri(n)
            looked = self._remembered(known, n)
            if looked is None:
                return None  # a creation that never committed is no dataset: left out, as table_names() does
            newest, hit = looked
            if hit is not None:
                return TableDescription(n, uri, False, hit.version, columns=hit.columns, schema=hit.schema,
                                        field_names=hit.field_names)
            try:  # (a listing and a manifest read on an object store)
                d = describe_dataset(n, uri)
            except Exception as exc:
                return exc if objects.is_dataset(uri) else None
            self._learn(known, n, newest, d)
            return d

        out = {}
        # each dataset read once, concurrently: what an object store waits on
        with objects.reusing_handles(snapshot=True):
            described = _concurrently(one, names, "catalog-describe", self.uri)
        known.save(names if name is None else None)
        for n, d in zip(names, described, strict=True):
            if d is None:
                continue
            if isinstance(d, Exception):
                if unreadable is None:
                    raise d
                unreadable[n] = _unreadable_reason(d)
            else:
                out[n] = d
        return out

    def _summaries(self) -> Summaries:
        """What the catalog's datasets were when last looked at (storage.summaries): one read."""
        return Summaries(self.layout.summaries())

    def _remembered(self, known: Summaries, name: str) -> "tuple[Newest | None, TableSummary | None] | None":
        """A table the summaries know: its versions listed (None: no dataset
        there any more), with what its newest manifest said if that is the one
        they remember; otherwise that manifest is what the caller's
        ``reusing_handles(snapshot=True)`` block opens, not listed again. Any
        other name: (None, None), to be opened as it was before summaries."""
        if not known.is_table(name):
            return None, None
        uri = self.table_uri(name)
        newest = newest_manifest(uri)
        if newest is None:
            return None
        hit = known.table(name, newest)
        if hit is None:
            objects.pin_latest(uri, newest.version)
        return newest, hit

    def _learn(self, known: Summaries, name: str, newest: Newest | None, d: TableDescription) -> TableSummary | None:
        """Remember what was read of dataset ``name`` (described as ``d``, its
        handle still open in the caller's ``reusing_handles`` block): a view,
        or a table at the manifest ``newest`` listed."""
        if d.is_view:
            known.learn_kind(name, True)
            return None
        if newest is None:  # opened without a listing (a name not known as a table): its kind only
            known.learn_kind(name, False)
            return None
        if d.version != newest.version:  # (a commit in between: not this manifest's)
            known.forget(name)
            return None
        summary = TableSummary(newest.version, table_id(objects.dataset(self.table_uri(name))), list(d.columns),
                               list(d.schema), list(d.field_names))
        known.learn_table(name, newest, summary)
        return summary

    def describe_query(self, name: str, query: "Query | ViewDefinition") -> TableDescription:
        """How view ``name`` would look if created from ``query`` now (validated
        against its source, nothing written)."""
        definition = query.to_definition() if isinstance(query, Query) else query
        missing = [s for s in definition.sources if s not in self.table_names()]
        if missing:
            raise ValueError(f"view {name!r} is declared over {missing[0]!r}, which is not in {self.uri}")
        kind = kind_of(definition)
        datasets = [objects.dataset(self.table_uri(s)) for s in definition.sources]
        source = describe_dataset(definition.source, self.table_uri(definition.source))
        for s, ds in zip(definition.sources, datasets, strict=True):
            if VIEW_METADATA_KEY.encode() not in (ds.schema.metadata or {}):  # (views are created with them)
                require_stable_row_ids(ds, s, f"{kind.a_noun} ({name!r})")
        computed = None if source.is_view else [c["name"] for c in source.columns]
        return describe_definition(name, self.table_uri(name), definition, datasets, computed)

    def __contains__(self, name: str) -> bool:
        return name in self.table_names()

    def latest_versions(self, names: list[str]) -> dict[str, int | None]:
        """The latest Lance version of each named table or view (None: no
        such dataset), read concurrently: one small read each on an object
        store (a listing of its versions), the catalog itself unlisted."""
        def latest(name: str) -> int | None:
            try:
                return objects.dataset(self._table_uri(name)).version
            except (ValueError, OSError):
                if objects.is_dataset(self._table_uri(name)):
                    raise
                return None

        return dict(zip(names, _concurrently(latest, names, "catalog-versions", self.uri), strict=True))

    def _taken(self, name: str) -> bool:
        """Whether ``name`` is a table, a materialized view or a view."""
        return name in self or read_view_definition(self.layout, validate_name(name)) is not None

    @overload
    def open_table(self, name: str, version: int | None = None) -> Table: ...

    @overload
    def open_table(self, name: str, version: int | None = None, *, views: bool) -> "Table | View": ...

    def open_table(self, name: str, version: int | None = None, *, views: bool = False) -> "Table | View":
        """Open a table or view by name (materialized views come back as
        MaterializedView). ``version``: a handle checked out at that version
        (read-only, see :meth:`Table.checkout`). ``views``: a view that is not
        materialized (:meth:`create_view`) may come back too (a :class:`View`)."""
        uri = self._table_uri(name)
        try:  # (opened first: one listing and one manifest read on an object store)
            md = objects.dataset(uri).schema.metadata or {}
        except (ValueError, OSError):
            if objects.is_dataset(uri):
                raise  # there, but its files cannot be read (UNREADABLE in the status)
            raw = read_view_definition(self.layout, name) if views else None
            if raw is not None:
                if version is not None:
                    raise ValueError(f"{name!r} is a view that is not materialized: it has no versions") from None
                return View(self, name, raw)
            raise TableNotFoundError(f"no table or view named {name!r} in {self.uri}") from None
        if VIEW_METADATA_KEY.encode() in md:  # its definition is decoded (UDFs unpickled) when first used
            t: Table = MaterializedView(self, name, raw_definition=md[VIEW_METADATA_KEY.encode()])
        else:
            t = Table(self, name)
        if version is not None:
            t.checkout(version)
        return t

    def open_view(self, name: str) -> MaterializedView:
        """Open a materialized view by name (ValueError if ``name`` is a table)."""
        _refuse_hidden(name)
        t = self.open_table(name)
        if not isinstance(t, MaterializedView):
            raise ValueError(f"{name!r} is a table, not a materialized view")
        return t

    def create_table(
        self,
        name: str,
        data: Any = None,
        *,
        schema: pa.Schema | None = None,
        primary_key: str | None = None,
        mode: str = "create",
        exist_ok: bool = False,
        storage_options: dict[str, str] | None = None,
    ) -> Table:
        """Create a table from data and/or a schema.

        ``mode="create"`` fails if the name exists; ``"overwrite"`` replaces it.
        ``exist_ok=True`` (lancedb's): when a table of that name exists, it is
        opened instead (``data`` is not added; a ``schema`` given must match
        its columns, else ValueError). ``storage_options`` (Geneva's, Lance's
        write options): ``new_table_enable_stable_row_ids="true"`` is what
        every table here is created with; the catalog's object-store options
        are ``connect(storage_options=)``'s, and other values warn
        (``GenevaCompatWarning``, docs/geneva.md).
        """
        validate_new_name(name)
        _check_table_storage_options(storage_options, self.storage_options)
        if mode not in ("create", "overwrite"):
            raise ValueError(f"mode must be 'create' or 'overwrite', got {mode!r}")
        if schema is not None and not isinstance(schema, pa.Schema) and hasattr(schema, "to_arrow_schema"):
            schema = schema.to_arrow_schema()  # a lancedb LanceModel (pydantic), as lancedb takes it
        if data is None and schema is None:
            raise ValueError("create_table() needs data or a schema")
        if schema is None and isinstance(data, list | tuple) and not data:
            raise ValueError("create_table() of an empty list needs a schema: the rows give none")
        if exist_ok and mode == "create" and name in self:
            return self._existing(name, schema)
        if read_view_definition(self.layout, name) is not None:
            raise TableExistsError(f"{name!r} is a view in {self.uri}; drop it first")
        if name in self and mode == "create":
            raise TableExistsError(f"{name!r} already exists in {self.uri}; pass mode='overwrite' to replace it")
        if name in self and mode == "overwrite":
            deps = self.dependents(name)
            if deps:
                raise ValueError(f"cannot overwrite {name!r}: views {deps} are defined over it; drop them first")
        table = to_arrow_table(data if data is not None else [], schema)
        if schema is None:
            table = vectors_as_lancedb_makes_them(table)
        names = table.schema.names
        reserved = [n for n in names if is_reserved_name(n)]
        if reserved:
            raise ValueError(f"column names {reserved} are reserved (names starting with '__' and Lance's row columns)")
        if primary_key is not None:
            if primary_key not in names:
                raise ValueError(f"primary key {primary_key!r} is not a column of {names}")
            md = dict(table.schema.metadata or {})
            md[PRIMARY_KEY_METADATA_KEY.encode()] = primary_key.encode()
            table = table.replace_schema_metadata(md)
        if VIEW_METADATA_KEY.encode() in (table.schema.metadata or {}):
            raise ValueError("schema metadata key 'mv_assets.view' is reserved for views")
        check_primary_key(table, primary_key)
        uri = self._table_uri(name)
        # the table replaced (or one dropped outside mv_assets: its files removed by hand) leaves nothing
        # to the new one: the new table's row ids and versions start again, and its columns' checkpoints,
        # load records and errors would be taken for its own
        self._drop_dataset(name)
        objects.write_dataset(table, uri, schema=table.schema, mode="create", enable_stable_row_ids=True)
        return Table(self, name)

    def _existing(self, name: str, schema: pa.Schema | None) -> Table:
        """``create_table(exist_ok=True)`` of a name that exists: the table, if ``schema`` fits it."""
        t = self.open_table(name)
        if schema is not None:
            have = t.schema
            differ = [f.name for f in schema if f.name not in have.names or not have.field(f.name).type.equals(f.type)]
            if differ:
                raise ValueError(
                    f"create_table({name!r}, exist_ok=True): the table exists with another schema (columns {differ} "
                    f"differ; it has {[f'{f.name}: {f.type}' for f in have]})"
                )
        return t

    def drop_table(self, name: str, *, ignore_missing: bool = False) -> None:
        """Drop a table or view (materialized or not). Fails while views are
        defined over it (Geneva and lancedb drop it, leaving the views without
        a source). A dataset whose files are damaged (status UNREADABLE) can be
        dropped: it is not opened. ``ignore_missing``: no error when there is
        nothing of that name (as lancedb's)."""
        if not objects.is_dataset(self._table_uri(name)):
            if read_view_definition(self.layout, name) is not None:
                remove_view(self.layout, name)
                return
            if ignore_missing and name not in self.table_names():
                return
            self.open_table(name)  # raises: nothing of that name
        owner = name.removeprefix(JOIN_UNDER_PREFIX) if is_join_under(name) else None
        if owner and objects.is_dataset(self._table_uri(owner)):
            raise ValueError(f"cannot drop {name!r}: it is the join kept under the view {owner!r} (a join with "
                             f"group_by()), and goes with it: drop {owner!r}")
        deps = self.dependents(name)
        if deps:
            raise ValueError(f"cannot drop {name!r}: views {deps} are defined over it; drop them first")
        self._drop_dataset(name)
        if objects.is_dataset(self._table_uri(join_under(name))):  # a join aggregate: the join kept under it
            self._drop_dataset(join_under(name))

    def _drop_dataset(self, name: str) -> None:
        from mv_assets.ops import arrangements

        arrangements.forget(self._table_uri(name))  # (its arrangements, in memory and on disk)
        keys.forget(self._table_uri(name))  # (the keys this process appended to it)
        objects.remove_tree(self._table_uri(name))
        # its bookkeeping goes too, or a new table of the same name would inherit it
        objects.remove_tree(self._state_dir("checkpoints", name))
        objects.remove(self._state_dir("status", f"{name}.json"))
        objects.remove(self._state_dir("status", f"{name}.json.spare"))  # (its load record set aside: retire_record)
        drop_errors(self.layout, name)
        drop_job_records(self.layout, name)
        # its refresh lock's file (a lease on an object store): left, it was the one file a view created and
        # dropped left behind (a refresh of it, if any, fails: its dataset is gone)
        objects.remove(self._state_dir("locks", f"{name}.lock"))
        objects.remove(self._state_dir("locks", f"{name}.lease"))

    def views(self) -> list[MaterializedView]:
        """The materialized views. A dataset that cannot be opened (damaged
        files) is left out with a warning naming it; :meth:`status` lists it
        as UNREADABLE with the reason."""
        out, broken, _ = self._open_views()
        if broken:
            warnings.warn("left out of the views of " + self.uri + ", as they cannot be read: "
                          + "; ".join(f"{n!r}: {why}" for n, why in sorted(broken.items())), stacklevel=2)
        return out

    def _open_views(self) -> tuple[list["MaterializedView"], dict[str, str], dict[str, TableSummary]]:
        """The materialized views that open, the datasets that cannot be
        opened (name -> why), and the tables with what their newest manifest
        says (a view's status needs no more of an unchanged source). A table
        unchanged since a call last looked costs one listing, a view its
        opening (storage.summaries)."""
        out, broken, tables = [], {}, {}
        known = self._summaries()

        @objects.reusing_handles(snapshot=True)  # (the handle open_table opens, described)
        def one(n: str) -> "Table | View | TableSummary | Exception | None":
            looked = self._remembered(known, n)
            if looked is None:
                return None  # dropped meanwhile, or a creation that never committed
            newest, hit = looked
            if hit is not None:
                return hit
            try:
                t = self.open_table(n)
                summary = self._learn(known, n, newest, describe_dataset(n, self.table_uri(n)))
            except Exception as exc:
                return exc
            return summary if summary is not None and not isinstance(t, MaterializedView) else t

        names = self._listed()  # (open_table tells a dataset from a creation that never committed)
        for n, t in zip(names, _concurrently(one, names, "catalog-open", self.uri), strict=True):
            if t is None or isinstance(t, TableNotFoundError):
                continue  # dropped meanwhile
            if isinstance(t, Exception):
                broken[n] = _unreadable_reason(t)
                continue
            if isinstance(t, TableSummary):
                tables[n] = t
            elif isinstance(t, MaterializedView):
                out.append(t)
        known.save(names)
        return out, broken, tables

    def dependents(self, name: str) -> list[str]:
        """Views defined directly over ``name`` (materialized or not)."""
        return sorted(self._readers_of(name))

    def _readers_of(self, name: str) -> dict[str, str]:
        """The views over ``name`` (materialized or not), each with its stored
        definition (JSON; no UDF is unpickled)."""
        out = {}
        for n in self.table_names():
            if n == name:
                continue
            try:
                md = objects.dataset(self.table_uri(n)).schema.metadata or {}
            except (ValueError, OSError):  # damaged files (status UNREADABLE): what it reads is unknown
                continue
            raw = md.get(VIEW_METADATA_KEY.encode())
            if raw is not None and name in _sources(json.loads(raw)):
                out[n] = raw.decode()
        for n in view_names(self.layout):
            raw = read_view_definition(self.layout, n)
            if raw is not None and name in _sources(json.loads(raw)):
                out[n] = raw
        return out

    def view_names(self) -> list[str]:
        """The views that are not materialized (:meth:`create_view`), sorted;
        :meth:`table_names` lists the tables and materialized views."""
        return view_names(self.layout)

    def lineage_order(self, names: list[str] | None = None) -> list[str]:
        """Views in an order where each comes after the views it reads."""
        views = {v.name: v.sources for v in self.views()}
        wanted = set(views) if names is None else set(names)
        for n in wanted:
            if n not in views:
                _refuse_hidden(n)
                self.open_table(n)  # TableNotFoundError when there is no such table at all
                raise ValueError(f"{n!r} is a table, not a materialized view")
        order: list[str] = []
        seen: set[str] = set()

        def visit(n: str, stack: tuple[str, ...]) -> None:
            if n in seen or n not in views:
                return
            if n in stack:
                raise ValueError(f"view lineage has a cycle through {n!r}")
            for source in views[n]:
                visit(source, stack + (n,))
            seen.add(n)
            if n in wanted:
                order.append(n)

        for n in sorted(wanted):
            visit(n, ())
        return order

    def upstream(self, name: str) -> list[str]:
        """The views ``name`` reads from (a join view: through every source),
        each after the views it reads, nearest last (excluding base tables)."""
        order: list[str] = []

        def visit(n: str, stack: tuple[str, ...]) -> None:
            t = self.open_table(n)
            if not isinstance(t, MaterializedView) or n in order or n in stack:
                return
            for source in t.sources:
                visit(source, stack + (n,))
            if n != name:
                order.append(n)

        visit(name, ())
        return order

    # -- views -----------------------------------------------------------
    def create_materialized_view(
        self,
        name: str,
        query: Query,
        with_no_data: bool = True,
        *,
        refresh_policy: RefreshPolicy | None = None,
        auto_refresh: bool | None = None,
        owners: list[str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> MaterializedView:
        """Create a view from a query. Validates everything before writing.

        With ``with_no_data=True`` (the default) the view is created empty and
        filled by the first :meth:`refresh`; with ``False`` it is populated now.
        ``refresh_policy`` (default eager) says when automation refreshes it;
        Geneva's ``auto_refresh`` is that policy: ``True`` eager (refreshed
        when its source changes), ``False`` manual (only by :meth:`refresh`).
        ``owners`` (``["team:ml", "alice@example.com"]``) and ``tags``
        (``{"domain": "search"}``) are the view's asset owners and tags in
        Dagster (see :meth:`MaterializedView.set_owners`).
        """
        validate_new_name(name)
        refresh_policy = _auto_refresh_policy(auto_refresh, refresh_policy)
        ownership = Ownership.of(owners, tags)  # (validated before anything is written)
        self._check_new_view(name, query, refresh_policy, "create_materialized_view")
        if query.is_join_aggregate:
            return self._create_join_aggregate(name, query, refresh_policy, with_no_data, ownership)
        return self._create_view(name, query, refresh_policy, with_no_data, ownership)

    def _create_view(self, name: str, query: Query, refresh_policy: RefreshPolicy | None, with_no_data: bool,
                     ownership: Ownership | None) -> MaterializedView:
        """A materialized view of ``query`` named ``name`` (checked by the caller)."""
        definition = query.to_definition()
        kind = kind_of(definition)  # (a query view, or group_by().agg(): an aggregate, join(): a join view)
        sources = [query.table, *query.joined]
        datasets = [t._dataset() for t in sources]
        for t, ds in zip(sources, datasets, strict=True):  # every source, before any write
            if not isinstance(t, Table) or t.connection.layout != self.layout:
                raise ValueError(f"the joined table {t.name!r} belongs to another catalog")
            if t is not query.table and t.name == name:
                raise ValueError("a view cannot have the same name as one of its sources")
            require_stable_row_ids(ds, t.name, f"{kind.a_noun} ({name!r})")
            require_current_format(ds, t.name, f"{kind.a_noun} ({name!r})")
        return self._write_view(name, definition, kind.schema(definition, datasets), query, refresh_policy,
                                with_no_data, ownership)

    def _create_join_aggregate(self, name: str, query: Query, refresh_policy: RefreshPolicy | None,
                               with_no_data: bool, ownership: Ownership) -> MaterializedView:
        """Joins and ``GROUP BY`` in one view (model.join_agg_view): the join
        kept under it (a join view never listed), then the aggregate over it;
        both validated before either is written, the join dropped again if
        the view cannot be written."""
        inner, outline = query.join_aggregate()  # (every check: nothing written yet)
        under = join_under(name)
        if objects.is_dataset(self._table_uri(under)):  # (left by a view of that name dropped outside mv_assets)
            self._drop_dataset(under)
        try:
            self._create_view(under, inner, RefreshPolicy.manual(), True, None)
        except ValueError as exc:  # (refused before anything is written: said in the user's words)
            raise ValueError(in_users_words(str(exc), name, list(inner.selected))) from None
        try:
            spec = {**json.loads(outline.function or "{}")}
            spec["sources"] = [under, *spec["sources"][1:]]
            definition = ViewDefinition(source=under, columns=(), function=json.dumps(spec))
            join_ds = objects.dataset(self._table_uri(under))
            return self._write_view(name, definition, kind_of(definition).schema(definition, [join_ds]), query,
                                    refresh_policy, with_no_data, ownership)
        except BaseException:
            self._drop_dataset(under)
            raise

    def _check_new_view(self, name: str, query: Any, refresh_policy: Any, api: str) -> None:
        """What every new view needs: a policy, a query over a table of this
        catalog, a name that is free and not its source's."""
        if refresh_policy is not None and not isinstance(refresh_policy, RefreshPolicy):
            raise ValueError(f"refresh_policy must be a RefreshPolicy, got {refresh_policy!r}: {BUILD_HINT}")
        if not isinstance(query, Query):
            raise ValueError(f"{api}() needs a query: table.search(None)...")
        if not isinstance(query.table, Table) or query.table.connection.layout != self.layout:
            raise ValueError("the query's table belongs to another catalog")
        if query.table.checked_out is not None:
            raise ValueError(f"the query's table {query.table.name!r} is checked out at version "
                             f"{query.table.checked_out}; a view reads its source's latest version (checkout_latest())")
        if self._taken(name):
            raise TableExistsError(f"{name!r} already exists in {self.uri}")
        if name == query.table.name:
            raise ValueError("a view cannot have the same name as its source")

    def _write_view(self, name: str, definition: ViewDefinition, schema: pa.Schema, query: Query,
                    refresh_policy: RefreshPolicy | None, with_no_data: bool,
                    ownership: Ownership | None = None) -> MaterializedView:
        """Create the view's (empty) dataset with its schema, policy, owners
        and tags, then fill it unless ``with_no_data`` (a view that could not
        be populated is not left behind)."""
        policy = refresh_policy or RefreshPolicy.eager()
        md = {**(schema.metadata or {}), POLICY_METADATA_KEY.encode(): policy.to_json().encode(),
              VIEW_ID_KEY.encode(): uuid.uuid4().hex.encode()}
        if ownership is not None and not ownership.empty:
            md[OWNERSHIP_METADATA_KEY.encode()] = ownership.to_json().encode()
        schema = schema.with_metadata(md)
        assert isinstance(query.table, Table)  # (checked by the create_* calls)
        # refused before any write: a source whose changes cannot be found, SQL whose value is not the row's
        require_current_format(query.table._dataset(), query.table.name, f"a materialized view ({name!r})")
        check_deterministic(name, {"the filter": definition.filter,
                                   **{f"column {c.name!r}": c.expr for c in definition.columns if c.kind == "sql"}})
        for t in [query.table, *query.joined]:  # the view records which tables it reads (storage.identity)
            ensure_table_id(t.uri)
        empty = pa.Table.from_batches([], schema=schema)
        # a new view starts NEVER_LOADED: a record a refresh of a view dropped under this name wrote after
        # the drop (it failed: its view was gone) is not this one's
        clear_load_state(self.layout, name)
        objects.write_dataset(empty, self._table_uri(name), schema=schema, mode="create", enable_stable_row_ids=True)
        view = MaterializedView(self, name, definition)
        if not with_no_data:
            try:
                with failures_unrecorded():  # a failure drops the view: nothing of it is recorded
                    view.refresh()
            except BaseException as exc:
                self.drop_table(name)
                if isinstance(exc, UdfError):
                    exc.not_created = True  # (its remedy is not the errors of a view that is gone)
                raise
        return view

    def create_view(self, name: str, query: Query) -> View:
        """Create a view that is not materialized: ``query`` (a filter,
        columns, UDFs, shuffle, limit over a table or materialized view) is
        stored and computed each time the view is read (:class:`View`:
        ``to_arrow``, ``to_pandas``, ``head``, ``count_rows``), over its
        source's latest version, in this process. Nothing is refreshed or
        kept; open it with ``open_table(name, views=True)``; drop it with
        :meth:`drop_table`. Validates everything before writing."""
        validate_new_name(name)
        self._check_new_view(name, query, None, "create_view")
        definition = query.to_definition()
        if not write_view_definition(self.layout, name, definition):
            raise TableExistsError(f"{name!r} already exists in {self.uri}")
        return View(self, name, definition.encode().decode())

    def create_udtf_view(
        self,
        name: str,
        query: Query | None = None,
        function: Any = None,
        with_no_data: bool = True,
        *,
        refresh_policy: RefreshPolicy | None = None,
        auto_refresh: bool | None = None,
        owners: list[str] | None = None,
        tags: dict[str, str] | None = None,
        source: Query | None = None,
        udtf: Any = None,
    ) -> MaterializedView:
        """Create a view that is not one row per source row (Geneva's name).

        ``function`` a ``@chunker``: each passing source row gives zero or more
        rows. ``query`` is ``source.search(None).where(...).select([...])``: the
        selected columns (without ``select``, every source column) are the parent
        columns every child row inherits, but the chunker's inputs, which are
        inherited only with ``inherit_input_columns=True`` (as in Geneva: a
        video selected to feed the chunker is not copied into each clip); the
        chunker's input columns need not be selected (see :mod:`mv_assets.ops.chunk_refresh`).

        ``function`` a ``@udtf``: the passing source rows of each partition
        (``partition_by``; without it the whole source is one partition) give
        a table of the UDTF's ``output_schema``. ``query`` is
        ``source.search(None).where(...)``: its filter picks the rows the UDTF
        sees; a ``select`` is refused (the output schema makes the view's
        columns). A refresh recomputes only the partitions whose rows changed
        (see :mod:`mv_assets.ops.udtf_refresh`).

        Either view refreshes incrementally, in one Lance commit, like any
        other. Validates everything before writing. ``owners``, ``tags`` and
        ``auto_refresh``: as in :meth:`create_materialized_view`. Geneva's
        keyword names ``source=`` (the query) and ``udtf=`` (the function) are
        taken too."""
        validate_new_name(name)
        query = typing.cast(Query, _one_of("query", query, "source", source))
        function = _one_of("function", function, "udtf", udtf)
        refresh_policy = _auto_refresh_policy(auto_refresh, refresh_policy)
        ownership = Ownership.of(owners, tags)
        if not isinstance(function, Chunker | UDTF):
            raise ValueError(
                f"create_udtf_view() needs a @chunker or @udtf function, got {type(function).__name__}"
            )
        self._check_new_view(name, query, refresh_policy, "create_udtf_view")
        definition = function_view_definition(query, function, name)
        kind = kind_of(definition)
        source = query.table._dataset()
        require_stable_row_ids(source, query.table.name, f"{kind.a_noun} ({name!r})")  # before any write
        return self._write_view(name, definition, kind.schema(definition, [source]), query, refresh_policy,
                                with_no_data, ownership)

    def enable_stable_row_ids(self, name: str, *, drop_indexes: bool = False) -> AdoptResult:
        """Bring in a table created without stable row ids (lancedb's default,
        ``lance.write_dataset``'s too): rewrite it once with them, in its place.

        Keeps its rows (in scan order), schema and schema metadata, config and
        parameterless scalar indexes (BTree, Bitmap, LabelList, rebuilt);
        other indexes are refused unless ``drop_indexes`` (then listed in the
        result: create them again). The version history starts again at 1,
        computed columns become stale (backfill them), error records and
        checkpoints of the table are cleared. Costs one full read and write of
        the table. A crash never loses the table: run it again to finish (see
        :mod:`mv_assets.storage.row_ids` for what is atomic where). Stop other
        writers meanwhile: a commit during the rewrite aborts it
        (``ConcurrentWriteError``, nothing replaced). A table that has stable
        row ids already is left alone (``rewritten`` False), unless it is in
        Lance's legacy (v1) file format: that is rewritten in the current one.

        Refused while a view over it holds rows (one that refreshed, say, before
        the table was recreated without stable row ids): drop it first. Views
        that never refreshed are kept; their first refresh computes every row.
        """
        validate_new_name(name)
        finished = finish_interrupted(self.layout, name)  # an interrupted one is finished (or undone) first
        if finished is not None:
            return finished
        ds = self.open_table(name)._dataset()
        if ds.has_stable_row_ids and not is_legacy_format(ds):  # every view and table mv_assets created
            return adopt(self.layout, name)  # nothing to do: says so
        views = [v for v in self.views() if name in v.sources]  # (a join view: any of its tables)
        held = [v.name for v in views if v.count_rows() or v.source_version is not None]
        if held:
            raise ValueError(
                f"cannot rewrite {name!r} with stable row ids: views {held} over it hold rows matched by its old "
                "row ids; drop them first and create them again after"
            )
        return adopt(self.layout, name, drop_indexes=drop_indexes)

    def _refresh_lock(self, view: str, timeout: float | None):
        """An inter-process lock serialising refreshes of one view."""
        return self.layout.lock(view, timeout)

    @objects.reusing_handles(snapshot=True)
    def view_statuses(self, name: str | None = None) -> list[ViewStatus]:
        """The status records of every view (or just ``name``). A view whose
        source is gone is SOURCE_MISSING, one whose record cannot be read
        UNREADABLE, each with the reason in ``last_error``: one broken view
        never hides the others."""
        out = []
        views, broken, tables = self._one_view(name) if name else self._open_views()
        # a dataset that cannot be opened (damaged files) is listed, not hiding the others
        out += [unreadable_status(n, None, why) for n, why in broken.items()]
        # the load state records, listed once: only views loading or failed have one (the others' is in their commits)
        recorded = None if name else recorded_views(self.layout)

        def one(view: MaterializedView) -> ViewStatus:
            try:
                if recorded is None:
                    return view_status(view.ref())
                return view_status(view.ref(), load_record(self.layout, view.name) if view.name in recorded else {},
                                   source=tables.get(view.source))
            except Exception as exc:  # a status listing reports what it cannot read, it does not stop
                try:
                    source = view.source
                except Exception:
                    source = None
                return unreadable_status(view.name, source, f"{type(exc).__name__}: {short_error(exc)}")

        # the views' reads are independent: concurrently (what an object store waits on)
        out += _concurrently(one, views, "catalog-status", self.uri)
        return sorted(out, key=lambda s: s.name)  # (the unreadable ones among the others, by name)

    def _one_view(self, name: str) -> tuple[list["MaterializedView"], dict[str, str], dict]:
        """:meth:`_open_views` of one view: ``name`` opened, or why its dataset
        cannot be (an unknown name, or a table, raises as :meth:`open_view` does)."""
        _refuse_hidden(name)
        try:
            self.open_table(name)
        except TableNotFoundError:
            raise
        except Exception as exc:  # a dataset there that does not open (damaged files)
            if name not in self._listed():
                raise
            return [], {name: f"{type(exc).__name__}: {short_error(exc)}"}, {}
        return [self.open_view(name)], {}, {}

    def arrangements(self) -> list[dict]:
        """Seed 004's "analyzing arrangements": what the join views' refreshes
        keep in memory between refreshes (:mod:`mv_assets.ops.arrangements`),
        one entry an arrangement, shared by every view that probes it (the
        first table's key, by every view joining it by that column):

        ``name`` (as a plan's ``details["arrangements"]`` names it), ``kind``,
        ``table`` (the view's own: the view; a join aggregate's: the join kept
        under it), ``columns``, ``views`` (those that probe it; a join
        aggregate for the join under it), ``rows`` (of its relation now), ``bytes`` (in memory once
        loaded: ~9 bytes a value), ``hashed`` (a text key held as hashes),
        ``held`` (this process: version, rows, bytes; None: not held),
        ``on_disk`` (the copy later processes map: version, bytes, path;
        None: none) and ``last_refresh`` (per view, what its newest refresh
        did to have it and the seconds it took: kept, caught up, loaded)."""
        from mv_assets.model.join_agg_view import JOIN_AGG_KIND
        from mv_assets.model.join_view import JOIN_KIND, Join
        from mv_assets.ops import arrangements as arr
        from mv_assets.ops.join_refresh import arrangements_used
        from mv_assets.storage.state import read_refresh_state

        out: dict[tuple, dict] = {}
        joins: list[tuple[str, MaterializedView]] = []  # (the name users know, the join view refreshed)
        for view in self.views():
            if view.definition.kind == JOIN_KIND:
                joins.append((view.name, view))
            elif view.definition.kind == JOIN_AGG_KIND:  # (joins and GROUP BY: the join kept under it)
                try:
                    under = self.open_table(join_under(view.name))
                except TableNotFoundError:  # (never refreshed yet)
                    continue
                if isinstance(under, MaterializedView):
                    joins.append((view.name, under))
        for name, view in joins:
            join = Join.of(view.definition)
            try:
                datasets = [objects.dataset(self.table_uri(t)) for t in join.sources]
                view_ds = view._dataset()
            except (OSError, ValueError):  # (a source gone: its status says so)
                continue
            last = read_refresh_state(view_ds).arrangements or {}
            for use in arrangements_used(join, view.uri, [d.schema for d in datasets]):
                uri = view.uri if use["table"] is None else self.table_uri(use["table"])
                entry = out.get((uri, tuple(use["columns"])))
                if entry is None:
                    rows = (view_ds if use["table"] is None else objects.dataset(uri)).count_rows()
                    own = f"{name} (provenance)" if name == view.name else f"{name} (its join's provenance)"
                    entry = out[(uri, tuple(use["columns"]))] = {
                        "name": use["name"] if use["table"] is not None else own,
                        "kind": use["kind"], "table": use["table"] or view.name, "columns": use["columns"],
                        "views": [], **arr.described(uri, use["columns"], use["addresses"], rows),
                        "last_refresh": {}}
                entry["views"].append(name)
                if use["name"] in last:
                    entry["last_refresh"][name] = last[use["name"]]
        return sorted(out.values(), key=lambda e: (e["kind"] != "the view's provenance", e["name"]))

    def status(self, name: str | None = None) -> pa.Table:
        """The status table: one row per view (or just ``name``), as an Arrow table
        (see :meth:`view_statuses`)."""
        return status_table(self.view_statuses(name))

    def _check_source_current(self, view: MaterializedView) -> None:
        for source in view.definition.sources:  # (a join view: each of them)
            if not is_join_under(source):  # (a join aggregate's own join: its refresh brings it up first)
                self._check_one_source_current(view, source)

    @contextlib.contextmanager
    def refreshing_after(self, upstream: list[str]):
        """Meanwhile (in this thread), a refresh of a view reading one of the
        views ``upstream`` is not refused for it being behind its source: they
        were just refreshed (or found current) by the caller, a chain refreshed
        in lineage order, and a source commit landing since is the next
        refresh's (an ingest job writing all along failed such chains now and
        then). Used by :meth:`refresh` with ``upstream=True`` and Dagster's
        runs of views over views."""
        token = _REFRESHED_UPSTREAM.set(_REFRESHED_UPSTREAM.get() | {(self.uri, n) for n in upstream})
        try:
            yield
        finally:
            _REFRESHED_UPSTREAM.reset(token)

    def _check_one_source_current(self, view: MaterializedView, source: str) -> None:
        if (self.uri, source) in _REFRESHED_UPSTREAM.get():
            return  # refreshed by this chain just before (refreshing_after)
        uri = self.table_uri(source)
        if not objects.is_dataset(uri):
            return  # a source that is gone: the refresh's plan says so in its own words
        if VIEW_METADATA_KEY.encode() not in (objects.dataset(uri).schema.metadata or {}):
            return  # a table: nothing it reads can be behind (the handle serves the plan)
        src = self.open_table(source)
        if isinstance(src, MaterializedView):
            behind = self._versions_behind(src)
            if behind:
                raise SourceBehindError(
                    f"view {view.name!r} reads view {src.name!r}, which is {behind} version(s) behind its "
                    f"source {src.definition.source!r}; refresh {src.name!r} first, or call "
                    f"db.refresh({view.name!r}, upstream=True) (`mv-assets refresh --upstream`) to refresh the chain in "
                    "lineage order"
                )

    def _versions_behind(self, view: MaterializedView) -> int:
        """Source versions that matter to ``view`` and it does not reflect yet."""
        return len(pending_source_versions(view.ref()))

    @overload
    def refresh(
        self, name: list[str], *, src_version: int | None = None, upstream: bool = False, mode: str = "auto",
        runner: Runner | None = None, **kwargs: Any,
    ) -> list[RefreshResult]: ...

    @overload
    def refresh(
        self, name: str, *, src_version: int | None = None, upstream: bool = False, mode: str = "auto",
        runner: Runner | None = None, **kwargs: Any,
    ) -> RefreshResult | list[RefreshResult]: ...

    @objects.reusing_handles()
    def refresh(
        self,
        name: str | list[str],
        *,
        src_version: int | None = None,
        upstream: bool = False,
        mode: str = "auto",
        runner: Runner | None = None,
        **kwargs: Any,
    ) -> RefreshResult | list[RefreshResult]:
        """Refresh one view, or several in lineage order.

        ``upstream=True`` first refreshes the views this one reads, in order.
        A view whose source view is behind is not refreshed silently: it raises
        :class:`SourceBehindError` unless ``upstream=True``. Other keywords
        (Geneva's ``concurrency``, ``max_rows_per_fragment``, ``where``...,
        and :meth:`MaterializedView.refresh`'s) go to each view's refresh.
        """
        ignored = {k: kwargs.pop(k) for k in list(kwargs) if k in geneva.REFRESH_IGNORED}
        geneva.accept("refresh", ignored, geneva.REFRESH_IGNORED)
        names = [name] if isinstance(name, str) else list(name)
        if src_version is not None and len(names) != 1:
            raise ValueError("src_version applies to a single view")
        for n in names:
            _refuse_hidden(n)
        if isinstance(name, str) and not upstream:  # one view: no lineage to order (nothing else is opened)
            view = self.open_table(name)
            if not isinstance(view, MaterializedView):
                raise ValueError(f"{name!r} is a table, not a materialized view")
            return view.refresh(src_version=src_version, mode=mode, runner=runner, **kwargs)
        if "job_id" in kwargs:
            raise ValueError("job_id names the refresh of one view; refresh the views one at a time to name each")
        todo = list(names)
        if upstream:
            for n in names:
                todo = self.upstream(n) + todo
        order = self.lineage_order(list(dict.fromkeys(todo)))
        results = []
        for i, n in enumerate(order):
            view = self.open_table(n)
            assert isinstance(view, MaterializedView)
            pinned = src_version if (n in names and len(names) == 1) else None
            with self.refreshing_after(order[:i]):  # (a write landing since: the next refresh's)
                results.append(view.refresh(src_version=pinned, mode=mode, runner=runner, **kwargs))
        return results[0] if isinstance(name, str) and len(results) == 1 else results

    def refresh_async(self, name: str, **kwargs: Any) -> Job:
        """:meth:`MaterializedView.refresh_async` of view ``name``."""
        _refuse_hidden(name)
        view = self.open_table(name)
        if not isinstance(view, MaterializedView):
            raise ValueError(f"{name!r} is a table, not a materialized view")
        return view.refresh_async(**kwargs)

    # -- jobs ------------------------------------------------------------
    def list_jobs(self, table_name: str | None = None, status: str | None = None) -> list[JobRecord]:
        """Jobs (backfills, refreshes, column loads) with Geneva's fields:
        ``job_id``, ``job_type``, ``table_name``, ``column_name``, ``status``
        (``RUNNING``, ``DONE``, ``FAILED``), ``launched_at``, ``completed_at``,
        ``metrics``, ``error``; oldest first. Read from what the jobs left
        (their commits, error records and the views' load states: see
        :mod:`mv_assets.storage.jobs`) and the jobs this process runs; a
        cleanup of old versions forgets the jobs whose commits it removed."""
        if status is not None and str(status).upper() not in ("RUNNING", "DONE", "FAILED", "PENDING", "CANCELLED"):
            raise ValueError(f"status is one of RUNNING, DONE, FAILED (PENDING, CANCELLED: none here), got {status!r}")
        tables = self.table_names()
        if table_name is not None:
            if table_name not in tables:
                raise TableNotFoundError(f"no table or view named {table_name!r} in {self.uri}")
            tables = [table_name]
        views = [n for n in tables if VIEW_METADATA_KEY.encode() in (objects.dataset(self.table_uri(n)).schema.metadata
                                                                     or {})]
        found = {j.job_id: j for j in job_records(self.layout, tables, views)}
        for job in process_jobs(self.layout.root):  # this process's: running ones, and those no record tells of
            known = found.get(job.job_id)
            if job.table_name in tables and (known is None or job.status == "RUNNING" or known.status == "RUNNING"):
                found[job.job_id] = _job_record(job)
        epoch = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
        jobs = sorted(found.values(), key=lambda j: (j.launched_at or j.completed_at or epoch, j.job_id))
        if status is not None:
            jobs = [j for j in jobs if j.status == str(status).upper()]
        return jobs

    def get_job(self, job_id: str) -> JobRecord:
        """The record of job ``job_id`` (see :meth:`list_jobs`); ``ValueError``
        (:class:`JobNotFoundError`) where the catalog knows no such job, as Geneva."""
        for job in process_jobs(self.layout.root):
            if job.job_id == job_id and job.status == "RUNNING":
                return _job_record(job)
        for job in self.list_jobs():
            if job.job_id == job_id:
                return job
        raise JobNotFoundError(f"Job {job_id} not found in {self.uri}")


def _job_record(job: Job) -> JobRecord:
    """A job of this process as a record."""
    def when(t: float | None):
        return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc) if t else None

    error = job.error
    return job_record(job.job_id, job.job_type, job.table_name or "", job.column_name, job.status,
                      when(job.launched_at), when(job.completed_at),
                      error=f"{type(error).__name__}: {error}" if error is not None else None)


def _auto_refresh_policy(auto_refresh: Any, policy: RefreshPolicy | None) -> RefreshPolicy | None:
    """Geneva's ``auto_refresh`` as a refresh policy (``True``: eager, ``False``: manual)."""
    if auto_refresh is None:
        return policy
    if not isinstance(auto_refresh, bool):
        raise ValueError(f"auto_refresh is True or False, got {auto_refresh!r}")
    wanted = RefreshPolicy.eager() if auto_refresh else RefreshPolicy.manual()
    if policy is not None and policy != wanted:
        raise ValueError(f"auto_refresh={auto_refresh} means refresh_policy {wanted.kind!r}, but refresh_policy "
                         f"{policy.kind!r} was given; pass one of them")
    return wanted



def keep_arrangements_on_disk(directory: str | None = None) -> str | None:
    """Keep copies of the arrangements this process's join-view refreshes
    load (mv_assets.ops.arrangements) on disk under ``directory`` (default
    ``~/.cache/mv_assets/arrangements``), for processes after it: what a
    process per refresh wants (a Dagster run, the Pipes process, a cron job).
    ``MV_ASSETS_ARRANGEMENT_DIR``, when set, wins (empty: none kept). Returns
    where they are kept."""
    from mv_assets.ops import arrangements

    return arrangements.keep_on_disk(directory)


def connect(
    uri: "str | os.PathLike[str]", *, runner: Runner | None = None, storage_options: dict[str, str] | None = None,
    create: bool = True,
) -> Connection:
    """Open (creating if needed) the catalog at ``uri``: a local directory (a
    string or a ``pathlib.Path``) or an object-store URI (``s3://bucket/path``,
    ``gs://``, ``az://``).
    ``storage_options`` (default ``$MV_ASSETS_STORAGE_OPTIONS``, JSON) are
    Lance's object-store options (``aws_endpoint``, ``aws_region``,
    credentials, ``allow_http``...): passed to every Lance call, to the
    engine's own state files, and with each job to the executors.

    ``create=False`` opens only an existing catalog, creating nothing: where
    ``uri`` holds no table, no view and no engine state (one listing, local
    or object store), it raises :class:`CatalogNotFoundError` ("no catalog
    at ..."). A local ``uri`` that is a file is refused either way.

    >>> import tempfile
    >>> db = connect(tempfile.mkdtemp())
    >>> db.table_names()
    []
    """
    return Connection(uri, runner=runner, storage_options=storage_options, create=create)


_STABLE_ROW_IDS = "new_table_enable_stable_row_ids"


class _Hidden:
    """A value not to be said (its repr in a warning)."""

    def __repr__(self) -> str:
        return "<value not shown>"


_HIDDEN = _Hidden()


def _check_table_storage_options(given: dict[str, str] | None, catalog: dict[str, str] | None) -> None:
    """Geneva's ``create_table(storage_options=)``: stable row ids are what every
    table has; the catalog's own options change nothing; others warn."""
    if given is None:
        return
    if not isinstance(given, dict):
        raise ValueError(f"storage_options must be a dict of str -> str, got {type(given).__name__}")
    for key, value in given.items():
        if key == _STABLE_ROW_IDS:
            if str(value).lower() not in ("true", "1"):
                geneva.warn("create_table", f"storage_options[{key!r}]", value, "every table here is created with "
                            "stable row ids (views and incremental refreshes need them)", stacklevel=4)
        elif (catalog or {}).get(key) != value:
            # (the value is not said: it may be a key or a secret)
            geneva.warn("create_table", f"storage_options[{key!r}]", _HIDDEN, "a catalog's tables share its "
                        "storage options: pass them to connect(storage_options=)", stacklevel=4)


def _one_of(name: str, value: Any, geneva_name: str, geneva_value: Any) -> Any:
    """A parameter given by our name or Geneva's (not both)."""
    if value is not None and geneva_value is not None:
        raise TypeError(f"create_udtf_view() got both {name}= and {geneva_name}= (Geneva's name for it): give one")
    value = value if value is not None else geneva_value
    if value is None:
        raise TypeError(f"create_udtf_view() missing required argument: {name!r} (or {geneva_name!r})")
    return value


def _concurrently(fn: Callable[[Any], Any], items: list, pool_name: str, uri: str) -> list:
    """``[fn(x) for x in items]``, on the process's pool ``pool_name`` (8
    threads) when the catalog at ``uri`` is on an object store: independent
    small reads of many datasets, which it answers in parallel (on a local
    disk each read is a few microseconds: threads would cost more). Each call
    runs in a copy of the caller's context (the versions a ``reusing_handles``
    block pinned are shared) with handles of its own
    (:func:`objects.with_own_handles`). A pool's tasks never wait on the same pool."""
    if len(items) < 2 or objects.is_local(uri):
        return [fn(x) for x in items]
    futures = [pool(pool_name, 8).submit(contextvars.copy_context().run, objects.with_own_handles, fn, x)
               for x in items]
    return [f.result() for f in futures]


def _unreadable_reason(exc: Exception) -> str:
    """Why a dataset of the catalog cannot be opened, in our words and Lance's (no Rust paths)."""
    return f"the dataset cannot be read ({type(exc).__name__}: {short_error(exc)})"


def _sources(definition: dict) -> list[str]:
    """The sources of a stored view definition (JSON; nothing unpickled)."""
    return kind_of(definition).sources_of(definition)
