"""Dagster Components: views and catalogs declared in ``defs.yaml`` files.

``dg scaffold defs mv_assets.CatalogComponent catalog`` and ``dg scaffold defs
mv_assets.ViewComponent my_view`` write commented templates; ``dg check defs``
validates them and ``dg list defs`` shows their assets (docs/dagster.md,
"Dagster Components").

The design: a :class:`ViewComponent` declares one view (a
:class:`~mv_assets.api.declare.DeclaredView`, the same object a views module's
``views(db)`` returns) and builds no asset itself. The
:class:`CatalogComponent` of its catalog (one per catalog, the yaml
counterpart of ``definitions.py``) collects every ViewComponent of the
project, adds the views of its ``views_module`` if it names one, and builds
the whole graph with :func:`~mv_assets.dagster.build_definitions`: one asset
per source table however many views read it, one multi-asset, job and sensor
per lineage, exactly as the Python module way builds them. Views of one
lineage are refreshed together by one multi-asset, so a component per view
building its own assets would split that lineage (and duplicate the source
table's asset); this way nothing is built twice.

Loading reads catalog metadata only (``connect(create=False)``, no UDF
unpickled): it writes nothing and starts no JVM. A view not created yet is
created by its first materialization, as a view declared in code is.
"""

import importlib
import logging
import os
from typing import Any

import dagster as dg
from dagster.components.component_scaffolding import scaffold_component
from pydantic import PrivateAttr

from mv_assets.api.catalog import Connection, connect
from mv_assets.api.declare import DeclaredView, load_declared
from mv_assets.dagster.definitions import AUTOMATIONS, build_definitions
from mv_assets.dagster.resource import MvAssetsResource
from mv_assets.model.chunker import UDTF, Chunker
from mv_assets.model.errors import CatalogNotFoundError
from mv_assets.model.ownership import Ownership
from mv_assets.model.policy import KINDS, RefreshPolicy
from mv_assets.model.udf import UDF

__all__ = ["ViewComponent", "CatalogComponent", "ViewComponentScaffolder", "CatalogComponentScaffolder",
           "resolve_reference", "parse_policy"]

log = logging.getLogger(__name__)

CATALOG_ENV = "MV_ASSETS_DB"
_POLICY_FIELDS = {"ttl": "ttl_seconds", "cron": "cron", "staleness": "max_staleness_pct"}


class ComponentError(ValueError):
    """A ``defs.yaml`` of ours that cannot be loaded (said at ``dg check defs``)."""


def _resolve(ref: str, where: str, what: str, example: str) -> Any:
    """The object at ``module:attr`` (``attr`` may be dotted), said as ``what`` in errors."""
    module_name, sep, attr = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if not sep or not module_name or not attr:
        raise ComponentError(f"{where}: a {what} is referenced as 'module:function' (say {example!r}), got {ref!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ComponentError(f"{where}: cannot import module {module_name!r} of {what} {ref!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ComponentError(f"{where}: module {module_name!r} has no {attr!r} ({what} {ref!r})")
        obj = getattr(obj, part)
    return obj


def resolve_reference(ref: str, where: str) -> UDF:
    """The ``mv.udf`` at ``module:attr`` (``attr`` may be dotted)."""
    obj = _resolve(ref, where, "UDF", "my_pkg.udfs:embed")
    if not isinstance(obj, UDF):
        raise ComponentError(f"{where}: {ref!r} is a {type(obj).__name__}, not a UDF: decorate it with @mv.udf")
    return obj


def resolve_function(ref: str, where: str) -> Any:
    """The ``@chunker`` or ``@udtf`` at ``module:attr``."""
    obj = _resolve(ref, where, "function", "my_pkg.chunkers:split")
    if not isinstance(obj, Chunker | UDTF):
        raise ComponentError(f"{where}: {ref!r} is a {type(obj).__name__}, not a @chunker or @udtf")
    return obj


_JOIN_KEYS = {"table", "on", "left_on", "right_on", "how"}


def parse_policy(raw: Any, where: str) -> RefreshPolicy | None:
    """``eager`` / ``manual``, or ``{kind: cron, cron: "0 6 * * *"}``, ``{kind:
    ttl, ttl_seconds: 3600}``, ``{kind: staleness, max_staleness_pct: 10}``."""
    if raw is None:
        return None
    fields: dict[str, Any] = {"kind": raw} if isinstance(raw, str) else dict(raw) if isinstance(raw, dict) else {}
    kind = fields.get("kind")
    if kind not in KINDS:
        raise ComponentError(f"{where}: refresh_policy kind must be one of {', '.join(KINDS)}, got {raw!r}")
    allowed = {"kind", *([_POLICY_FIELDS[kind]] if kind in _POLICY_FIELDS else [])}
    if set(fields) - allowed:
        raise ComponentError(f"{where}: refresh_policy of kind {kind!r} takes {sorted(allowed)}, "
                             f"got {sorted(fields)}")
    try:
        return RefreshPolicy(**fields)
    except (TypeError, ValueError) as exc:
        raise ComponentError(f"{where}: refresh_policy: {exc}") from exc


def _view_catalog(view: "ViewComponent", catalogs: list["CatalogComponent"]) -> str:
    """The catalog of a view: its own, else the project's only CatalogComponent's, else $MV_ASSETS_DB."""
    if view.catalog is None and len(catalogs) == 1:
        return catalogs[0].uri()
    return _catalog_uri(view.catalog, view._where())


def _catalog_uri(uri: str | None, where: str) -> str:
    """The catalog named (``$MV_ASSETS_DB`` if none); a local path made absolute
    (relative: to the working directory, the project root under dg)."""
    uri = uri or os.environ.get(CATALOG_ENV)
    if not uri:
        raise ComponentError(f"{where}: no catalog: set `catalog:` or ${CATALOG_ENV}")
    return uri if "://" in uri else os.path.abspath(os.path.expanduser(uri))


_VIEW_TEMPLATE = """\
type: mv_assets.ViewComponent

# A materialized view of an mv_assets catalog (docs/dagster.md, "Dagster Components").
# Its assets are built by the project's mv_assets.CatalogComponent (scaffold one:
# `dg scaffold defs mv_assets.CatalogComponent catalog`). Check with `dg check defs`.
attributes:
  name: {name}
  source: documents                 # a table (or view) of the catalog
  filter: "lang = 'en'"             # optional SQL predicate on source rows
  columns:                          # optional (default: every source column)
    doc_id: doc_id                  # a source column
    chars: length(body)             # a SQL expression
    words:                          # a UDF column: an @mv.udf by module:function
      udf: mv_assets.demo:word_count
  # joins:                          # a join view: other tables matched by key (names qualified: authors.name)
  #   - table: authors
  #     left_on: author_id            # or on: <a column both have>
  #     right_on: id
  #     how: left                     # inner (default) | left
  # group_by: [lang]                # an aggregate view: its keys, and
  # aggregates: {{n: "count(*)", avg_chars: "avg(chars)"}}
  # function: my_pkg.chunkers:split # a chunk or table-function view: a @chunker or @udtf by module:function
  # refresh_policy: eager           # eager | manual | {{kind: cron, cron: "0 6 * * *"}}
  #                                 # | {{kind: ttl, ttl_seconds: 3600}} | {{kind: staleness, max_staleness_pct: 10}}
  # owners: ["team:ml"]
  # tags: {{domain: search}}
  # catalog: /path/to/catalog       # only where the project has several CatalogComponents
"""

_CATALOG_TEMPLATE = """\
type: mv_assets.CatalogComponent

# Every table and view of an mv_assets catalog as Dagster assets, with the views of this
# project's mv_assets.ViewComponents (docs/dagster.md, "Dagster Components").
attributes:
  # catalog: /path/to/catalog       # a path or object-store URI (default: $MV_ASSETS_DB)
  # views_module: my_pkg.views      # views declared in Python too: views(db) -> {{name: query}}
  automation: sensor                # sensor | conditions (AutomationConditions from refresh policies)
  # sensor_interval_seconds: 15
  # sensors_running: true
  # runner: spark                   # spark | inline (default $MV_ASSETS_RUNNER, else spark)
"""


class ViewComponentScaffolder(dg.Scaffolder):
    """``dg scaffold defs mv_assets.ViewComponent <name>``: a commented defs.yaml."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        _write_template(request, _VIEW_TEMPLATE.format(name=request.target_path.name))


class CatalogComponentScaffolder(dg.Scaffolder):
    """``dg scaffold defs mv_assets.CatalogComponent <name>``: a commented defs.yaml."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        _write_template(request, _CATALOG_TEMPLATE.format())


def _write_template(request: dg.ScaffoldRequest, text: str) -> None:
    if request.scaffold_format != "yaml":  # python: dagster's component.py stub
        scaffold_component(request)
        return
    request.target_path.mkdir(parents=True, exist_ok=True)
    with open(request.target_path / "defs.yaml", "w") as f:
        f.write(text)


@dg.scaffold_with(ViewComponentScaffolder)
class ViewComponent(dg.Component, dg.Resolvable, dg.Model):
    """A materialized view of an mv_assets catalog, declared in yaml.

    ``columns`` maps each output column to a source column name, a SQL
    expression, or ``{udf: "module:function"}`` (an ``@mv.udf``; ``inputs:
    [col, ...]`` binds its arguments to other columns). No ``columns``: every
    source column. ``joins`` (each ``{table, on | left_on + right_on, how}``)
    makes a join view (names may be qualified: ``authors.name``);
    ``group_by`` with ``aggregates`` an aggregate view; ``function`` (a
    ``@chunker`` or ``@udtf`` by ``module:function``) a chunk or
    table-function view. The view's assets are built by the project's
    :class:`CatalogComponent` of the same catalog, with the graph's others.
    """

    name: str
    source: str
    filter: str | None = None
    columns: dict[str, Any] | None = None
    joins: list[dict[str, Any]] | None = None
    group_by: list[str] | None = None
    aggregates: dict[str, str] | None = None
    function: str | None = None
    refresh_policy: str | dict[str, Any] | None = None
    owners: list[str] | None = None
    tags: dict[str, str] | None = None
    catalog: str | None = None  # default: the project's CatalogComponent (the only one), else $MV_ASSETS_DB
    # the view as declared, checked against its catalog by its own build_defs (so that `dg check defs`
    # blames this view's defs.yaml for a mistake only the catalog shows), for the CatalogComponent
    _checked: tuple[str, DeclaredView] | None = PrivateAttr(default=None)

    def _where(self) -> str:
        return f"view {self.name!r} (mv_assets.ViewComponent)"

    def model_post_init(self, context: Any, /) -> None:
        self.check_attributes()  # when its defs.yaml is loaded: `dg check defs` names that file

    def check_attributes(self) -> None:
        """What can be checked without the catalog: UDF references, policy, owners and tags."""
        for col, spec in (self.columns or {}).items():
            self._column(col, spec)
        for j in self.joins or []:
            if not isinstance(j, dict) or "table" not in j or set(j) - _JOIN_KEYS:
                raise ComponentError(f"{self._where()}: each join is {{table, on | left_on + right_on, how}}, "
                                     f"got {j!r}")
        if (self.group_by is None) != (self.aggregates is None):
            raise ComponentError(f"{self._where()}: group_by and aggregates go together (an aggregate view)")
        if self.function is not None:
            resolve_function(self.function, self._where())
        parse_policy(self.refresh_policy, self._where())
        try:
            Ownership.of(self.owners, self.tags)  # (as DeclaredView validates them)
        except ValueError as exc:
            raise ComponentError(f"{self._where()}: {exc}") from exc

    def _column(self, col: str, spec: Any) -> Any:
        where = f"{self._where()}, column {col!r}"
        if isinstance(spec, str) and spec.strip():
            return spec
        if isinstance(spec, dict) and "udf" in spec and set(spec) <= {"udf", "inputs"}:
            udf = resolve_reference(spec["udf"], where)
            inputs = spec.get("inputs")
            if inputs is None:
                return udf
            if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
                raise ComponentError(f"{where}: inputs must be a list of column names, got {inputs!r}")
            return (udf, inputs)
        raise ComponentError(f"{where}: a column is a source column name, a SQL expression or "
                             f"{{udf: 'module:function'}} (with optional inputs: [...]), got {spec!r}")

    def declared(self, db: Connection) -> DeclaredView:
        """The view as code declares it, validated against the catalog (nothing written)."""
        where = self._where()
        if self.source not in db.table_names():
            raise ComponentError(f"{where}: source {self.source!r} is not a table or view of {db.uri} "
                                 f"(it has {', '.join(sorted(db.table_names())) or 'none'})")
        query = db.open_table(self.source).search(None)
        try:
            for j in self.joins or []:
                if j["table"] not in db.table_names():
                    raise ComponentError(f"{where}: joined table {j['table']!r} is not a table or view of {db.uri}")
                query = query.join(db.open_table(j["table"]), j.get("on"), left_on=j.get("left_on"),
                                   right_on=j.get("right_on"), how=j.get("how", "inner"))
            if self.filter:
                query = query.where(self.filter)
            if self.columns:
                query = query.select({col: self._column(col, spec) for col, spec in self.columns.items()})
            if self.group_by is not None:
                query = query.group_by(*self.group_by).agg(self.aggregates or {})
            function = resolve_function(self.function, where) if self.function is not None else None
            # (unknown columns, bad SQL, UDF inputs the sources lack: refused here)
            return DeclaredView(query, owners=self.owners, tags=self.tags,
                                refresh_policy=parse_policy(self.refresh_policy, where), function=function,
                                name=self.name)
        except ComponentError:
            raise
        except ValueError as exc:
            raise ComponentError(f"{where}: {exc}") from exc

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        catalogs = context.component_tree.get_all_components(of_type=CatalogComponent)
        uri = _view_catalog(self, catalogs)
        if not any(c.uri() == uri for c in catalogs):
            raise ComponentError(
                f"{self._where()} at {context.path}: no mv_assets.CatalogComponent for catalog {uri!r} in this "
                "project builds its assets: scaffold one (`dg scaffold defs mv_assets.CatalogComponent catalog`)"
                + (f"; the project's catalogs are {sorted(c.uri() for c in catalogs)}" if catalogs else ""))
        try:
            db = connect(uri, create=False)
        except CatalogNotFoundError:
            return dg.Definitions()  # (the CatalogComponent says so)
        if self.source in db.table_names():  # (over a view declared here and not created yet: see the catalog's)
            self._checked = (uri, self.declared(db))
        return dg.Definitions()  # its assets are the CatalogComponent's (see the module docstring)


def _build_views_first(context: dg.ComponentLoadContext) -> None:
    """Build each ViewComponent before the catalog's assets: each checks its
    view against its catalog there, so a mistake only the catalog shows (a
    column the source lacks) fails that view's defs.yaml, not the catalog's,
    whichever order the project's folders come in (built once: Dagster keeps
    what a component built)."""
    tree = context.component_tree
    for loc, decl in tree.find_root_decl().iterate_loc_component_decl_pairs():
        kind = getattr(decl, "component_type", None)
        if isinstance(kind, type) and issubclass(kind, ViewComponent):
            tree.build_defs_at_path(loc)


@dg.scaffold_with(CatalogComponentScaffolder)
class CatalogComponent(dg.Component, dg.Resolvable, dg.Model):
    """Every table and view of an mv_assets catalog as Dagster assets: the
    yaml counterpart of ``definitions.py`` (:func:`build_definitions`), with
    the views of the project's :class:`ViewComponent` s and of ``views_module``."""

    catalog: str | None = None  # default: $MV_ASSETS_DB
    views_module: str | None = None  # a module with views(db) (dotted name or .py path), as $MV_ASSETS_VIEWS
    automation: str = "sensor"  # or "conditions" (AutomationConditions)
    sensor_interval_seconds: int = 15
    sensors_running: bool = True
    runner: str | None = None  # "spark" or "inline"; default $MV_ASSETS_RUNNER, else spark

    def model_post_init(self, context: Any, /) -> None:
        where = "mv_assets.CatalogComponent"  # (checked when its defs.yaml is loaded)
        if self.automation not in AUTOMATIONS:
            raise ComponentError(f"{where}: automation must be one of {', '.join(AUTOMATIONS)}, "
                                 f"got {self.automation!r}")
        if self.runner not in (None, "spark", "inline"):
            raise ComponentError(f"{where}: runner must be 'spark' or 'inline', got {self.runner!r}")
        if self.sensor_interval_seconds < 1:
            raise ComponentError(f"{where}: sensor_interval_seconds must be >= 1, got {self.sensor_interval_seconds}")

    def uri(self) -> str:
        return _catalog_uri(self.catalog, "mv_assets.CatalogComponent")

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        where = f"mv_assets.CatalogComponent at {context.path}"
        uri = self.uri()
        catalogs = context.component_tree.get_all_components(of_type=CatalogComponent)
        if sum(c.uri() == uri for c in catalogs) > 1:
            raise ComponentError(f"{where}: more than one mv_assets.CatalogComponent for catalog {uri!r}: "
                                 "keep one (each would build the same assets)")
        try:
            db = connect(uri, create=False)
        except CatalogNotFoundError as exc:
            raise ComponentError(f"{where}: {exc}") from exc
        _build_views_first(context)
        views = [v for v in context.component_tree.get_all_components(of_type=ViewComponent)
                 if _view_catalog(v, catalogs) == uri]
        module = self.views_module
        if module and (module.endswith(".py") or os.sep in module) and not os.path.isabs(module):
            module = str(context.path / module)  # a .py path: relative to this defs.yaml's folder
        declared: dict[str, Any] = load_declared(module, db) if module else {}
        for view in views:
            if view.name in declared:
                raise ComponentError(f"view {view.name!r} is declared twice (two mv_assets.ViewComponents, or a "
                                     f"ViewComponent and views_module {self.views_module!r}): keep one")
            if view.source not in db.table_names() and view.source in {v.name for v in views} | set(declared):
                # over a declared view not created yet: loaded once its first materialization created it
                log.warning(f"view {view.name!r} is not loaded: its source view {view.source!r} is not created yet "
                            "(materialize it first, then reload)")
                continue
            checked = view._checked
            declared[view.name] = checked[1] if checked is not None and checked[0] == uri else view.declared(db)
        resource = None
        if self.runner:
            options = db.storage_options if db.storage_options_given else None
            resource = MvAssetsResource.from_env(uri, storage_options=options).model_copy(
                update={"runner": self.runner})
        return build_definitions(db, views=declared, resource=resource, automation=self.automation,
                                 sensor_interval_seconds=self.sensor_interval_seconds,
                                 sensors_running=self.sensors_running)
