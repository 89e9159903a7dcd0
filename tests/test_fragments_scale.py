"""Sources of many fragments in Dagster: what a tick, a run and a one-fragment
run cost counts events and fragments read, never seconds (bench/
bench_catalog_scale.py --fragments times them); a compaction policy keeps a
table under Dagster's dynamic partitions per asset."""

import dagster as dg
import lance
import pyarrow as pa
import pytest
from dagster._core.definitions.observe import observe  # not exported by dagster
from dagster_helpers import apply_partition_requests, evaluate_sensor, run_requested

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.assets import partitions_def_name

K = dg.AssetKey


def _fragmented(path, n: int) -> mv.Connection:
    """src: ``n`` fragments of 2 rows (one Append commit of ``n - 1`` written
    fragments after the first), a view v over it."""
    db = mv.connect(str(path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": 0, "x": 0}, {"id": 1, "x": 1}], primary_key="id")
    ds = lance.dataset(src.uri)
    rows = pa.table({"id": pa.array(range(2, 2 * n), pa.int64()), "x": pa.array(range(2, 2 * n), pa.int64())})
    frags = lance.fragment.write_fragments(rows.cast(ds.schema), src.uri, schema=ds.schema, max_rows_per_file=2)
    lance.LanceDataset.commit(src.uri, lance.LanceOperation.Append(frags), read_version=ds.version)
    db.create_materialized_view("v", src.search(None).where("x >= 0").select({"id": "id", "x": "x"}))
    return db


def _fragments_made(monkeypatch) -> list:
    """A list that grows by one with each Lance fragment object made from now on."""
    made: list = []
    real = lance.fragment.LanceFragment.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(lance.fragment.LanceFragment, "__init__", counting)
    return made


def _observations(events) -> list:
    return [e for e in events if isinstance(e, dg.AssetObservation)]


def test_a_first_tick_over_many_fragments_observes_none_and_partitions_stay_exact(tmp_path):
    """120 fragments written once: the first tick adds their 120 partitions in
    one request and emits no observation (before: one per fragment, stored one
    by one by the daemon), the run records 120 materializations and observes
    each fragment once, in one batch (so the source shows its partitions'
    data versions, not "Never observed"), and every partition is in sync.
    A delete in one fragment: the
    next tick observes that fragment alone, its partition is Unsynced and
    only it; "Observe sources" then observes nothing more."""
    from dagster._utils.test.data_versions import get_stale_status_resolver

    n = 120
    db = _fragmented(tmp_path / "cat", n)
    src = db.open_table("src")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    sensor = repo.get_sensor_def("src_changes")
    every = [*repo.assets_defs_by_key.values(), defs.get_assets_def(K(["src"]))]
    sample = ["0", "1", "57", str(n - 1)]
    with dg.instance_for_test() as instance:
        def statuses(parts):
            resolver = get_stale_status_resolver(instance, every)
            return [resolver.get_status(K(["v"]), p).value for p in parts]

        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        assert _observations(first.asset_events) == []
        (add,) = first.dynamic_partitions_requests or []
        assert len(add.partition_keys) == n
        (done,) = run_requested(defs, instance, first)
        mats = [e for e in done.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
        assert len(mats) == n
        obs = [e for e in done.all_events if e.event_type_value == "ASSET_OBSERVATION"]
        assert sorted(int(e.partition) for e in obs) == list(range(n))  # each fragment once
        assert {e.event_specific_data.asset_observation.tags["dagster/data_version"] for e in obs} == set(
            src.fragment_data_versions().values())
        assert statuses(sample) == ["FRESH"] * len(sample)
        assert db.open_table("v").count_rows() == 2 * n

        src.delete("id = 115")  # fragment 57
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        assert [(e.partition, e.tags["dagster/data_version"]) for e in _observations(tick.asset_events)] == [
            ("57", src.fragment_data_versions([57])[57])]
        apply_partition_requests(instance, tick)
        assert statuses(sample) == ["FRESH", "FRESH", "STALE", "FRESH"]
        observed = observe([defs.get_assets_def(K(["src"]))], instance=instance)  # "Observe sources"
        assert observed.success and observed.asset_observations_for_node("src") == []
        (run,) = tick.run_requests or []
        assert run.tags["dagster/asset_partition_range_start"] == run.tags["dagster/asset_partition_range_end"] == "57"
        run_requested(defs, instance, dg.SensorResult(run_requests=tick.run_requests))  # events applied above
        assert statuses(sample) == ["FRESH"] * len(sample)
        assert 115 not in db.open_table("v").to_arrow().column("id").to_pylist()


def test_data_versions_of_a_few_fragments_read_only_those(tmp_path, monkeypatch):
    """A one-fragment run reads its fragment's data version: the table's other
    fragments are not listed (before: every fragment's metadata, per run)."""
    db = _fragmented(tmp_path / "cat", 60)
    src = db.open_table("src")
    made = _fragments_made(monkeypatch)
    assert src.fragment_data_versions([7, 999]) == {7: src.fragment_data_versions([7])[7]}
    assert src.fragment_count() == 60
    made.clear()
    src.fragment_data_versions([7])
    src.fragment_count()
    assert len(made) <= 1
    src.fragment_data_versions()
    assert len(made) >= 60  # all of them: every fragment read


def test_a_one_fragment_refresh_makes_no_object_for_the_tables_other_fragments(tmp_path, monkeypatch):
    """A refresh scoped to one fragment (a partition's run) and the count of
    the view's rows by fragment look their fragments up by id: no Lance
    fragment object is made for each of the table's others (before: every
    fragment's, twice, ~0.3 s of a one-fragment run at 10,000 fragments), and
    what the refresh does is what a whole refresh would."""
    from mv_assets.ops.refresh import view_rows_by_fragment

    db = _fragmented(tmp_path / "cat", 80)
    view = db.open_view("v")
    view.refresh()
    src = db.open_table("src")
    lance.dataset(src.uri).update({"x": "x + 100"}, where="id = 21")  # (pylance moves it to a new fragment)
    (fragment,) = [f.fragment_id for f in lance.dataset(src.uri).get_fragments()
                   if 21 in f.to_table(columns=["id"]).column("id").to_pylist()]
    made = _fragments_made(monkeypatch)
    result = view.refresh(fragments=[fragment])
    counts = view_rows_by_fragment(view.uri, src.uri, lance.dataset(src.uri).version, [fragment, 3])
    assert len(made) <= 8, len(made)  # the scope's and the new ones: never one per fragment (80 here)
    monkeypatch.undo()
    assert result.rows_updated + result.rows_inserted >= 1
    assert counts == {fragment: lance.dataset(src.uri).get_fragment(fragment).count_rows(), 3: 2}
    got = {r["id"]: r["x"] for r in view.to_arrow().to_pylist()}
    assert got == {r["id"]: r["x"] for r in lance.dataset(src.uri).to_table(columns=["id", "x"]).to_pylist()}


def test_a_compaction_policy_compacts_in_the_lineages_run_and_the_sensor_retires_the_partitions(tmp_path, monkeypatch):
    """Past the policy's fragments the lineage's run compacts the source (views
    unchanged, nothing recomputed), and the next tick retires the partitions
    of the merged fragments: the partition count follows the fragment count.
    The sensor's warning names the policy; without one, what to do."""
    import mv_assets.api.table as table_module

    db = _fragmented(tmp_path / "cat", 30)
    src = db.open_table("src")
    with pytest.raises(ValueError, match="max_fragments must be an int >= 1, got 0"):
        src.set_compaction_policy(0)
    assert src.compaction_policy is None
    monkeypatch.setattr(table_module, "FRAGMENT_WARNING", 20)
    assert "set a compaction policy" in (src.fragments_warning() or "")
    src.set_compaction_policy(10)
    assert src.compaction_policy == mv.CompactionPolicy(max_fragments=10)
    assert "its compaction policy (over 10 fragments) compacts it" in (src.fragments_warning() or "")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    sensor = defs.get_repository_def().get_sensor_def("src_changes")
    pname = partitions_def_name("src")
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        run_requested(defs, instance, first)
        assert src.fragment_count() == 1  # compacted after the refresh
        assert len(instance.get_dynamic_partitions(pname)) == 30
        view_before = db.open_table("v").to_arrow().sort_by("id")
        after = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                                resources=defs.resources)
        run_requested(defs, instance, after)
        assert instance.get_dynamic_partitions(pname) == [str(f) for f in src.fragment_ids()]
        assert db.open_table("v").to_arrow().sort_by("id") == view_before
        src.set_compaction_policy(None)
        assert src.compaction_policy is None
        assert src.fragments_warning() is None  # 1 fragment


@mv.udf
def _tenfold(x: int) -> int:
    return 10 * x


def test_a_runs_materializations_are_stored_in_one_batch_per_asset_and_read_back_the_same(tmp_path, monkeypatch):
    """A run over every partition logs its materializations as one batch per
    asset (Dagster's batch metadata, as for a partition range's output), and
    mv_assets' SQLite event log (what ``make demo`` and the devserver's home
    use, with DAGSTER_EVENT_BATCH_SIZE) stores each batch at once: 3 writes
    for two views and a UDF column over 40 partitions, not 120 (~17 ms each one
    by one: ~200 s at 10,000 partitions). What the instance then answers is
    what Dagster's own SQLite storage answers for the same run stored one by
    one: every partition materialized with its own numbers and data versions,
    every partition in sync."""
    from dagster._utils.test.data_versions import get_stale_status_resolver

    from mv_assets.dagster.storage import BATCH_SIZE, BatchingSqliteEventLogStorage, sqlite_storage_yaml

    n = 40
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", str(BATCH_SIZE))
    keys = [K(["w"]), K(["w", "y"])]

    def run(home, batching: bool):
        db = _fragmented(home / "cat", n)  # (the same catalog for each, built anew)
        db.create_materialized_view("w", db.open_table("src").search(None).select({"id": "id", "y": _tenfold}))
        defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
        repo = defs.get_repository_def()
        sensor = repo.get_sensor_def("src_changes")
        every = [*repo.assets_defs_by_key.values(), defs.get_assets_def(K(["src"]))]
        home.mkdir(exist_ok=True)
        if batching:
            (home / "dagster.yaml").write_text(sqlite_storage_yaml(str(home)))
        with dg.DagsterInstance.from_config(str(home)) as instance:
            storage = instance.event_log_storage
            assert isinstance(storage, BatchingSqliteEventLogStorage) == batching
            one, batches = [], []
            store_one, store_batch = storage.store_event, storage.store_event_batch
            monkeypatch.setattr(storage, "store_event", lambda e: (one.append(e.dagster_event_type), store_one(e))[1])
            monkeypatch.setattr(storage, "store_event_batch",
                                lambda es: (batches.append((len(es), {e.dagster_event_type for e in es})),
                                            store_batch(es))[1])
            tick = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
            run_requested(defs, instance, tick)
            resolver = get_stale_status_resolver(instance, every)
            statuses = {resolver.get_status(k, str(p)).value for k in keys for p in range(n)}
            answers = {}
            for k in keys:
                for record in instance.fetch_materializations(k, limit=10_000).records:
                    mat = record.asset_materialization
                    assert mat is not None
                    metadata = {m: v.value for m, v in mat.metadata.items() if m != "run_duration_s"}
                    tags = {t: v for t, v in (mat.tags or {}).items() if "event_pointer" not in t}
                    answers[(k.to_user_string(), mat.partition)] = (metadata, tags)
                assert instance.get_materialized_partitions(k) == {str(p) for p in range(n)}
            materialized = one.count(dg.DagsterEventType.ASSET_MATERIALIZATION)
            # what the run's planned events recorded: each check's planned executions, each asset's last run
            planned_one = [t for t in one if t in (dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                                                   dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED)]
            (run_id,) = {r.run_id for r in instance.get_runs()}
            check_keys = sorted(defs.resolve_asset_graph().asset_check_keys, key=str)
            assert check_keys
            executions = {}
            for c in check_keys:
                history = storage.get_asset_check_execution_history(c, limit=1000)
                assert history and {h.run_id for h in history} == {run_id}
                executions[str(c)] = sorted((h.status.value, h.partition or "") for h in history)
            last_runs = {r.asset_entry.asset_key.to_user_string(): r.asset_entry.last_run_id
                         for r in instance.get_asset_records(keys)}
            assert last_runs == {k.to_user_string(): run_id for k in keys}
            return materialized, batches, statuses, answers, planned_one, executions

    plain = run(tmp_path / "plain", batching=False)
    batched = run(tmp_path / "batched", batching=True)
    # (the source's lineage: v, and w with its column w/y)
    assert plain[0] == 3 * n  # Dagster's SQLite storage: one write per materialization
    assert batched[0] == 0 and [b for b in batched[1] if dg.DagsterEventType.ASSET_MATERIALIZATION in b[1]] == [
        (n, {dg.DagsterEventType.ASSET_MATERIALIZATION})] * 3, batched[1]  # one batch per asset
    assert plain[2] == batched[2] == {"FRESH"}
    assert len(batched[3]) == 2 * n and batched[3] == plain[3]
    # The run's planned events (per asset and per check, logged as one batch at its creation): one by one
    # in Dagster's storage, in one batch here, recording the same check executions.
    assert plain[4] and batched[4] == [], (plain[4], batched[4])
    assert batched[5] == plain[5]
    w7 = batched[3][("w", "7")][0]
    assert (w7["source_fragment"], w7["rows_computed"]) == (7, 2)  # each partition its own numbers


def test_observe_sources_on_a_fresh_source_observes_every_partition(tmp_path):
    """"Observe sources" before any run: every partition of the source is
    observed at its data version (before: none, the source read "Never
    observed" in the UI); a second press observes nothing more."""
    n = 5
    db = _fragmented(tmp_path / "cat", n)
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    source = defs.get_assets_def(K(["src"]))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), [str(i) for i in range(n)])
        first = observe([source], instance=instance)
        versions = db.open_table("src").fragment_data_versions()
        assert sorted((e.partition, e.tags["dagster/data_version"]) for e in first.asset_observations_for_node("src")) == \
            sorted((str(f), v) for f, v in versions.items())
        again = observe([source], instance=instance)
        assert again.asset_observations_for_node("src") == []
