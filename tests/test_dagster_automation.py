"""Declarative automation (``automation="conditions"``): views carry the
AutomationCondition of their refresh policy, a sensor per source table only
observes it, and Dagster's own evaluation requests the stale partitions.
Real Lance files and a real Dagster instance."""

import os
import subprocess
import sys

import dagster as dg
import pytest
from dagster_helpers import apply_partition_requests, double, evaluate_sensor

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.assets import ttl_cron
from mv_assets.dagster.definitions import AUTOMATION_SENSOR, partitions_def_name

K = dg.AssetKey
P = mv.RefreshPolicy
AC = dg.AutomationCondition
POLICIES = {
    "eager_v": (P.eager(), AC.eager()),
    "cron_v": (P.cron_schedule("*/5 * * * *"), AC.on_cron("*/5 * * * *")),
    "ttl_v": (P.ttl(3600), AC.on_cron("0 * * * *")),
    "manual_v": (P.manual(), None),
    "stale_v": (P.staleness(25), None),
}


def _catalog(path) -> mv.Connection:
    """src (two fragments) and a view per policy, each with a UDF column y."""
    db = mv.connect(str(path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 10)])
    for name, (policy, _) in POLICIES.items():
        db.create_materialized_view(name, src.search(None).select({"id": "id", "y": double}), refresh_policy=policy)
    return db


def _defs(db, **kwargs):
    return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"), **kwargs)


def _requested(result, name: str) -> set[str]:
    return {k for k in result.get_requested_partitions(K(name.split("/"))) if k is not None}


def _run(defs, instance, result) -> None:
    """The eager view's requested partitions, run as the automation's runs would (one per partition)."""
    assets = [defs.get_repository_def().assets_defs_by_key[K(["eager_v"])]]
    for frag in sorted(_requested(result, "eager_v")):
        out = dg.materialize(assets, instance=instance, partition_key=frag, selection=[K(["eager_v"]), K(["eager_v", "y"])])
        assert out.success


def test_an_unknown_automation_is_refused(tmp_path):
    db = _catalog(tmp_path / "cat")
    with pytest.raises(ValueError, match="automation must be one of"):
        _defs(db, automation="daemon")


@pytest.mark.parametrize("setting, sensors", [(None, "src_changes"), ("conditions", "mv_assets_automation,src_observe")])
def test_the_definitions_module_takes_the_automation_from_the_environment(tmp_path, setting, sensors):
    _catalog(tmp_path / "cat")
    env = {**os.environ, "MV_ASSETS_DB": str(tmp_path / "cat")}
    env.pop("MV_ASSETS_AUTOMATION", None)
    if setting:
        env["MV_ASSETS_AUTOMATION"] = setting
    code = "import definitions; print(','.join(sorted(s.name for s in definitions.defs.sensors)))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=env)
    assert out.stdout.strip().splitlines()[-1] == sensors


def test_ttl_maps_to_the_coarsest_cron_ticking_within_it():
    assert ttl_cron(30) == "*/1 * * * *"
    assert ttl_cron(7 * 60) == "*/6 * * * *"
    assert ttl_cron(3600) == "0 * * * *"
    assert ttl_cron(5 * 3600) == "0 */4 * * *"
    assert ttl_cron(3 * 86400) == "0 0 * * *"


def test_the_sensor_automation_stays_the_default(tmp_path):
    defs = _defs(_catalog(tmp_path / "cat"))
    graph = defs.get_repository_def().asset_graph
    assert graph.get(K(["eager_v"])).automation_condition is None
    assert {s.name for s in defs.sensors or []} == {"src_changes"}
    # the cron view's, and the lineage's daily full checks (stopped unless asked for)
    assert sorted(s.name for s in defs.schedules or []) == ["cron_v_schedule", "full_checks_src_daily"]


def test_conditions_follow_the_policies_and_request_the_stale_partitions(tmp_path):
    db = _catalog(tmp_path / "cat")
    defs = _defs(db, automation="conditions")
    graph = defs.get_repository_def().asset_graph
    for name, (_, condition) in POLICIES.items():
        assert graph.get(K([name])).automation_condition == condition, name
        assert graph.get(K([name, "y"])).automation_condition == condition, name  # its UDF column's too
    # no <table>_changes sensor and no schedule: an observation sensor and Dagster's automation sensor
    sensors = {s.name: s for s in defs.sensors or []}
    assert set(sensors) == {"src_observe", AUTOMATION_SENSOR}
    assert isinstance(sensors[AUTOMATION_SENSOR], dg.AutomationConditionSensorDefinition)
    assert {s.default_status for s in sensors.values()} == {dg.DefaultSensorStatus.RUNNING}  # enabled
    assert [s.name for s in defs.schedules or []] == ["full_checks_src_daily"]  # only the full checks'
    with dg.instance_for_test() as instance:
        # Dagster's first evaluation is a baseline: conditions act on what changes after it
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert result.total_requested == 0
        # the observation sensor adds the fragments' partitions and observes them; it launches no run
        tick = evaluate_sensor(sensors["src_observe"], instance=instance, resources=defs.resources)
        assert not tick.run_requests
        apply_partition_requests(instance, tick)
        assert set(instance.get_dynamic_partitions(partitions_def_name("src"))) == {"0", "1"}
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert _requested(result, "eager_v") == {"0", "1"}
        assert _requested(result, "eager_v/y") == {"0", "1"}
        for name in ("manual_v", "stale_v", "cron_v", "ttl_v"):
            assert not _requested(result, name), name
        _run(defs, instance, result)
        # requested once: the next evaluation over the same state asks nothing
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert not _requested(result, "eager_v")
        # a new Lance version: an append (new fragment 2) and a delete in fragment 0
        src = db.open_table("src")
        src.add([{"id": 10, "x": 10}])
        src.delete("id = 1")
        tick = evaluate_sensor(sensors["src_observe"], instance=instance, resources=defs.resources,
                               cursor=tick.cursor)
        apply_partition_requests(instance, tick)
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        # exactly the stale partitions of the eager view; nothing for the manual view
        assert _requested(result, "eager_v") == {"0", "2"}
        assert _requested(result, "eager_v/y") == {"0", "2"}
        assert not _requested(result, "manual_v")
        _run(defs, instance, result)
        rows = db.open_view("eager_v").to_arrow().to_pylist()
        assert sorted((r["id"], r["y"]) for r in rows) == [(i, 2 * i) for i in (0, *range(2, 11))]
        # refreshed: the next evaluation asks nothing more of it
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert not _requested(result, "eager_v")


def _run_all(defs, instance, result) -> list[str]:
    """Every asset the evaluation requested, run as the automation's runs would:
    one run per partition of a partitioned asset, one per unpartitioned asset,
    upstream first (a view over a view brings its upstream along anyway)."""
    repo = defs.get_repository_def()
    ran = []
    for key in repo.asset_graph.toposorted_asset_keys:
        if key not in repo.assets_defs_by_key or not repo.assets_defs_by_key[key].is_materializable:
            continue
        parts = result.get_requested_partitions(key)
        for part in sorted(parts, key=lambda p: p or ""):
            out = dg.materialize([repo.assets_defs_by_key[key]], instance=instance, partition_key=part,
                                 selection=[key])
            assert out.success, (key, part)
            ran.append("/".join(key.path) + (f"[{part}]" if part is not None else ""))
    return ran


def test_conditions_drive_views_over_views_and_aggregate_views(tmp_path):
    """Eager views of every shape under conditions: a fragment-partitioned
    view, a view over it (unpartitioned), an aggregate view over the table.
    After an append and a delete, the evaluation requests each of them and
    their runs leave each equal to the oracle."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i, "k": i % 3} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i, "k": i % 3} for i in range(6, 10)])
    base = db.create_materialized_view("base", src.search(None).select({"id": "id", "k": "k", "y": double}),
                                       refresh_policy=P.eager())
    db.create_materialized_view("over", base.search(None).where("y > 4").select({"id": "id", "y": "y"}),
                                refresh_policy=P.eager())
    db.create_materialized_view("per_k", src.search(None).group_by("k").agg({"n": "count(*)", "s": "sum(x)"}),
                                refresh_policy=P.eager())
    defs = _defs(db, automation="conditions")
    graph = defs.get_repository_def().asset_graph
    for name in ("base", "over", "per_k"):
        assert graph.get(K([name])).automation_condition == AC.eager(), name
    sensors = {s.name: s for s in defs.sensors or []}
    with dg.instance_for_test() as instance:
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        tick = evaluate_sensor(sensors["src_observe"], instance=instance, resources=defs.resources)
        apply_partition_requests(instance, tick)
        cursor = result.cursor
        for _ in range(3):  # upstream first, then what reads it (as ticks of the automation sensor)
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            cursor = result.cursor
            _run_all(defs, instance, result)
        src.add([{"id": 10, "x": 10, "k": 1}])
        src.delete("id = 1")
        tick = evaluate_sensor(sensors["src_observe"], instance=instance, resources=defs.resources,
                               cursor=tick.cursor)
        apply_partition_requests(instance, tick)
        ran = []
        for _ in range(3):
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            cursor = result.cursor
            ran += _run_all(defs, instance, result)
        for name in ("base", "over", "per_k"):
            assert any(r == name or r.startswith(f"{name}[") for r in ran), (name, ran)
        # the runs left every view equal to the oracle over the table as it is
        rows = [r for r in db.open_table("src").to_arrow().to_pylist()]
        assert sorted((r["id"], r["y"]) for r in db.open_view("base").to_arrow().to_pylist()) == \
            sorted((r["id"], 2 * r["x"]) for r in rows)
        assert sorted((r["id"], r["y"]) for r in db.open_view("over").to_arrow().to_pylist()) == \
            sorted((r["id"], 2 * r["x"]) for r in rows if 2 * r["x"] > 4)
        want = {}
        for r in rows:
            n, s = want.get(r["k"], (0, 0))
            want[r["k"]] = (n + 1, s + r["x"])
        assert {r["k"]: (r["n"], r["s"]) for r in db.open_view("per_k").to_arrow().to_pylist()} == want
        # nothing more to do: the next evaluation asks for nothing
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        assert result.total_requested == 0
