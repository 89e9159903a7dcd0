"""The UI, clicked in a real browser: Chromium (Debian's, /usr/bin/chromium)
driven by playwright against a real `dagster dev` on 127.0.0.1.

One story, as a new user lives it on the demo catalog (views declared in a
user module, sensors on): the lineage page shows the groups; the sensor
materializes everything with no failed run; "Materialize all" succeeds; an
append is picked up by the sensor; an edit of a UDF in the user's module,
then "Reload definitions", marks that column as changed, and "Materialize" on
it recomputes only that column with the new code stored in the view; the
checks tab's "Execute all" passes. Screenshots of every step are kept under
the test's tmp dir and copied to $MV_ASSETS_ARTIFACTS (default
test-artifacts/) when a step fails.
"""

import os
import shutil
import textwrap

import pyarrow as pa
import pytest
from oracle import count_calls

import mv_assets as mv
from mv_assets.api.declare import apply, load_declared
from mv_assets.dagster.assets import CHECK_NAMES
from mv_assets.dagster.devserver import dagster_dev, graphql, wait_until
from mv_assets.demo import _documents, checksum

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = os.environ.get("MV_ASSETS_CHROMIUM", "/usr/bin/chromium")

if os.environ.get("MV_ASSETS_REQUIRE_BROWSER"):  # CI: never skip silently
    import playwright.sync_api as playwright_api

    assert os.path.exists(CHROMIUM), f"no Chromium at {CHROMIUM} (apt-get install chromium)"
else:
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

VIEWS = '''
"""The user's views, declared in code."""
import mv_assets as mv
from mv_assets.demo import embedding
from oracle import record_call

CALLS = {calls!r}


@mv.udf
def word_count(body: str) -> int:
    record_call(CALLS, "word_count", body[:8])
    return {count}


@mv.udf
def first_word(body: str) -> str:
    record_call(CALLS, "first_word", body[:8])
    return body.split()[0]


def views(db):
    docs = db.open_table("documents")
    out = {{"doc_features": docs.search(None).where("lang = 'en'").select(
        {{"doc_id": "doc_id", "words": word_count, "first": first_word, "embedding": embedding}})}}
    if "doc_features" in db:
        out["long_docs"] = db.open_table("doc_features").search(None).where("words >= 30").select(
            {{"doc_id": "doc_id", "words": "words"}})
    return out
'''


def _write_views(path, calls, count="len(body.split())"):
    path.write_text(textwrap.dedent(VIEWS.format(calls=calls, count=count)))


def _catalog(root, views_file) -> mv.Connection:
    db = mv.connect(str(root / "catalog"), runner=mv.InlineRunner())
    schema = pa.schema([pa.field("doc_id", pa.int64(), nullable=False), pa.field("lang", pa.string()), pa.field("body", pa.string())])
    docs = db.create_table("documents", schema=schema, primary_key="doc_id")
    for start in range(0, 1200, 400):
        docs.add(_documents(start, 400))
    docs.add_columns({"checksum": checksum})
    for _ in range(2):
        for name, query in load_declared(str(views_file), db).items():
            if name not in db:
                apply(db, name, query)
    return db


class UI:
    """A browser page on the Dagster UI, with screenshots of every step."""

    def __init__(self, page, base, shots):
        self.page, self.base, self.shots, self.n = page, base, shots, 0
        # Dagster's first-visit newsletter dialog may open at any moment (a
        # timer): dismiss it whenever it is in the way of an action.
        page.add_locator_handler(
            page.get_by_text("Join the Dagster community"),
            lambda *_: page.get_by_role("button", name="Skip").click(),
        )

    def goto(self, path):
        self.page.goto(self.base + path)
        self.page.wait_for_load_state("networkidle")
        self._dismiss()

    def _dismiss(self):
        """Close the newsletter dialog if it is open now (the handler does it before actions)."""
        skip = self.page.get_by_role("dialog").get_by_role("button", name="Skip")
        try:
            if skip.count():
                skip.click(timeout=2_000)
        except Exception:  # closed meanwhile by the handler
            pass

    def shot(self, name):
        self._dismiss()
        self.n += 1
        self.page.screenshot(path=os.path.join(self.shots, f"{self.n:02d}-{name}.png"))

    def launch_all_partitions(self):
        """The launch dialog of a partitioned selection: every partition, launch."""
        dialog = self.page.get_by_role("dialog")
        dialog.get_by_role("button", name="All", exact=True).click()
        self.shot("launch-dialog")
        dialog.get_by_role("button", name="Launch backfill").click()
        dialog.wait_for(state="detached", timeout=30_000)



def _runs(base):
    return graphql(base, "{ runsOrError { ... on Runs { results { runId status } } } }")["runsOrError"]["results"]


def _latest_materialization(base, path):
    data = graphql(
        base,
        "query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset { assetMaterializations(limit: 1) "
        "{ timestamp } } } }",
        k={"path": path},
    )["assetOrError"]
    mats = data.get("assetMaterializations") or []
    return float(mats[0]["timestamp"]) if mats else 0.0


def _stale_causes(base, path, partition):
    data = graphql(
        base,
        "query($k: AssetKeyInput!, $p: String) { assetNodes(assetKeys: [$k]) { staleStatus(partition: $p) "
        "staleCauses(partition: $p) { reason } } }",
        k={"path": path}, p=partition,
    )["assetNodes"][0]
    return data["staleStatus"], [c["reason"] for c in data["staleCauses"]]


def _code_version(base, path):
    return graphql(base, "query($k: AssetKeyInput!) { assetNodes(assetKeys: [$k]) { opVersion } }", k={"path": path})[
        "assetNodes"][0]["opVersion"]


def _code_check(base, path):
    """Status of the newest udf_code_current evaluation of a column (None: never)."""
    runs = graphql(
        base,
        "query($k: AssetKeyInput!) { assetCheckExecutions(assetKey: $k, checkName: \"udf_code_current\", limit: 1) "
        "{ status evaluation { success } } }",
        k={"path": path},
    )["assetCheckExecutions"]
    if not runs:
        return None
    evaluation = runs[0]["evaluation"]
    return None if evaluation is None else ("SUCCEEDED" if evaluation["success"] else "FAILED")


def _current(db, names):
    src = db.open_table("documents")
    return all(db.open_table(n).status().versions_behind == 0 for n in names) and src.plan_backfill("checksum").rows == 0


@pytest.fixture
def artifacts(tmp_path, request):
    shots = tmp_path / "screenshots"
    shots.mkdir()
    yield str(shots)
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        dest = os.path.join(os.environ.get("MV_ASSETS_ARTIFACTS", os.path.join(ROOT, "test-artifacts")), request.node.name)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(shots, dest)
        for log in ("dagster_dev.log",):
            if (tmp_path / log).exists():
                shutil.copy(tmp_path / log, dest)


def test_ui_flows_in_chromium(tmp_path, artifacts):
    calls = tmp_path / "calls"
    calls.mkdir()
    views_file = tmp_path / "my_views.py"
    _write_views(views_file, str(calls))
    db = _catalog(tmp_path, views_file)
    env = {
        "MV_ASSETS_DB": db.uri,
        "MV_ASSETS_VIEWS": str(views_file),
        "MV_ASSETS_SENSOR_INTERVAL": "2",
        "MV_ASSETS_LOCAL_BELOW_ROWS": "1000000",  # demo-sized refreshes run in the run process
        "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]),
        "LANCE_LOG": "error",
    }
    workspace = os.path.join(ROOT, "workspace.yaml")
    home = str(tmp_path / "dagster_home")
    with dagster_dev(workspace, home, env, str(tmp_path / "dagster_dev.log"), immediate_runs=True) as base, \
            playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        ui = UI(browser.new_page(viewport={"width": 1500, "height": 950}), base, artifacts)
        try:
            # 1. The lineage page renders the groups.
            ui.goto("/asset-groups")
            for group in ("sources", "doc_features", "long_docs"):
                ui.page.get_by_text(group, exact=True).first.wait_for(timeout=60_000)
            ui.shot("lineage")

            # 2. The sensor materializes everything, no click, no failed run.
            wait_until(lambda: _current(db, ["doc_features", "long_docs"]), 120, "the sensor's first runs")
            wait_until(lambda: all(r["status"] == "SUCCESS" for r in _runs(base)), 60, "the runs to finish")
            assert not [r for r in _runs(base) if r["status"] == "FAILURE"]

            # 3. "Materialize all" on the lineage page: every partition, one backfill, success.
            before = {tuple(p): _latest_materialization(base, p) for p in (["doc_features"], ["long_docs"])}
            ui.goto("/asset-groups")
            ui.page.get_by_role("button", name="Materialize all").first.click()
            ui.launch_all_partitions()
            ui.shot("materialize-all-launched")
            wait_until(lambda: all(_latest_materialization(base, list(p)) > t for p, t in before.items()), 120,
                  "Materialize all to materialize every view")
            assert not [r for r in _runs(base) if r["status"] == "FAILURE"]

            # 4. An append is picked up by the sensor: both views follow.
            docs = db.open_table("documents")
            docs.add(_documents(5000, 40))
            wait_until(lambda: _current(db, ["doc_features", "long_docs"]), 120, "the sensor-driven refresh")
            ids = set(db.open_table("doc_features").to_arrow().column("doc_id").to_pylist())
            assert {i for i in range(5000, 5040) if i % 5} <= ids
            ui.goto("/asset-groups")
            ui.shot("after-append")

            # 5. The user edits the UDF in their module and clicks "Reload definitions".
            first_calls = count_calls(str(calls), "first_word")
            words_calls = count_calls(str(calls), "word_count")
            _write_views(views_file, str(calls), count="len(body.split(' '))")
            new_fp = load_declared(str(views_file), db)["doc_features"].to_definition().udf_columns[0].udf.fingerprint
            ui.goto("/asset-groups")
            ui.page.get_by_role("button", name="Reload definitions").click()
            wait_until(lambda: _code_version(base, ["doc_features", "words"]) == new_fp, 90, "the reloaded definitions")
            ui.goto("/assets/doc_features/words")
            ui.page.get_by_text(f"Code fingerprint {new_fp}").wait_for(timeout=60_000)
            ui.shot("words-code-changed")
            status, causes = _stale_causes(base, ["doc_features", "words"], "0")
            assert status == "STALE" and causes == ["has a new code version"]
            # the sensor marks the asset itself with a failed udf_code_current check
            wait_until(lambda: _code_check(base, ["doc_features", "words"]) == "FAILED", 60, "the code check to fail")
            assert _code_check(base, ["doc_features", "first"]) == "SUCCEEDED"
            ui.goto("/asset-groups?asset-selection=group:doc_features")
            ui.page.wait_for_timeout(2000)
            ui.shot("lineage-code-changed")
            ui.goto("/assets/doc_features/words")
            # ... and clicks "Materialize" on that column: only it is recomputed, with the new code stored.
            ui.page.get_by_role("button", name="Materialize", exact=False).first.click()
            ui.launch_all_partitions()
            wait_until(lambda: db.open_table("doc_features").definition.udf_columns[0].udf.fingerprint == new_fp
                  and db.open_table("doc_features").plan_backfill("words").rows == 0, 120, "the column recompute")
            rows = db.open_table("doc_features").count_rows()
            assert count_calls(str(calls), "word_count") - words_calls == rows
            assert count_calls(str(calls), "first_word") == first_calls  # the other UDF column: untouched
            # (the run records each partition's materialization after the engine's commit: a moment later)
            wait_until(lambda: _stale_causes(base, ["doc_features", "words"], "0") == ("FRESH", []), 60,
                       "the column to read fresh")
            wait_until(lambda: _code_check(base, ["doc_features", "words"]) == "SUCCEEDED", 60, "the code check to pass")
            ui.goto("/assets/doc_features/words")
            ui.shot("words-recomputed")

            # 6. The checks tab's "Execute all" passes.
            ui.goto("/assets/doc_features?view=checks")
            ui.page.get_by_role("button", name="Execute all").click()
            ui.page.wait_for_timeout(1000)
            ui.shot("checks-launched")

            def checks_passed():
                data = graphql(
                    base,
                    "query($k: AssetKeyInput!) { assetNodes(assetKeys: [$k]) { assetChecksOrError { "
                    "... on AssetChecks { checks { name executionForLatestMaterialization { status } } } } } }",
                    k={"path": ["doc_features"]},
                )["assetNodes"][0]["assetChecksOrError"]["checks"]
                statuses = [(c["executionForLatestMaterialization"] or {}).get("status") for c in data]
                assert "FAILED" not in statuses and "EXECUTION_FAILED" not in statuses, data
                return len(data) == len(CHECK_NAMES) and all(s == "SUCCEEDED" for s in statuses)

            wait_until(checks_passed, 120, "the checks")
            ui.goto("/assets/doc_features?view=checks")
            ui.shot("checks-passed")
            assert not [r for r in _runs(base) if r["status"] == "FAILURE"]
        finally:
            ui.shot("last")
            browser.close()
