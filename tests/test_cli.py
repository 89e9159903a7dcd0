"""The mv-assets CLI through click's runner (inline runner: no JVM)."""

import json
import os

import pyarrow as pa
import pytest
from click.testing import CliRunner

import mv_assets as mv
from mv_assets.cli import main


@mv.udf
def neg(x: int) -> int:
    return -x


@mv.udf
def boom(x: int) -> int:
    raise RuntimeError("no model today")


@pytest.fixture
def catalog(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(5)])
    a = db.create_materialized_view("a", src.search(None).select({"id": "id", "n": neg}))
    db.create_materialized_view("b", a.search(None).where("n < -1").select({"id": "id"}))
    db.create_materialized_view("bad", src.search(None).select({"id": "id", "z": boom}))
    return db


def run(db, *args):
    return CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", *args], catch_exceptions=False)


def test_tables(catalog):
    r = run(catalog, "tables", "--json")
    assert r.exit_code == 0
    rows = {t["name"]: t for t in json.loads(r.output)}
    assert rows["src"]["kind"] == "table" and rows["a"]["source"] == "src" and rows["src"]["rows"] == 5
    assert "tables in" in run(catalog, "tables").output


def test_a_damaged_view_is_listed_unreadable_without_hiding_the_others(catalog):
    """One view's newest manifest damaged: `tables` lists it as unreadable
    beside the others (it failed outright, exit 2, listing nothing), and
    `status VIEW` gives its UNREADABLE row (it exited 2 with Lance's error);
    db.view_statuses(name) too."""
    catalog.refresh("a")
    versions = os.path.join(catalog.open_table("a").uri, "_versions")
    newest = sorted(f for f in os.listdir(versions) if f.endswith(".manifest"))[0]  # (names count down)
    with open(os.path.join(versions, newest), "w") as f:
        f.write("garbage\n")
    r = run(catalog, "tables", "--json")
    assert r.exit_code == 0, r.output
    rows = {t["name"]: t for t in json.loads(r.output)}
    assert rows["a"]["kind"] == "unreadable" and rows["a"]["rows"] is None
    assert rows["src"]["rows"] == 5 and rows["b"]["kind"] == "view"
    r = run(catalog, "status", "a", "--json")
    assert r.exit_code == 0, r.output
    assert (json.loads(r.output)["name"], json.loads(r.output)["load_state"]) == ("a", "UNREADABLE")
    assert [s.load_state for s in catalog.view_statuses("a")] == ["UNREADABLE"]
    assert run(catalog, "status", "nope").exit_code == 2 and run(catalog, "status", "src").exit_code == 2


def test_plan_and_refresh_in_lineage_order(catalog):
    r = run(catalog, "plan", "a", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["rows_to_insert"] == 5
    r = run(catalog, "refresh", "b")
    assert r.exit_code == 3 and "refresh 'a' first" in r.output
    r = run(catalog, "plan", "b")  # (against 'a' as it is, saying what refresh refuses: it said only "current")
    assert r.exit_code == 0 and "refresh would refuse" in r.output and "refresh 'a' first" in r.output
    assert "refresh 'a' first" in json.loads(run(catalog, "plan", "b", "--json").output)["refresh_refused"]
    r = run(catalog, "refresh", "b", "--upstream", "--json")
    assert r.exit_code == 0, r.output
    assert [x["view"] for x in json.loads(r.output)] == ["a", "b"]
    assert catalog.open_table("b").count_rows() == 3
    r = run(catalog, "refresh", "a", "b")
    # v2: the identity stamp of creating a view over it
    assert r.exit_code == 0 and "a: nothing to refresh: it reflects source v2 already" in r.output


def test_status_json_and_failed_load(catalog):
    r = run(catalog, "refresh", "bad")
    assert r.exit_code == 1 and "no model today" in r.output
    r = run(catalog, "status", "bad", "--json")
    assert r.exit_code == 0
    s = json.loads(r.output)
    assert s["load_state"] == "FAILED_LOAD" and "no model today" in s["last_error"]
    r = run(catalog, "status", "--json")
    assert {x["name"] for x in json.loads(r.output)} == {"a", "b", "bad"}
    assert "view status" in run(catalog, "status").output


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["plan", "nope"], 2, "no table or view named 'nope'"),
        (["plan", "src"], 2, "is a table, not a materialized view"),
        (["refresh", "a", "--src-version", "99"], 2, "src_version must be between"),
        (["refresh", "a", "b", "--src-version", "1"], 2, "single view"),
        (["refresh", "a", "--mode", "sometimes"], 2, "Invalid value"),
        (["errors", "a", "--column", "nosuch"], 2, "'a' has no column 'nosuch'"),
        (["adopt", "nosuch"], 2, "nosuch"),
    ],
)
def test_bad_input_exit_codes(catalog, args, code, message):
    import os

    locks = os.path.join(catalog.uri, "_mv_assets", "locks")
    before = sorted(os.listdir(locks)) if os.path.isdir(locks) else []
    r = run(catalog, *args)
    assert r.exit_code == code and message in r.output
    after = sorted(os.listdir(locks)) if os.path.isdir(locks) else []
    assert not [n for n in set(after) - set(before) if n.startswith(("nope", "nosuch"))]  # (no lock file of no table)


def test_a_refresh_that_fails_on_its_data_exits_1_not_as_bad_input(catalog):
    """A refresh that ran and failed on its data (Lance's ValueError of a SQL
    cast) exited 2, the code of bad input, though its status says FAILED_LOAD."""
    texts = catalog.create_table("texts", [{"id": i, "s": str(i)} for i in range(10)])
    v = catalog.create_materialized_view("casts", texts.search(None).where("CAST(s AS INT) > 5"))
    v.refresh()
    texts.add([{"id": 100, "s": "abc"}])
    r = run(catalog, "refresh", "casts")
    assert r.exit_code == 1 and "refresh of 'casts' failed" in r.output
    assert v.status().load_state == "FAILED_LOAD"


def test_backfill_dry_run_errors_and_retry(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(10)])
    flag = tmp_path / "broken"
    flag.write_text("1")

    @mv.udf(on_error="skip")
    def fragile(x: int) -> int:
        if x % 4 == 0 and flag.exists():
            raise KeyError(x)
        return x + 1

    t.add_columns({"y": fragile})
    r = run(db, "backfill", "t", "y", "--dry-run", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["rows_to_compute"] == 10
    r = run(db, "backfill", "t", "y", "--json")
    out = json.loads(r.output)
    assert r.exit_code == 0 and out["rows_failed"] == 3 and out["rows_written"] == 7
    r = run(db, "errors", "t", "--column", "y", "--json")
    assert sorted(e["error_type"] for e in json.loads(r.output)) == ["KeyError"] * 3
    flag.unlink()
    status = {c["column"]: c for c in json.loads(run(db, "columns", "t", "--json").output)}
    assert (status["y"]["current"], status["y"]["stale"], status["y"]["failed"]) == (7, 3, 3)
    r = run(db, "errors", "t", "--json")
    assert [e["still_failing"] for e in json.loads(r.output)] == [True] * 3
    # readable at 80 columns: a block per record, every field whole (no table squeezed to one letter a cell)
    r = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["--db", db.uri, "errors", "t"], catch_exceptions=False)
    lines = r.output.splitlines()
    assert r.exit_code == 0 and lines[0] == "errors in t: 3 records, 3 still failing"
    assert all(len(line) <= 80 for line in lines), lines
    for i in (0, 4, 8):
        assert any(line.startswith(f"row {i} ") and " · column y · FAILING · 1 attempt · job " in line
                   for line in lines), lines
        assert f"  KeyError: {i}" in lines, lines
    r = run(db, "backfill", "t", "y", "--retry-failed")
    assert r.exit_code == 0 and "3 rows written, 0 failed" in r.output
    # the records stay (what happened), each saying it was fixed since
    r = run(db, "errors", "t", "--json")
    assert [e["still_failing"] for e in json.loads(r.output)] == [False] * 3
    r = run(db, "errors", "t")
    assert r.exit_code == 0 and r.output.count(" · fixed · ") == 3 and "FAILING" not in r.output
    assert r.output.startswith("errors in t: 3 records, 0 still failing")
    r = run(db, "errors", "t", "--failing", "--json")
    assert r.exit_code == 0 and json.loads(r.output) == []
    status = {c["column"]: c for c in json.loads(run(db, "columns", "t", "--json").output)}
    assert (status["y"]["current"], status["y"]["stale"], status["y"]["failed"]) == (10, 0, 0)
    assert [row["y"] for row in t.to_arrow().to_pylist()] == [i + 1 for i in range(10)]
    assert run(db, "backfill", "t", "nope").exit_code == 2
    assert run(db, "backfill", "t", "y", "--where", "bad syntax (").exit_code == 2


def test_status_and_tables_show_a_view_whose_source_was_removed(catalog):
    import shutil

    other = catalog.create_table("other", [{"id": i} for i in range(3)])
    catalog.create_materialized_view("o", other.search(None).select(["id"]))
    catalog.refresh("o")
    shutil.rmtree(other.uri)  # another tool removes the source
    r = run(catalog, "status", "--json")
    assert r.exit_code == 0, r.output
    rows = {x["name"]: x for x in json.loads(r.output)}
    assert set(rows) == {"a", "b", "bad", "o"} and rows["a"]["load_state"] == "NEVER_LOADED"
    assert rows["o"]["load_state"] == "SOURCE_MISSING" and "source 'other' of view 'o' is missing" in rows["o"]["last_error"]
    r = run(catalog, "status", "o", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["load_state"] == "SOURCE_MISSING"
    r = CliRunner().invoke(main, ["--db", catalog.uri, "status"], env={"COLUMNS": "400"}, catch_exceptions=False)
    assert r.exit_code == 0 and "SOURCE_MISSING" in r.output and "commit.rs" not in r.output
    r = run(catalog, "tables", "--json")
    assert r.exit_code == 0, r.output
    assert {t["name"]: t["source"] for t in json.loads(r.output)}["o"] == "other"


COMMANDS = [
    ["tables"], ["status"], ["status", "a"], ["plan", "a"], ["columns", "src"], ["errors", "src"],
    ["backfill", "src", "x", "--dry-run"], ["backfill", "src", "x"], ["refresh", "a"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a))
def test_a_mistyped_catalog_path_is_not_created(tmp_path, args):
    missing = tmp_path / "no" / "such" / "catalog"
    r = CliRunner().invoke(main, ["--db", str(missing), "--runner", "inline", *args], catch_exceptions=False)
    assert r.exit_code == 2 and f"no catalog at {missing}" in r.output
    assert not (tmp_path / "no").exists()
    empty = tmp_path / "empty"  # a directory that holds no catalog is not one
    empty.mkdir()
    r = CliRunner().invoke(main, ["--db", str(empty), "--runner", "inline", *args], catch_exceptions=False)
    assert r.exit_code == 2 and f"no catalog at {empty}" in r.output
    assert os.listdir(empty) == []


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a))
def test_a_file_as_catalog_is_a_clear_error(tmp_path, args):
    path = tmp_path / "notes.txt"
    path.write_text("not a catalog")
    r = CliRunner().invoke(main, ["--db", str(path), "--runner", "inline", *args], catch_exceptions=False)
    assert r.exit_code == 2 and f"{path} is a file, not a catalog directory" in r.output
    assert "Traceback" not in r.output and path.read_text() == "not a catalog"


def test_a_chunk_view_through_the_cli(catalog, call_log):
    from test_chunk_views import calls, docs_rows, make_split

    docs = catalog.create_table("docs", docs_rows(range(1, 6)))
    catalog.create_udtf_view("chunks", docs.search(None).select(["id"]), make_split(call_log))
    rows = {t["name"]: t for t in json.loads(run(catalog, "tables", "--json").output)}
    assert rows["chunks"]["kind"] == "chunk view" and rows["a"]["kind"] == "view"
    assert "UDF rows: split 5, in 1 task" in run(catalog, "plan", "chunks").output and calls(call_log) == 0
    r = run(catalog, "refresh", "chunks")
    assert r.exit_code == 0 and "+5" in r.output and calls(call_log) == 5
    status = {s["name"]: s for s in json.loads(run(catalog, "status", "--json").output)}
    assert status["chunks"]["load_state"] == "LOADED" and status["chunks"]["cardinality"] == 6


def test_an_aggregate_view_through_the_cli(catalog):
    src = catalog.create_table("ev", [{"id": i, "g": i % 2, "x": float(i)} for i in range(6)], primary_key="id")
    catalog.create_materialized_view("per_g", src.search(None).group_by("g").agg({"n": "count(*)", "sx": "sum(x)"}))
    rows = {t["name"]: t for t in json.loads(run(catalog, "tables", "--json").output)}
    assert rows["per_g"]["kind"] == "aggregate view"
    r = run(catalog, "refresh", "per_g")
    assert r.exit_code == 0 and "+2" in r.output
    src.delete("id = 5")
    assert "insert 0, update 1, delete 0" in run(catalog, "plan", "per_g").output  # one group rewritten
    assert run(catalog, "refresh", "per_g").exit_code == 0
    got = {r["g"]: (r["n"], r["sx"]) for r in catalog.open_table("per_g").to_arrow().to_pylist()}
    assert got == {0: (3, 6.0), 1: (2, 4.0)}


def test_status_is_readable_at_80_columns(catalog):
    """One line per view at 80 columns, no name, state or number cut short (the
    table had 11 columns cut to '…' at 80); each last error on lines of its own."""
    catalog.refresh("a")
    run(catalog, "refresh", "bad")  # fails: LOADING -> FAILED with the UDF's error
    r = CliRunner().invoke(main, ["--db", catalog.uri, "status"], env={"COLUMNS": "80"}, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert all(len(line) <= 80 for line in lines), r.output
    assert "…" not in r.output
    by_view = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in ("a", "b", "bad")}
    assert by_view["a"][:6] == ["a", "LOADED", "5", "1", "v2", "0"]
    assert by_view["b"][1] == "NEVER_LOADED" and by_view["bad"][1] == "FAILED_LOAD*"
    assert any(line.startswith("bad: last error: ") and "no model today" in r.output for line in lines)


@mv.udf
def slow_inc(x: int) -> int:
    import time

    time.sleep(0.002)
    return x + 1


def test_refresh_and_backfill_report_progress_and_a_first_refresh_in_words(tmp_path, monkeypatch):
    """Long work reports its rows done of planned, rate and time left while it
    runs (a bar on a terminal; lines on stderr otherwise, as here); a first
    refresh says so (before: 'vNone -> v1')."""
    monkeypatch.setenv("MV_ASSETS_PROGRESS_SECONDS", "0.05")
    monkeypatch.setenv("MV_ASSETS_CHECKPOINT_SECONDS", "0.05")
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(200)], primary_key="id")
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": slow_inc}))
    r = run(db, "refresh", "v")
    assert r.exit_code == 0, r.output
    assert f"v: first refresh, at source v{src.version}: +200 ~0 -0, UDF rows computed: y 200;" in r.stdout
    running = [line for line in r.stderr.splitlines() if line.startswith("refreshing v: computing: ")]
    assert len(running) >= 3 and any("left" in line and "rows/s" in line for line in running)
    assert running[-1].startswith("refreshing v: computing: 200 of 200 rows (100%)")
    src.add_columns({"z": slow_inc})
    r = run(db, "backfill", "src", "z")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("backfilling src.z: computing: ")]
    assert len(lines) >= 3 and lines[-1].startswith("backfilling src.z: computing: 200 of 200 rows (100%)")
    assert run(db, "refresh", "v", "--json").stderr == ""  # --json: nothing but the JSON


def test_jobs_lists_newest_first_and_shows_one_record(catalog):
    assert run(catalog, "refresh", "a").exit_code == 0
    assert run(catalog, "refresh", "bad").exit_code == 1  # its UDF fails: a failed job
    src = catalog.open_table("src")
    src.add_columns({"y": neg})
    r = run(catalog, "backfill", "src", "y", "--json")
    backfill_job = json.loads(r.output)["job_id"]

    listed = json.loads(run(catalog, "jobs", "--json").output)
    assert [j["job_type"] for j in listed] == ["backfill", "refresh", "refresh"]  # newest first
    assert listed[0]["job_id"] == backfill_job and listed[0]["status"] == "DONE"
    assert [j["table_name"] for j in listed[1:]] == ["bad", "a"]
    assert listed[1]["status"] == "FAILED" and "no model today" in listed[1]["error"]
    assert {m["name"]: m["n"] for m in listed[0]["metrics"]}["rows_committed"] == 5

    r = run(catalog, "jobs", "--status", "failed", "--table", "bad", "--json")
    assert [j["table_name"] for j in json.loads(r.output)] == ["bad"]
    r = run(catalog, "jobs", "--table", "src", "--json")
    assert [j["job_id"] for j in json.loads(r.output)] == [backfill_job]

    r = CliRunner().invoke(main, ["--db", catalog.uri, "jobs"], env={"COLUMNS": "200"}, catch_exceptions=False)
    assert r.exit_code == 0 and backfill_job in r.output and "src.y" in r.output and "FAILED" in r.output

    r = run(catalog, "jobs", backfill_job)
    lines = r.output.splitlines()
    assert r.exit_code == 0 and lines[0] == f"job {backfill_job} · backfill of src (y) · DONE"
    assert lines[2].startswith("  rows_committed 5 · rows 5 · udf_rows_computed 5 · errors 0")
    assert lines[-1].endswith("Job completed with status DONE") and "committed version" in lines[-2]
    record = json.loads(run(catalog, "jobs", backfill_job, "--json").output)
    assert record["config"] == {"columns": ["y"]} and record["output_columns"] == ["y"]

    r = run(catalog, "jobs", "no-such-job")
    assert r.exit_code == 2 and "Job no-such-job not found" in r.output
    r = run(catalog, "jobs", "--table", "nope")
    assert r.exit_code == 2 and "no table or view named 'nope'" in r.output


def test_at_80_columns_job_ids_are_whole_and_plans_read_as_words(tmp_path):
    """`mv-assets jobs` at 80 columns keeps each job id whole (what `mv-assets jobs ID` takes);
    `mv-assets plan` names UDF rows per column, and a join view's plan what it read."""
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    o = db.create_table("orders", pa.table({"oid": list(range(50)), "cid": [i % 5 for i in range(50)]}))
    c = db.create_table("customers", pa.table({"cid": list(range(5)), "name": list("abcde")}))
    v = db.create_materialized_view("a_rather_long_view_name_for_a_narrow_terminal",
                                    o.search(None).join(c, on="cid").select({"oid": "oid", "name": "name"}))
    v.refresh()
    c.update(where="cid = 1", values={"name": "z"})
    r = CliRunner().invoke(main, ["--db", db.uri, "plan", v.name], env={"COLUMNS": "80"}, catch_exceptions=False)
    assert "UDF rows: none, in 1 task" in r.output and "{}" not in r.output
    assert "read: changed rows customers 1; probe matches 10" in r.output
    # (the first plan in this process that looks rows up loads the arrangements it probes)
    assert "arrangement view: loaded (50 rows" in r.output and "arrangement orders.cid: loaded (50 rows" in r.output
    assert "recomputes 10 of 50 first-table rows (20.0%; full at 50%): incremental" in r.output
    v.refresh()
    ids = [j.job_id for j in db.list_jobs()]
    r = CliRunner().invoke(main, ["--db", db.uri, "jobs"], env={"COLUMNS": "80"}, catch_exceptions=False)
    assert r.exit_code == 0 and all(i in r.output for i in ids) and "…" not in r.output.split("target")[0]
    assert max(len(line) for line in r.output.splitlines()) <= 80


def test_python_dash_m_runs_the_command_line(catalog):
    """``python -m mv_assets`` is the ``mv-assets`` command (it said the package cannot be executed)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "mv_assets", "--db", catalog.uri, "--runner", "inline", "tables",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {t["name"] for t in json.loads(r.stdout)} == {"src", "a", "b", "bad"}


def test_errors_of_a_chunk_views_chunker(tmp_path):
    """A chunker skipping a parent (on_error="skip"): `mv-assets errors ch`
    (what its error message says to run) exited 2 with "'words' is not a
    computed column of 'ch'". It lists the record, still failing until the
    parent is fixed."""
    from collections.abc import Iterator
    from typing import NamedTuple

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("docs", [{"id": i, "body": f"a b {i}"} for i in range(10)], primary_key="id")

    class Piece(NamedTuple):
        text: str

    @mv.chunker(on_error="skip")
    def words(body: str) -> Iterator[Piece]:
        if body == "a b 7":
            raise ValueError("bad parent 7")
        for w in body.split():
            yield Piece(w)

    ch = db.create_udtf_view("ch", src.search(None).select(["id"]), words)
    ch.refresh()
    r = run(db, "errors", "ch", "--json")
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.output)
    assert (rec["column"], rec["row_id"], rec["message"], rec["still_failing"]) == ("words", 7, "bad parent 7", True)
    assert run(db, "errors", "ch", "--column", "words").exit_code == 0
    src.update("id = 7", values={"body": "a b seven"})
    ch.refresh()
    (rec,) = json.loads(run(db, "errors", "ch", "--json").output)
    assert rec["still_failing"] is False


def test_a_refresh_is_told_without_vnone_and_first_only_when_it_was():
    """A view refreshed only fragment by fragment reflects no whole source
    version: its refresh's line said "source vNone -> v4" (and "first
    refresh" for any of them)."""
    from mv_assets.ops.refresh import RefreshResult

    def result(**kw):
        base = dict(view="v", from_version=None, to_version=4, view_version=7, full=False, rows_inserted=0,
                    rows_updated=0, rows_deleted=0, udf_rows_computed={}, tasks=0, tasks_resumed=0, seconds=0.1,
                    runner="none")
        return RefreshResult(**{**base, **kw})

    assert result().nothing_done() == "v: nothing to compute at source v4"
    assert result(from_version=4).nothing_done() == "v: nothing to refresh: it reflects source v4 already"
    assert result(from_version=2).nothing_done() == "v: source v2 -> v4 changed nothing it reads: nothing computed"
    assert result(tasks=1, rows_inserted=3).nothing_done() is None
    assert result(tasks=1).since() == "at source v4"
    assert result(tasks=1, first=True).since() == "first refresh, at source v4"
    assert result(tasks=1, from_version=2).since() == "source v2 -> v4"


def test_status_keeps_every_column_of_a_failed_view_with_a_long_name_on_one_line(catalog):
    """A view that never loaded, with a long name: its state and policy on
    its line at 80 columns (its state "FAILED_LOAD (invalid)" left the policy
    no room: blank, or one letter a line), the invalid mark explained below."""
    src = catalog.open_table("src")
    catalog.create_materialized_view("a_failing_view_name", src.search(None).select({"id": "id", "z": boom}))
    assert run(catalog, "refresh", "a_failing_view_name").exit_code == 1
    r = CliRunner().invoke(main, ["--db", catalog.uri, "status"], env={"COLUMNS": "80"}, catch_exceptions=False)
    lines = r.output.splitlines()
    assert all(len(line) <= 80 for line in lines), r.output
    (line,) = [line for line in lines if line.startswith("a_failing_view_name ")]
    assert line.split()[:2] == ["a_failing_view_name", "FAILED_LOAD*"] and " eager " in line, r.output
    assert "*: invalid: its rows are the query's at no source version (see its last error)" in r.output


def test_a_join_refresh_line_counts_its_updates_and_a_first_plan_says_so(tmp_path):
    """A join view's refresh line said "+0 -0" for a refresh that updated 10
    rows (its JSON said rows_updated 10); the plan of a view never refreshed
    said "vNone"; `errors --job` with a job id nobody ran said "none", exit 0;
    --max-rows-per-task 0 was refused in the Python parameter's name."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "k": i % 10} for i in range(100)], primary_key="id")
    d = db.create_table("d", [{"k": i, "name": f"n{i}"} for i in range(10)], primary_key="k")
    db.create_materialized_view("j", t.search(None).join(d, on="k", how="inner").select(
        {"id": "t.id", "name": "d.name"}))
    first = run(db, "plan", "j")
    assert first.exit_code == 0 and "vNone" not in first.output
    db.create_materialized_view("v", t.search(None).select({"id": "id", "n": (neg, ["k"])}))
    plan = run(db, "plan", "v")
    assert plan.output.startswith(f"v: source t (never refreshed) -> v{t.version} (first refresh)"), plan.output
    db.refresh("j")
    d.merge_insert([{"k": 0, "name": "renamed"}])
    r = run(db, "refresh", "j")
    assert r.exit_code == 0 and ": +0 ~10 -0, UDF rows computed: none;" in r.output, r.output
    bad = run(db, "errors", "j", "--job", "no-such-job")
    assert bad.exit_code == 2 and "no-such-job" in bad.output and "none" not in bad.output, bad.output
    zero = run(db, "backfill", "v", "n", "--max-rows-per-task", "0")
    assert zero.exit_code == 2 and "--max-rows-per-task" in zero.output, zero.output
    dry = run(db, "backfill", "v", "n", "--dry-run")
    assert "rows in" in dry.output or "row in" in dry.output
