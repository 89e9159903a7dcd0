"""Join views in Dagster: an asset with every source upstream (each joined
source with all of its partitions), column lineage to each source's column,
in the lineage of its first table (partitioned by that table's fragments,
refreshed as a whole), and refreshed by the sensor of ANY source that moved:
its first table's, and each joined table's (a run of the view's own lineage
job)."""

import dagster as dg
import lance
import pyarrow as pa
from dagster._core.definitions.partitions.mapping import AllPartitionMapping
from dagster_helpers import apply_partition_requests, column_lineage, evaluate_sensor, run_requested

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions, partitions_def_name
from mv_assets.dagster.definitions import job_name

K = dg.AssetKey


@mv.udf(data_type=pa.string())
def caption(title: str, dur: float) -> str:
    return f"{title}|{dur}"


@mv.udf(data_type=pa.string())
def pair(a: float, b: float) -> str:
    return f"{a}|{b}"


@mv.udf(data_type=pa.string())
def shout(name: str) -> str:
    return name.upper()


def _catalog(tmp_path) -> mv.Connection:
    """clips (two fragments) ⋈ videos (read only by the join: no lineage of
    its own) ⟕ channels (a lineage of its own: a view over it and a computed
    column the join reads)."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    clips = db.create_table("clips", [{"id": i, "video_id": i % 4, "dur": float(i)} for i in range(6)],
                            primary_key="id")
    clips.add([{"id": i, "video_id": i % 4, "dur": float(i)} for i in range(6, 10)])
    videos = db.create_table("videos", [{"vid": v, "title": f"t{v}", "channel_id": v % 2} for v in range(3)],
                             primary_key="vid")
    channels = db.create_table("channels", [{"channel_id": c, "name": f"c{c}"} for c in range(2)],
                               primary_key="channel_id")
    channels.add_columns({"loud": (shout, ["name"])})
    channels.backfill("loud")
    db.create_materialized_view("channel_names", channels.search(None).select({"channel_id": "channel_id",
                                                                               "name": "name"}))
    q = (clips.search(None)
         .join(videos, left_on="video_id", right_on="vid", how="inner")
         .join(channels, on="channel_id", how="left")
         .where("clips.dur >= 2")
         .select({"cid": "clips.id", "title": "videos.title", "loud": "channels.loud", "twice": "dur * 2",
                  "cap": (caption, ["title", "dur"])}))
    db.create_materialized_view("clip_view", q)
    return db


def _oracle(db) -> list[dict]:
    """The join in plain Python over each source as it is now."""
    clips, videos, channels = (db.open_table(n).to_arrow().to_pylist() for n in ("clips", "videos", "channels"))
    out = []
    for c in clips:
        for v in (v for v in videos if v["vid"] == c["video_id"]):
            chs = [h for h in channels if h["channel_id"] == v["channel_id"]] or [None]
            for h in chs:
                if c["dur"] >= 2:
                    out.append({"cid": c["id"], "title": v["title"], "loud": h["loud"] if h else None,
                                "twice": c["dur"] * 2, "cap": f"{v['title']}|{c['dur']}"})
    return sorted(out, key=lambda r: (r["cid"], r["title"]))


def _rows(db) -> list[dict]:
    return sorted(db.open_table("clip_view").to_arrow().to_pylist(), key=lambda r: (r["cid"], r["title"]))


def _defs(db):
    return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))


def _ticker(sensors: dict, instance, defs):
    """``tick(name)``: evaluate the sensor of table ``name``, each from its own last cursor."""
    cursors: dict = {}

    def tick(name):
        result = evaluate_sensor(sensors[name], instance=instance, cursor=cursors.get(name), definitions=defs,
                                 resources=defs.resources)
        cursors[name] = result.cursor
        return result
    return tick


def _lineage(node) -> dict[str, set[tuple[str, str]]]:
    return column_lineage(node.metadata["dagster/column_lineage"])


def test_a_join_view_is_an_asset_with_every_source_upstream_and_column_lineage_to_each(tmp_path):
    db = _catalog(tmp_path)
    defs = _defs(db)
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    node = graph.get(K(["clip_view"]))
    # every source, and the computed column of a joined source it reads (an asset of its own)
    assert node.parent_keys == {K(["clips"]), K(["videos"]), K(["channels"]), K(["channels", "loud"])}
    assert graph.get(K(["clip_view", "cap"])).parent_keys == {K(["clip_view"])}  # its UDF column, downstream
    # in its first table's lineage: partitioned by clips' fragments, refreshed as a whole
    assert node.partitions_def.name == partitions_def_name("clips")
    assert "Join view over clips, inner join videos on clips.video_id = videos.vid, left join channels using " \
           "channel_id where clips.dur >= 2" in node.description
    assert "Refreshed as a whole in any partition run" in node.description
    # each partition of it reads all of each joined source (whatever that one's partitions)
    for joined in ("videos", "channels", "channels/loud"):
        key = K(joined.split("/"))
        assert isinstance(graph.get_partition_mapping(K(["clip_view"]), key), AllPartitionMapping), joined
    assert graph.get(K(["channels"])).partitions_def.name == partitions_def_name("channels")  # a lineage of its own
    assert graph.get(K(["videos"])).partitions_def is None  # read by the join only
    assert _lineage(node) == {
        "cid": {("clips", "id")}, "title": {("videos", "title")}, "loud": {("channels/loud", "loud")},
        "twice": {("clips", "dur")}, "cap": {("videos", "title"), ("clips", "dur")},
    }
    schema = node.metadata["dagster/column_schema"]
    schema = schema if isinstance(schema, dg.TableSchema) else schema.schema
    described = {c.name: c.description for c in schema.columns}
    assert described["title"] == "Copied from `videos`.`title`." and described["twice"] == "SQL: `dur * 2`."
    assert node.metadata["sources"] == "clips, videos, channels"
    # the engine's join checks (no check comparing view rows 1:1 with the first table's rows)
    checks = {k.name for k in graph.asset_check_keys if k.asset_key == K(["clip_view"])}
    assert checks == {"no_orphan_rows", "matches_source_query", "values_match_source", "udf_values_present"}
    # a sensor per source: the joined table without a lineage gets one, launching runs of the view's lineage
    sensors = {s.name: s for s in repo.sensor_defs}
    assert {"clips_changes", "videos_changes", "channels_changes"} <= set(sensors)
    assert {t.job_name for t in sensors["videos_changes"].targets} == {job_name("clips")}
    assert {t.job_name for t in sensors["channels_changes"].targets} == {job_name("channels"), job_name("clips")}
    assert "clip_view" in sensors["videos_changes"].description


def test_the_joined_tables_sensor_alone_refreshes_the_join_view(tmp_path):
    """The first table's sensor refreshes the join view with its lineage; an
    update of a joined table alone leaves that sensor idle, and the joined
    table's sensor requests a run of the view's lineage job that brings it to
    the new values (its UDF recomputed for the rows whose input changed)."""
    from dagster._utils.test.data_versions import get_stale_status_resolver

    db = _catalog(tmp_path)
    defs = _defs(db)
    repo = defs.get_repository_def()
    sensors = {n: repo.get_sensor_def(f"{n}_changes") for n in ("clips", "videos", "channels")}
    view = db.open_view("clip_view")
    every = [*repo.assets_defs_by_key.values(),
             *(defs.get_assets_def(K([n])) for n in ("clips", "videos", "channels"))]
    with dg.instance_for_test() as instance:
        tick = _ticker(sensors, instance, defs)

        def stale() -> set:
            resolver = get_stale_status_resolver(instance, every)
            parts = instance.get_dynamic_partitions(partitions_def_name("clips"))
            return {p for p in parts if resolver.get_status(K(["clip_view"]), p).value != "FRESH"}

        first = tick("clips")
        (run,) = first.run_requests
        assert {K(["clip_view"]), K(["clip_view", "cap"])} <= set(run.asset_selection)
        assert all(r.success for r in run_requested(defs, instance, first))
        assert _rows(db) == _oracle(db) and len(_rows(db)) == 6
        assert not tick("clips").run_requests  # it sees its run's new view version: nothing due
        for name in ("videos", "channels"):  # first ticks: observe; the view is current
            result = tick(name)
            assert not [r for r in result.run_requests or [] if K(["clip_view"]) in r.asset_selection]
            run_requested(defs, instance, result)
        mat = instance.get_latest_materialization_event(K(["clip_view"])).asset_materialization
        assert mat.metadata["source_versions"].value == view.source_versions
        history = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(K(["clip_view"]), "matches_source_query"), limit=1)
        assert history and history[0].status.value == "SUCCEEDED"
        assert not stale()

        # the joined table alone moves: its first table's sensor sees nothing to do...
        db.open_table("videos").update("vid = 1", values_sql={"title": "'renamed'"})
        assert not tick("clips").run_requests
        # ...the joined table's sensor requests a run of the view's lineage, in the view's lineage job
        result = tick("videos")
        apply_partition_requests(instance, result)
        assert stale()  # the observation of videos' new data version makes the view's partitions Unsynced
        (run,) = result.run_requests
        assert run.job_name == job_name("clips")
        assert set(run.asset_selection) == {K(["clip_view"]), K(["clip_view", "cap"])}
        assert all(r.success for r in run_requested(defs, instance, result))
        assert _rows(db) == _oracle(db) and {r["title"] for r in _rows(db)} == {"t0", "renamed", "t2"}
        assert view.status().versions_behind == 0
        mat = instance.get_latest_materialization_event(K(["clip_view"])).asset_materialization
        assert mat.metadata["run_rows_updated"].value + mat.metadata["run_rows_inserted"].value >= 1
        # what the join's plan read, and the arrangements it probed, on the materialization
        assert mat.metadata["run_work"].value["changed_rows"] == {"videos": 1}
        assert mat.metadata["run_work"].value["view_key_rows_read"] == 0
        assert mat.metadata["run_arrangements"].value["view"]["how"] in ("loaded", "kept") or \
            mat.metadata["run_arrangements"].value["view"]["how"].startswith("caught up")
        assert not stale()
        assert not tick("videos").run_requests and not tick("clips").run_requests  # nothing left to do

        # a joined table with a lineage of its own: one tick requests both lineages' runs
        db.open_table("channels").update("channel_id = 1", values_sql={"name": "'zed'"})
        result = tick("channels")
        apply_partition_requests(instance, result)
        jobs = sorted(r.job_name for r in result.run_requests)
        assert jobs == [job_name("channels"), job_name("clips")]
        # (its computed column is backfilled by its own lineage's run first; the join then reads it)
        for r in sorted(result.run_requests, key=lambda r: r.job_name != job_name("channels")):
            assert all(x.success for x in run_requested(defs, instance, dg.SensorResult(run_requests=[r])))
        assert db.open_table("channels").plan_backfill("loud").rows == 0
        assert _rows(db) == _oracle(db) and "ZED" in {r["loud"] for r in _rows(db)}
        assert db.open_view("clip_view").status().versions_behind == 0


def test_materializing_the_join_view_from_its_asset_refreshes_it_whole(tmp_path):
    """"Materialize" on one partition: the whole join view is refreshed (it has
    no rows of its own per first-table fragment), equal to the join."""
    db = _catalog(tmp_path)
    defs = _defs(db)
    repo = defs.get_repository_def()
    frags = [str(f) for f in db.open_table("clips").fragment_ids()]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("clips"), frags)
        db.open_table("channels").backfill("loud")
        assets = [repo.assets_defs_by_key[K(["clip_view"])]]
        assert dg.materialize(assets, instance=instance, partition_key=frags[0],
                              selection=[K(["clip_view"]), K(["clip_view", "cap"])]).success
        assert _rows(db) == _oracle(db)
        db.open_table("videos").add([{"vid": 3, "title": "t3", "channel_id": 0}])  # clips with video_id 3 match now
        assert dg.materialize(assets, instance=instance, partition_key=frags[-1],
                              selection=[K(["clip_view"]), K(["clip_view", "cap"])]).success
        assert _rows(db) == _oracle(db) and "t3" in {r["title"] for r in _rows(db)}


def test_the_demo_joins_documents_to_authors(tmp_path):
    """The demo's join: documents ⟕ authors with a UDF reading an author's
    column; two sources feed one view, and an edit of an author alone is
    refreshed by the authors sensor."""
    from mv_assets.demo import seed

    db = seed(str(tmp_path / "demo"))
    db.runner = mv.InlineRunner()
    defs = _defs(db)
    repo = defs.get_repository_def()
    node = repo.asset_graph.get(K(["doc_authors"]))
    assert node.parent_keys == {K(["documents"]), K(["authors"])}
    lineage = _lineage(node)
    assert ("authors", "name") in lineage["byline"] and ("documents", "body") in lineage["byline"]
    sensors = {s.name: s for s in repo.sensor_defs}
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensors["documents_changes"], instance=instance, definitions=defs,
                                resources=defs.resources)
        assert all(r.success for r in run_requested(defs, instance, first))
        tick = evaluate_sensor(sensors["authors_changes"], instance=instance, definitions=defs,
                               resources=defs.resources)
        run_requested(defs, instance, tick)
        view = db.open_view("doc_authors")
        assert view.status().versions_behind == 0 and view.count_rows() > 0
        db.open_table("authors").update("author_id = 1", values_sql={"name": "'Ada Byron'"})
        tick = evaluate_sensor(sensors["authors_changes"], instance=instance, cursor=tick.cursor, definitions=defs,
                               resources=defs.resources)
        (run,) = tick.run_requests
        assert K(["doc_authors", "byline"]) in run.asset_selection
        assert all(r.success for r in run_requested(defs, instance, tick))
        rows = view.to_arrow().to_pylist()
        assert any(r["author"] == "Ada Byron" and r["byline"].startswith("Ada Byron:") for r in rows)
        assert view.status().versions_behind == 0
    # declared in code as the demo runs it (MV_ASSETS_VIEWS=mv_assets.demo): its UDF column's code is
    # checked, as every other declared UDF column's is
    declared = build_definitions(db, views="mv_assets.demo",
                                 resource=MvAssetsResource(catalog_uri=db.uri, runner="inline")).get_repository_def()
    checked = {(k.asset_key.to_user_string(), k.name) for k in declared.asset_graph.asset_check_keys}
    assert ("doc_authors/byline", "udf_code_current") in checked
    assert ("doc_features/words", "udf_code_current") in checked


def test_a_join_of_a_view_of_its_own_lineage_is_refreshed_after_it_in_one_run(tmp_path):
    """A join view whose joined source is a view over its own first table:
    one lineage, one sensor; the run refreshes the joined view first (lineage
    order counts every source of a join), so the join is current after one run."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    clips = db.create_table("clips", [{"id": i, "dur": float(i)} for i in range(6)], primary_key="id")
    db.create_materialized_view("a_long", clips.search(None).where("dur >= 3").select({"id": "id", "d2": "dur * 2"}))
    q = clips.search(None).join(db.open_table("a_long"), on="id", how="inner").select(
        {"cid": "clips.id", "d2": "d2", "cap": (pair, ["a_long.d2", "dur"])})
    db.create_materialized_view("a_joined", q)  # (its name sorts first: the order comes from the lineage)
    defs = _defs(db)
    repo = defs.get_repository_def()
    assert {s.name for s in repo.sensor_defs} == {"clips_changes"}
    assert repo.asset_graph.get(K(["a_joined"])).parent_keys == {K(["clips"]), K(["a_long"])}
    sensor = repo.get_sensor_def("clips_changes")
    with dg.instance_for_test() as instance:
        cursor = None
        for change in (None, lambda: clips.add([{"id": 9, "dur": 9.0}]), lambda: clips.delete("id = 4")):
            if change:
                change()
            tick = evaluate_sensor(sensor, instance=instance, cursor=cursor, definitions=defs,
                                   resources=defs.resources)
            cursor = tick.cursor
            assert all(r.success for r in run_requested(defs, instance, tick))
            want = sorted((r["id"], r["dur"] * 2, f"{r['dur'] * 2}|{r['dur']}")
                          for r in clips.to_arrow().to_pylist() if r["dur"] >= 3)
            got = sorted((r["cid"], r["d2"], r["cap"]) for r in db.open_table("a_joined").to_arrow().to_pylist())
            assert got == want
            assert db.open_view("a_joined").status().versions_behind == 0


def test_with_automation_conditions_a_table_read_by_joins_only_is_observed(tmp_path):
    """automation="conditions": the join view carries its policy's condition,
    and a table read only as a joined source gets an <table>_observe sensor
    (its observations are what the condition sees move)."""
    db = _catalog(tmp_path)
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"),
                             automation="conditions")
    repo = defs.get_repository_def()
    assert {"clips_observe", "videos_observe", "channels_observe"} <= {s.name for s in repo.sensor_defs}
    assert repo.asset_graph.get(K(["clip_view"])).automation_condition is not None
    with dg.instance_for_test() as instance:
        db.open_table("videos").update("vid = 2", values_sql={"title": "'x'"})
        tick = evaluate_sensor(repo.get_sensor_def("videos_observe"), instance=instance, definitions=defs,
                               resources=defs.resources)
        assert [e.asset_key for e in tick.asset_events] == [K(["videos"])]


def test_a_join_view_declared_in_code_is_created_by_its_first_materialization(tmp_path):
    """A join view declared in code (views(db)) before it exists: the wiring
    describes it over every source and its first materialization creates and
    fills it, equal to the join; the code and the catalog agree after."""
    from mv_assets.api.declare import reconcile

    db = _catalog(tmp_path)
    db.drop_table("clip_view")
    clips, videos, channels = (db.open_table(n) for n in ("clips", "videos", "channels"))
    declared = {"clip_view": (clips.search(None)
                              .join(videos, left_on="video_id", right_on="vid", how="inner")
                              .join(channels, on="channel_id", how="left")
                              .where("clips.dur >= 2")
                              .select({"cid": "clips.id", "title": "videos.title", "loud": "channels.loud",
                                       "twice": "dur * 2", "cap": (caption, ["title", "dur"])}))}
    defs = build_definitions(db, views=declared, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    spec = repo.assets_defs_by_key[K(["clip_view"])]
    deps = {k for keys in spec.asset_deps.values() for k in keys}
    assert {K(["clips"]), K(["videos"]), K(["channels"])} <= deps
    frags = [str(f) for f in clips.fragment_ids()]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("clips"), frags)
        assert dg.materialize([spec], instance=instance, partition_key=frags[0],
                              selection=[K(["clip_view"]), K(["clip_view", "cap"])]).success
    assert _rows(db) == _oracle(db)
    assert reconcile(db, "clip_view", declared["clip_view"]).in_sync


def test_a_join_aggregate_is_one_asset_over_its_tables_refreshed_by_their_sensors(tmp_path):
    """Joins and GROUP BY in one view: one asset, every table upstream (the
    join kept under it is no asset), refreshed by the sensor of a joined table
    that moved, with the aggregate checks; its groups equal a plain-Python
    oracle over the tables at the versions it records."""
    db = _catalog(tmp_path)
    clips, videos = db.open_table("clips"), db.open_table("videos")
    db.create_materialized_view("per_title", clips.search(None).join(videos, left_on="video_id", right_on="vid")
                                .group_by("videos.title").agg({"n": "count(*)", "total": "sum(dur * 2)"}))
    defs = _defs(db)
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    node = graph.get(K(["per_title"]))
    assert node.parent_keys == {K(["clips"]), K(["videos"])}
    assert not [k for k in graph.get_all_asset_keys() if k.path[0].startswith("__mvjoin__")]
    assert "Aggregate view over the join of clips, videos: group by title" in node.description
    checks = {k.name for k in graph.asset_check_keys if k.asset_key == K(["per_title"])}
    assert checks == {"no_orphan_rows", "values_match_source"}
    sensors = {n: repo.get_sensor_def(f"{n}_changes") for n in ("clips", "videos")}
    assert "per_title" in sensors["videos"].description

    def oracle() -> dict:
        versions = db.open_view("per_title").source_versions
        cs = lance.dataset(clips.uri, version=versions["clips"]).to_table().to_pylist()
        vs = {v["vid"]: v for v in lance.dataset(videos.uri, version=versions["videos"]).to_table().to_pylist()}
        out: dict = {}
        for c in cs:
            if c["video_id"] in vs:
                n, t = out.get(vs[c["video_id"]]["title"], (0, 0.0))
                out[vs[c["video_id"]]["title"]] = (n + 1, t + c["dur"] * 2)
        return out

    def got() -> dict:
        return {r["title"]: (r["n"], r["total"]) for r in db.open_table("per_title").to_arrow().to_pylist()}

    with dg.instance_for_test() as instance:
        tick = _ticker(sensors, instance, defs)

        first = tick("clips")
        assert all(r.success for r in run_requested(defs, instance, first))
        run_requested(defs, instance, tick("videos"))
        assert got() == oracle() and got()
        db.open_table("videos").update("vid = 1", values_sql={"title": "'renamed'"})
        assert db.open_view("per_title").status().versions_behind == 1
        result = tick("videos")
        apply_partition_requests(instance, result)
        assert [r for r in result.run_requests if K(["per_title"]) in r.asset_selection]
        assert all(r.success for r in run_requested(defs, instance, result))
        assert got() == oracle() and "renamed" in got()
        assert db.open_view("per_title").status().versions_behind == 0
        history = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(K(["per_title"]), "values_match_source"), limit=1)
        assert history and history[0].status.value == "SUCCEEDED"
        assert not tick("videos").run_requests and not tick("clips").run_requests
