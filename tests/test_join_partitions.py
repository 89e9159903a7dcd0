"""A join view's refresh says which partitions (first-table fragments) hold
rows it changed, so Dagster marks those alone: a joined table's change
reaches the fragments of the first-table rows that match it, not every one.
Expected fragments are read with plain pylance (row addresses), never
through mv_assets' join code."""

import lance
import numpy as np
import pyarrow as pa
import pytest

import mv_assets as mv


def _orders(oids, cids):
    return pa.table({"oid": pa.array(oids, pa.int64()), "cid": pa.array(cids, pa.int64())})


@pytest.fixture
def shop(tmp_path):
    """orders in four fragments (one per add), customers 1..4: fragment k's orders are
    of customer k+1, and fragment 3 holds one order of customer 2 too."""
    db = mv.connect(str(tmp_path / "db"))
    orders = db.create_table("orders", _orders([10, 11], [1, 1]))
    orders.add(_orders([20, 21], [2, 2]))
    orders.add(_orders([30, 31], [3, 3]))
    orders.add(_orders([40, 41, 42], [4, 4, 2]))
    db.create_table("customers", pa.table({"cid": [1, 2, 3, 4], "name": ["a", "b", "c", "d"]}))
    view = db.create_materialized_view(
        "order_names", orders.search(None).join(db.open_table("customers"), on="cid").select(
            {"oid": "oid", "name": "customers.name"}))
    view.refresh()
    return db, view


def _fragments_of(db, where: str) -> list[int]:
    """The orders fragments holding rows passing ``where``, by plain pylance."""
    rows = lance.dataset(db.open_table("orders").uri).to_table(columns=[], filter=where, with_row_address=True)
    return sorted({int(a) >> 32 for a in rows.column("_rowaddr").to_pylist()})


def test_a_dimension_update_touches_the_fragments_of_its_orders(shop):
    db, view = shop
    assert len(lance.dataset(db.open_table("orders").uri).get_fragments()) == 4
    lance.dataset(db.open_table("customers").uri).update({"name": "'B'"}, where="cid = 2")  # another writer
    result = view.refresh()
    assert result.rows_updated == 3
    assert result.first_fragments == _fragments_of(db, "cid = 2") and len(result.first_fragments) == 2


def test_an_unmatched_dimension_change_touches_none(shop):
    db, view = shop
    db.open_table("customers").add(pa.table({"cid": [9], "name": ["z"]}))  # no order of customer 9
    result = view.refresh()
    assert result.rows_inserted == 0 and result.first_fragments == []


def test_first_table_changes_touch_their_own_fragments(shop):
    db, view = shop
    before = _fragments_of(db, "oid = 30")
    db.open_table("orders").delete("oid = 30")
    result = view.refresh()
    assert result.rows_deleted == 1 and result.first_fragments == before
    db.open_table("orders").add(_orders([50], [1]))
    result = view.refresh()
    assert result.first_fragments == _fragments_of(db, "oid = 50") and result.rows_inserted == 1
    # an order moved to another customer by an update: its new fragment and the one it left
    was = _fragments_of(db, "oid = 11")
    lance.dataset(db.open_table("orders").uri).update({"cid": "3"}, where="oid = 11")
    result = view.refresh()
    assert result.first_fragments == sorted(set(was) | set(_fragments_of(db, "oid = 11")))
    assert sorted(view.to_arrow().column("oid").to_pylist()) == [10, 11, 20, 21, 31, 40, 41, 42, 50]


def test_a_dimension_delete_touches_the_fragments_of_its_orders(shop):
    db, view = shop
    db.open_table("customers").delete("cid = 3")
    result = view.refresh()
    assert result.rows_deleted == 2 and result.first_fragments == _fragments_of(db, "cid = 3")


def test_a_full_refresh_says_every_fragment(shop):
    db, view = shop
    db.open_table("customers").delete("cid = 3")
    assert view.refresh(mode="full").first_fragments is None
    assert np.array_equal(sorted(view.to_arrow().column("oid").to_pylist()), [10, 11, 20, 21, 40, 41, 42])


def test_a_joined_tables_sensor_run_marks_the_partitions_holding_changed_rows(tmp_path, monkeypatch):
    """In Dagster: a customer renamed reaches the one orders fragment holding
    its orders; the run records every partition it names (each reflects the
    new customers version: none reads Unsynced), and only that one gets a new
    data version (the others keep theirs: their rows did not change)."""
    import dagster as dg
    from dagster._utils.test.data_versions import get_stale_status_resolver
    from dagster_helpers import apply_partition_requests, evaluate_sensor, run_requested

    from mv_assets.dagster import MvAssetsResource, build_definitions, partitions_def_name

    monkeypatch.delenv("MV_ASSETS_ARRANGEMENT_DIR", raising=False)  # (where a Dagster run keeps them: its default)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    orders = db.create_table("orders", _orders([10, 11], [1, 1]))
    orders.add(_orders([20, 21], [2, 2]))
    orders.add(_orders([30], [3]))
    customers = db.create_table("customers", pa.table({"cid": [1, 2, 3], "name": ["a", "b", "c"]}))
    db.create_materialized_view("order_names", orders.search(None).join(customers, on="cid").select(
        {"oid": "oid", "name": "customers.name"}))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    key = dg.AssetKey(["order_names"])
    every = [*repo.assets_defs_by_key.values(), *(defs.get_assets_def(dg.AssetKey([n])) for n in ("orders",
                                                                                                    "customers"))]
    cursors: dict = {}

    def tick(name):
        result = evaluate_sensor(repo.get_sensor_def(f"{name}_changes"), instance=instance,
                                 cursor=cursors.get(name), definitions=defs, resources=defs.resources)
        cursors[name] = result.cursor
        apply_partition_requests(instance, result)
        assert all(r.success for r in run_requested(defs, instance, result))
        return result

    def latest() -> dict[str, tuple[int, str]]:
        """Each partition's latest materialization: its storage id and data version."""
        parts = instance.get_dynamic_partitions(partitions_def_name("orders"))
        ids = instance.get_latest_storage_id_by_partition(key, dg.DagsterEventType.ASSET_MATERIALIZATION)
        tags = instance.event_log_storage.get_latest_tags_by_partition(
            key, dg.DagsterEventType.ASSET_MATERIALIZATION, ["dagster/data_version"], asset_partitions=parts)
        return {p: (ids.get(p, 0), tags.get(p, {}).get("dagster/data_version", "")) for p in parts}

    with dg.instance_for_test() as instance:
        tick("orders")
        tick("customers")
        first = latest()
        assert len(first) == 3
        lance.dataset(customers.uri).update({"name": "'B'"}, where="cid = 2")  # another writer
        (run,) = tick("customers").run_requests or []
        assert run.tags["dagster/asset_partition_range_start"] != run.tags["dagster/asset_partition_range_end"]
        after = latest()
        touched = [str(f) for f in _fragments_of(db, "cid = 2")]
        assert len(touched) == 1
        assert all(after[p][0] > first[p][0] for p in after)  # every partition recorded by the run
        assert {p for p in after if after[p][1] != first[p][1]} == set(touched)  # one new data version
        for p in after:  # each says whether its rows changed
            (record,) = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[p]), limit=1).records
            md = record.asset_materialization.metadata  # pyright: ignore[reportOptionalMemberAccess]
            assert md["rows_changed"].value is (p in touched)
        assert sorted(r["name"] for r in db.open_view("order_names").to_arrow().to_pylist()) == ["B", "B", "a", "a",
                                                                                                  "c"]
        # the run kept the join's arrangements on disk for the runs after it (a process each)
        kept = tmp_path / "home" / ".cache" / "mv_assets" / "arrangements"
        assert len(list(kept.rglob("current.json"))) == 2
        resolver = get_stale_status_resolver(instance, every)
        assert {p: resolver.get_status(key, p).value for p in after} == {p: "FRESH" for p in after}


@mv.udf
def shout(name: str) -> str:
    return name.upper()


def test_a_task_reads_whole_only_the_view_rows_it_may_copy_udf_values_from(tmp_path):
    """A customer renamed (a column the UDF reads): none of its orders' view
    rows can give their value, so the task reads none of them (each order's
    version comes with the plan, from the view's arrangement); a tier change
    (a column the UDF does not read): every value is copied, those rows are
    read. Values and calls exact."""
    db = mv.connect(str(tmp_path / "db"))
    orders = db.create_table("orders", _orders([10, 11, 20, 21, 30], [1, 1, 2, 2, 3]))
    customers = db.create_table("customers", pa.table({"cid": [1, 2, 3], "name": ["a", "b", "c"],
                                                       "tier": ["x", "y", "z"]}))
    view = db.create_materialized_view("loud", orders.search(None).join(customers, on="cid").select(
        {"oid": "oid", "tier": "customers.tier", "loud": (shout, ["customers.name"])}))
    view.refresh()
    lance.dataset(customers.uri).update({"name": "'bee'"}, where="cid = 2")
    (task,) = view.plan_refresh().tasks
    reuse = task.kind_args["reuse"]
    assert reuse["rows"] == [] and "version_rows" not in reuse and len(reuse["provenance"]["__source_row_id"]) == 2
    pylance = lance.dataset(orders.uri).to_table(columns=["oid", "_row_last_updated_at_version"], with_row_id=True)
    by_id = dict(zip(pylance.column("_rowid").to_pylist(), pylance.column("_row_last_updated_at_version").to_pylist(),
                     strict=True))
    ids, versions = task.kind_args["known_versions"]
    assert sorted(ids) == sorted(reuse["provenance"]["__source_row_id"]) and versions == [by_id[i] for i in ids]
    result = view.refresh()
    assert result.udf_rows_computed == {"loud": 2} and result.rows_updated == 2
    lance.dataset(customers.uri).update({"tier": "'w'"}, where="cid = 1")
    (task,) = view.plan_refresh().tasks
    assert len(task.kind_args["reuse"]["rows"]) == 2 and "known_versions" not in task.kind_args
    result = view.refresh()
    assert result.udf_rows_computed == {"loud": 0} and result.rows_updated == 2
    got = sorted(view.to_arrow().select(["oid", "tier", "loud"]).to_pylist(), key=lambda r: r["oid"])
    assert got == [{"oid": 10, "tier": "w", "loud": "A"}, {"oid": 11, "tier": "w", "loud": "A"},
                   {"oid": 20, "tier": "y", "loud": "BEE"}, {"oid": 21, "tier": "y", "loud": "BEE"},
                   {"oid": 30, "tier": "z", "loud": "C"}]
    # each view row's source version is its order's, as plain pylance reads it
    versions = lance.dataset(orders.uri).to_table(columns=["oid", "_row_last_updated_at_version"])
    want = dict(zip(versions.column("oid").to_pylist(), versions.column("_row_last_updated_at_version").to_pylist(),
                    strict=True))
    rows = lance.dataset(view.uri).to_table(columns=["oid", "__source_row_version"]).to_pylist()
    assert all(r["__source_row_version"] == want[r["oid"]] for r in rows)
