"""The checks of a materialization read what its refresh changed, not the view.

``view.check(scope="last_refresh")`` checks the view rows the newest refresh
wrote or removed and the source rows changed between the versions it moved;
``view.check()`` checks every row. Rows Lance scans are counted through the
scanner's ``scan_stats_callback`` (real Lance files, inline runner)."""

import sys
from pathlib import Path

import dagster as dg
import lance
import numpy as np
import pyarrow as pa
import pytest

import mv_assets as mv

sys.path.insert(0, str(Path(__file__).parent))
from dagster_helpers import small_catalog  # noqa: E402


@mv.udf
def double(n: int) -> int:
    return 2 * n


def _catalog(tmp_path, rows: int):
    db = mv.connect(str(tmp_path / f"cat{rows}"), runner=mv.InlineRunner())
    t = db.create_table("docs", pa.table({"id": np.arange(rows), "n": np.arange(rows),
                                          "body": [f"b{i}" for i in range(rows)]}), primary_key="id")
    v = db.create_materialized_view(
        "v", t.search(None).where("n % 3 != 0").select({"id": "id", "n": "n", "body": "body", "d": double}))
    v.refresh()
    return db, t, v


def _change_100_rows(t, v, rows: int) -> None:
    ds = lance.dataset(t.uri)
    ds.update({"n": "n + 1"}, where="id < 50")  # some now pass the filter, some no longer
    ds.delete("id >= 100 AND id < 125")
    ds.insert(pa.table({"id": np.arange(rows, rows + 25), "n": np.arange(rows, rows + 25), "body": ["new"] * 25}))
    v.refresh()


class _Scanned:
    """Rows Lance scans (``rows_scanned`` of every scan) while counting."""

    def __init__(self, monkeypatch):
        self.rows = 0
        original = lance.LanceDataset.scanner

        def scanner(ds, *args, **kwargs):
            kwargs.setdefault("scan_stats_callback", self._add)
            return original(ds, *args, **kwargs)
        monkeypatch.setattr(lance.LanceDataset, "scanner", scanner)

    def _add(self, stats) -> None:
        self.rows += int(stats.all_counts.get("rows_scanned", 0))

    def during(self, fn):
        self.rows = 0
        out = fn()
        return out, self.rows


def _passed(outcomes) -> dict[str, bool]:
    return {o.name: o.passed for o in outcomes}


def test_checks_after_an_incremental_refresh_read_the_rows_it_changed(tmp_path, monkeypatch):
    scanned = _Scanned(monkeypatch)
    counts, full_counts = {}, {}
    for rows in (20_000, 200_000):
        _, t, v = _catalog(tmp_path, rows)
        _change_100_rows(t, v, rows)
        outcomes, counts[rows] = scanned.during(lambda v=v: v.check(scope="last_refresh"))
        assert all(o.passed for o in outcomes), [(o.name, o.metadata) for o in outcomes if not o.passed]
        assert {o.metadata["scope"] for o in outcomes} == {"last_refresh"}
        meta = {o.name: o.metadata for o in outcomes}
        assert meta["matches_source_query"]["keys_checked"] == 100  # 50 updated, 25 deleted, 25 inserted
        assert meta["no_orphan_rows"]["source_rows_deleted"] == 25
        assert "this refresh" in {o.name: o.description for o in outcomes}["no_orphan_rows"]
        full, full_counts[rows] = scanned.during(v.check)
        assert all(o.passed for o in full)
    assert counts[200_000] <= 1.5 * counts[20_000], counts  # O(rows changed)
    assert counts[200_000] < 2_000, counts
    assert full_counts[200_000] >= 5 * full_counts[20_000] and full_counts[200_000] >= 200_000  # O(view rows)


def test_a_wrong_value_written_into_a_changed_row_is_caught(tmp_path):
    _, t, v = _catalog(tmp_path, 2_000)
    _change_100_rows(t, v, 2_000)
    assert all(o.passed for o in v.check(scope="last_refresh"))
    lance.dataset(v.uri).update({"body": "'WRONG'"}, where="id = 2002")  # a row this refresh inserted
    got = {o.name: o for o in v.check(scope="last_refresh")}
    assert not got["values_match_source"].passed
    assert got["values_match_source"].metadata["values_differing"] == {"body": 1}
    assert got["values_match_source"].metadata["rows_written_outside_refreshes"] == 1
    assert not _passed(v.check())["values_match_source"]


def test_a_wrong_row_outside_the_window_is_caught_by_the_full_check_only(tmp_path):
    _, t, v = _catalog(tmp_path, 2_000)
    lance.dataset(v.uri).delete("id = 1000")  # another tool drops a view row: no row version moves
    _change_100_rows(t, v, 2_000)  # the refresh puts it back (a write by another tool) ...
    got = {o.name: o for o in v.check(scope="last_refresh")}  # ... and its checks cover it: 100 keys + that one
    assert all(o.passed for o in got.values()) and got["matches_source_query"].metadata["keys_checked"] == 101
    view = lance.dataset(v.uri)
    view.update({"body": "'WRONG'"}, where="id = 1000")  # a row far from what changed, wrong
    corrupted = lance.dataset(v.uri).version
    # the checks of what changed after that version do not see it; the full check does
    assert all(o.passed for o in v.check(scope="last_refresh", since_version=corrupted))
    full = {o.name: o for o in v.check()}
    assert not full["values_match_source"].passed and full["values_match_source"].metadata["values_differing"] == {
        "body": 1}
    # a window that holds the write sees it
    assert not _passed(v.check(scope="last_refresh"))["values_match_source"]


def test_a_row_not_refreshed_is_caught_among_the_changed_rows(tmp_path):
    """A refresh that left a changed source row's view row as it was (planted:
    the view row restored with plain pylance, its row version kept by a
    delete and re-insert is not possible, so the refresh's new row is
    deleted): the key accounting finds the row missing."""
    _, t, v = _catalog(tmp_path, 2_000)
    _change_100_rows(t, v, 2_000)
    lance.dataset(v.uri).delete("id = 2003")  # a row the refresh inserted, gone
    got = {o.name: o for o in v.check(scope="last_refresh")}
    assert not got["matches_source_query"].passed and got["matches_source_query"].metadata["missing"] == 1


def test_the_first_refresh_is_checked_in_full_and_says_so(tmp_path):
    _, _, v = _catalog(tmp_path, 500)
    outcomes = v.check(scope="last_refresh")
    assert all(o.passed for o in outcomes)
    assert all("checked in full: the newest refresh is the view's first" in o.description for o in outcomes)


def test_an_unknown_scope_is_refused(tmp_path):
    _, _, v = _catalog(tmp_path, 100)
    with pytest.raises(ValueError, match="scope must be one of 'full', 'last_refresh'"):
        v.check(scope="changes")
    with pytest.raises(ValueError, match="since_version goes with"):
        v.check(since_version=1)


def test_aggregate_views_check_only_the_groups_the_refresh_touched(tmp_path, monkeypatch):
    db = mv.connect(str(tmp_path / "agg"), runner=mv.InlineRunner())
    rows = 20_000
    t = db.create_table("s", pa.table({"id": np.arange(rows), "g": np.arange(rows) % 100, "x": np.arange(rows)}),
                        primary_key="id")
    a = db.create_materialized_view("per_g", t.search(None).group_by("g").agg({"total": "sum(x)", "n": "count(*)"}))
    a.refresh()
    lance.dataset(t.uri).update({"x": "x + 1"}, where="id < 3")  # groups 0, 1, 2
    a.refresh()
    scanned = _Scanned(monkeypatch)
    outcomes, seen = scanned.during(lambda: a.check(scope="last_refresh"))
    assert all(o.passed for o in outcomes), [o.metadata for o in outcomes]
    assert {o.metadata["groups_checked"] for o in outcomes} == {3}
    assert seen < 2 * rows  # the touched groups' rows are found by a filtered scan of the source (no index)
    lance.dataset(a.uri).update({"total": "total + 7"}, where="g = 1")
    got = {o.name: o for o in a.check(scope="last_refresh")}
    assert not got["values_match_source"].passed and got["values_match_source"].metadata["values_differing"] >= 1


def test_materializations_run_the_incremental_checks_and_the_schedule_the_full_ones(tmp_path):
    from mv_assets.dagster import MvAssetsResource, build_definitions
    from mv_assets.dagster.definitions import FULL_CHECKS_CRON, partitions_def_name

    db = small_catalog(tmp_path / "cat")
    db.refresh(["v", "w"])
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    schedule = repo.get_schedule_def("full_checks_src_daily")
    assert schedule.cron_schedule == FULL_CHECKS_CRON
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"),
                             full_checks_running=True).get_repository_def().get_schedule_def(
        "full_checks_src_daily").default_status == dg.DefaultScheduleStatus.RUNNING
    db.open_table("src").add([{"id": 50, "x": 50}])
    with dg.instance_for_test() as instance:
        frags = [str(f.fragment_id) for f in lance.dataset(db.table_uri("src")).get_fragments()]
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        out = dg.materialize([repo.assets_defs_by_key[dg.AssetKey(["v"])]], instance=instance,
                             partition_key=frags[-1])
        assert out.success
        evaluations = out.get_asset_check_evaluations()
        assert evaluations and all(e.passed for e in evaluations)
        assert all(e.metadata["scope"].value == "last_refresh" for e in evaluations)
        by = {(e.asset_key.path[0], e.check_name): e for e in evaluations}
        assert by[("v", "udf_values_present")].metadata["view_rows_written"].value == 1
        full = defs.resolve_job_def("full_checks_src").execute_in_process(instance=instance)  # also "Execute"
        assert full.success
        evaluations = full.get_asset_check_evaluations()
        assert {(e.asset_key.path[0], e.check_name) for e in evaluations} == set(by)
        assert all(e.passed and "scope" not in e.metadata for e in evaluations)
        assert not full.get_asset_materialization_events()


def test_the_checks_of_a_refresh_look_at_the_fragments_it_wrote_not_at_every_fragment(tmp_path, monkeypatch):
    """Which fragments hold rows written since the previous refresh is read
    from the commits in between (appends, deletes, rewriting updates write
    new fragments), not from every fragment's row-version metadata on both
    sides: 2 x 200 metadata reads before, at 200 fragments, for a change of
    one row (at 10,000 fragments ~2.3 s of a one-fragment run). The check
    still sees a wrong value written by the refresh."""
    from lance.fragment import FragmentMetadata

    frags = 200
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("docs", [{"id": 0, "n": 0}], primary_key="id")
    rows = pa.table({"id": pa.array(range(1, 2 * frags), pa.int64()), "n": pa.array(range(1, 2 * frags), pa.int64())})
    lance.write_dataset(rows, t.uri, mode="append", max_rows_per_file=2)
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "n": "n", "d": double}))
    v.refresh()
    assert len(lance.dataset(t.uri).get_fragments()) == frags + 1
    t.add([{"id": 10_000, "n": 5}])
    t.delete("id = 77")
    v.refresh()
    read = []
    real = FragmentMetadata.to_json
    monkeypatch.setattr(FragmentMetadata, "to_json", lambda self: (read.append(1), real(self))[1])
    outcomes = v.check(scope="last_refresh")
    assert all(o.passed for o in outcomes), outcomes
    assert len(read) <= 4, len(read)  # (before: 400)
    # and what it reads still catches a wrong value the refresh wrote
    vds = lance.dataset(v.uri)
    vds.update({"d": "d + 1"}, where="id = 10000")
    assert not all(o.passed for o in v.check(scope="last_refresh"))


def test_a_null_the_udf_returned_is_a_value_a_skipped_failure_is_missing(tmp_path):
    """``udf_values_present`` took every NULL of a UDF column whose inputs are
    present for a missing value, also a NULL the UDF returned: a view whose
    UDF says "no answer" for some rows failed its check after a clean
    refresh. A row's computed marker tells them apart: a row that failed
    under ``on_error="skip"`` has none. Over one table and over a join, in
    full and for the last refresh."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", pa.table({"id": np.arange(8), "x": [1.0, None, 3.0, 40.0, 50.0, 6.0, 7.0, 8.0],
                                       "cid": [0, 1, 0, 1, 9, 0, 1, 0]}))
    c = db.create_table("c", pa.table({"cid": [0, 1], "w": [10.0, 20.0]}))

    @mv.udf(on_error="skip")
    def capped(x: float) -> float:
        if x == 7.0:
            raise ValueError("seven")
        return None if x > 10 else x

    plain = db.create_materialized_view("plain", t.search(None).select({"id": "id", "y": capped}))
    joined = db.create_materialized_view(
        "joined", t.search(None).join(c, on="cid", how="left").select({"id": "id", "w": "w", "y": capped}))
    for v in (plain, joined):
        v.refresh()
        assert sorted(v.to_arrow().column("y").to_pylist(), key=str) == sorted(
            [1.0, None, 3.0, None, None, 6.0, None, 8.0], key=str)  # (7.0 failed: skipped)
        for scope in ("full", "last_refresh"):
            by = {o.name: o for o in v.check(scope=scope)}
            assert by["udf_values_present"].metadata["missing_by_column"] == {"y": 1}, (v.name, scope)
    t.add(pa.table({"id": [8, 9], "x": [100.0, 2.0], "cid": [1, 0]}))
    for v in (plain, joined):
        v.refresh()
        by = {o.name: o for o in v.check(scope="last_refresh")}
        assert by["udf_values_present"].passed, (v.name, by["udf_values_present"])
        by = {o.name: o for o in v.check()}
        assert by["udf_values_present"].metadata["missing_by_column"] == {"y": 1}, v.name


def test_check_of_a_view_whose_only_nulls_the_udf_returned(tmp_path):
    """Every NULL of the column returned by the UDF (nothing skipped): the rows
    left to look at were none, and the check built ``_rowid IN ()``."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(10)], primary_key="id")

    @mv.udf
    def half(x: int) -> int:
        return None if x % 2 else x // 2

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": half}))
    v.refresh()
    for scope in ("full", "last_refresh"):
        assert all(o.passed for o in v.check(scope=scope)), scope
