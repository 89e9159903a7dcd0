"""Catalogs that grow: what a sensor tick costs in object-store requests,
counted exactly by a proxy in front of a real S3 server (moto's, on
127.0.0.1). Counts, never times: an idle tick reads one version per dataset
of its lineage, whatever the catalog's size; a tick after a change costs the
same in a catalog of 2 tables as in one of 6 (before: every tick listed the
whole catalog and checked every dataset, 4N + 12 requests)."""

import dagster as dg
import pytest
from counting_proxy import CountingProxy
from dagster_helpers import evaluate_sensor

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions


@pytest.fixture
def counted(s3_server):
    with CountingProxy(s3_server.endpoint) as proxy:
        yield s3_server, proxy


def _catalog(s3, proxy, n: int):
    options = {**s3.options, "aws_endpoint": proxy.endpoint}
    uri = f"s3://{s3.new_bucket()}/catalog"
    db = mv.connect(uri, storage_options=options, runner=mv.InlineRunner())
    for i in range(n):
        t = db.create_table(f"t{i}", [{"id": j, "x": j} for j in range(3)], primary_key="id")
        db.create_materialized_view(f"v{i}", t.search(None).where("x >= 0").select({"id": "id", "x": "x"})).refresh()
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=uri, runner="inline", storage_options=options))
    return db, defs


def _ticks(db, defs, proxy) -> dict[str, int]:
    """Requests of t0's sensor: an idle tick after the first, then a tick after an append."""
    sensor = defs.get_repository_def().get_sensor_def("t0_changes")
    out = {}
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        for req in first.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        db.refresh(["v0"])  # what the first tick's run does
        settled = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                                  resources=defs.resources)  # sees the view's new version: a full look
        assert not settled.run_requests
        with proxy.counting() as seen:
            idle = evaluate_sensor(sensor, instance=instance, cursor=settled.cursor, definitions=defs,
                                   resources=defs.resources)
        out["idle"] = seen.total
        assert not idle.run_requests and "still at version" in (idle.skip_message or "")
        assert sorted(p for _, p in seen.requests) == sorted(
            p for p in {p for _, p in seen.requests} if p.endswith(("t0.lance/_versions/", "v0.lance/_versions/")))
        db.open_table("t0").add([{"id": 100, "x": 100}])
        with proxy.counting() as seen:
            changed = evaluate_sensor(sensor, instance=instance, cursor=idle.cursor or settled.cursor,
                                      definitions=defs, resources=defs.resources)
        out["changed"] = seen.total
        (run,) = changed.run_requests
        assert {k.to_user_string() for k in run.asset_selection} == {"v0"}
        assert not [p for _, p in seen.requests if "/t1." in p or "/v1." in p]  # no other lineage is read
    return out


def test_a_sensor_tick_costs_the_same_whatever_the_catalogs_size(counted):
    s3, proxy = counted
    small = _ticks(*_catalog(s3, proxy, 2), proxy)
    large = _ticks(*_catalog(s3, proxy, 6), proxy)
    assert small["idle"] == large["idle"] == 2  # one version read: the table's, and its one view's
    assert small["changed"] == large["changed"] <= 20, (small, large)


def _fresh_process_requests(proxy, uri: str, options: dict, call: str):
    """Requests of ``call`` (``status``, ``cli`` for ``mv-assets status`` or ``defs``) made by a new process
    (no cache): a counting_proxy.Seen."""
    import json
    import os
    import subprocess
    import sys

    code = ("import sys, mv_assets as mv\n"
            "if sys.argv[2] == 'defs':\n"
            "    from mv_assets.dagster import build_definitions; build_definitions(sys.argv[1])\n"
            "elif sys.argv[2] == 'cli':\n"
            "    from mv_assets.cli import main\n"
            "    try:\n"
            "        main(['--db', sys.argv[1], '--runner', 'inline', 'status', '--json'])\n"
            "    except SystemExit as e:\n"
            "        assert not e.code, e.code\n"
            "else:\n"
            "    mv.connect(sys.argv[1]).status()\n")
    env = {**os.environ, "MV_ASSETS_STORAGE_OPTIONS": json.dumps(options)}
    with proxy.counting() as seen:
        subprocess.run([sys.executable, "-c", code, uri, call], env=env, check=True, capture_output=True, timeout=300)
    return seen


@pytest.mark.parametrize("n", [2, 5])
def test_the_status_and_the_definitions_load_read_each_dataset_a_few_times(counted, n):
    """What a new process asks the store for: the root listed once, the
    catalog's summaries read once (storage.summaries), then a table unchanged
    since a call last looked costs one listing of its versions and a view its
    opening (the listing and its manifest): 2 + 3 per table with its view for
    the definitions load, 3 + 3 for the status (the load-state records listed
    once too; a view that loaded has no record: its load state is in its
    commits). With no summaries yet every dataset is opened as before (its
    listing and its manifest) and only its kind is remembered, so a catalog
    whose credentials cannot write the file costs what it did; the next call
    lists each table's versions and reads the manifest at the version listed
    (a HEAD and a GET), and remembers it. Before: 1 + 2 per dataset for the
    definitions load and 1 + 1 + 2 for the status (a table's manifest read
    only to tell it from a view), and before that 1 + 4 per dataset, about 18
    per view, then 5, 4 and 3."""
    from mv_assets.storage import objects

    s3, proxy = counted
    db, _ = _catalog(s3, proxy, n)
    options = {**s3.options, "aws_endpoint": proxy.endpoint}
    objects.remove(db.layout.summaries())
    cold = _fresh_process_requests(proxy, db.uri, options, "defs")
    assert cold.total == 1 + 1 + n * 2 + n * 2 + 1, cold.by_path()  # as before, and the kinds written once
    assert cold.by_method["PUT"] == 1
    second = _fresh_process_requests(proxy, db.uri, options, "defs")
    assert second.total == 1 + 1 + n * (1 + 2) + n * 2 + 1, second.by_path()
    # no more listings than before (each dataset's versions once): a table's manifest is read at the version
    # listed (a HEAD and a GET), a listing being the dearer request on object stores
    assert sum("?prefix=" in p for _, p in second.requests) == 1 + 2 * n, second.by_path()
    assert _fresh_process_requests(proxy, db.uri, options, "defs").total == 1 + 1 + n * (1 + 2)
    assert _fresh_process_requests(proxy, db.uri, options, "status").total == 1 + 1 + 1 + n * (1 + 2)
    # the CLI's too: its check that a catalog is there (connect(create=False)) is the status's listing of the
    # root, not one more (before: 2 + 1 + 1 + n * (1 + 2))
    cli = _fresh_process_requests(proxy, db.uri, options, "cli")
    assert cli.total == 1 + 1 + 1 + n * (1 + 2), cli.by_path()


def test_the_status_reads_each_views_manifest_once(counted):
    """What the status asks the store for each view, by kind: the listing of
    the catalog's root, the listing of its load-state records and the
    catalog's summaries (one each for all), then per view the listing of its
    versions and its manifest (its newest commit, whose properties hold the
    refresh state and so the LOADED load state, comes inline with it), and
    per source table the listing of its versions alone: its newest manifest
    is the one the summaries were read from, at the version and identity the
    view reflects. Each once: before, the manifest was read a second time
    (Lance's read_transaction), 5 requests a view, then each view's load-state
    record was read too, 4, then Lance's directory namespace listed each
    view's folder for a deregistration marker, 3 and the source's 2 (its
    manifest read to tell it from a view), 4 in all."""
    import re
    from collections import Counter

    s3, proxy = counted
    n = 3
    db, _ = _catalog(s3, proxy, n)
    db.describe()  # (the second look at the catalog: the summaries learn each table's newest manifest)
    options = {**s3.options, "aws_endpoint": proxy.endpoint}
    seen = _fresh_process_requests(proxy, db.uri, options, "status")

    def kind(method: str, path: str) -> str:
        path = re.sub(r"^/[^/?]+", "", path)  # (the bucket)
        path = re.sub(r"\b([tv])\d+\b", r"\1N", path)
        path = re.sub(r"/\d+\.manifest$", "/<version>.manifest", path)
        return f"{method} {path}"

    assert Counter(kind(m, p) for m, p in seen.requests) == {
        "GET ?prefix=catalog/": 1,
        "GET /catalog/_mv_assets/summaries.json": 1,
        "GET ?prefix=catalog/tN.lance/_versions/": n, "GET ?prefix=catalog/vN.lance/_versions/": n,
        "GET /catalog/vN.lance/_versions/<version>.manifest": n,
        "GET ?prefix=catalog/_mv_assets/status/": 1,  # no record read: every view is LOADED
    }, seen.by_path()
    # each view's manifest once, not twice
    manifests = Counter(p for m, p in seen.requests if m == "GET" and p.endswith(".manifest"))
    assert set(manifests.values()) == {1}, manifests

    # a view that failed has a record: it alone is read, one more request
    from mv_assets.storage.status import FAILED_LOAD, record_load_state

    record_load_state(db.layout, "v1", FAILED_LOAD, "RuntimeError: model down")
    failed = _fresh_process_requests(proxy, db.uri, options, "status")
    assert failed.total == seen.total + 1
    assert [p for _, p in failed.requests if p.endswith(".json") and "/status/" in p] == [
        f"/{db.uri.split('/')[2]}/catalog/_mv_assets/status/v1.json"], failed.by_path()
    states = {r["name"]: (r["load_state"], r["last_error"]) for r in db.status().to_pylist()}
    assert states == {"v0": ("LOADED", None), "v1": (FAILED_LOAD, "RuntimeError: model down"),
                      "v2": ("LOADED", None)}
