"""Join views (kind "join"): every semantic checked against an oracle computed
independently, a nested-loop join in plain Python over each source read with
pylance at the version the view reflects (``view.source_versions``)."""

import datetime
import decimal
import itertools
import os
import random

import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runners import CrashAfter

import mv_assets as mv


@mv.udf(data_type=pa.string())
def caption(title: str, dur: float) -> str:
    return f"{title}|{dur}"


@mv.udf(data_type=pa.string())
def badge(name: str) -> str:
    return f"<{name}>"


CLIPS = pa.schema([("id", pa.int64()), ("video_id", pa.int64()), ("dur", pa.float64()), ("note", pa.string())])
VIDEOS = pa.schema([("vid", pa.int64()), ("title", pa.string()), ("lang", pa.string()), ("channel_id", pa.int64()),
                    ("views", pa.int64())])
CHANNELS = pa.schema([("channel_id", pa.int64()), ("name", pa.string()), ("country", pa.string())])


def clip_rows(rng, start, n, videos=8):
    return pa.Table.from_pylist([{"id": i, "video_id": None if rng.random() < 0.08 else rng.randrange(videos),
                                  "dur": float(rng.randrange(1, 9)), "note": rng.choice("ab")}
                                 for i in range(start, start + n)], schema=CLIPS)


def video_rows(rng, ids, channels=4):
    return pa.Table.from_pylist([{"vid": v, "title": f"t{rng.randrange(5)}", "lang": rng.choice(["en", "fr"]),
                                  "channel_id": None if rng.random() < 0.1 else rng.randrange(channels),
                                  "views": rng.randrange(100)} for v in ids], schema=VIDEOS)


def channel_rows(rng, ids):
    return pa.Table.from_pylist([{"channel_id": c, "name": f"c{rng.randrange(3)}", "country": rng.choice("xyz")}
                                 for c in ids], schema=CHANNELS)


def make_sources(db, rng, clips=40):
    return (db.create_table("clips", clip_rows(rng, 0, clips)),
            db.create_table("videos", video_rows(rng, range(6))),  # (videos 6, 7: clips that match nothing yet)
            db.create_table("channels", channel_rows(rng, range(3))))


def rows_at(db, name, version, options=None):
    return lance.dataset(db.open_table(name).uri, version=version, storage_options=options).to_table().to_pylist()


def _oracle_row(c, v, h) -> dict:
    """The view's row of clip ``c`` joined to video ``v`` and channel ``h`` (None: no match, LEFT)."""
    title = v["title"] if v else None
    return {"cid": c["id"], "title": title, "lang": v["lang"] if v else None,
            "name": h["name"] if h else None, "long": c["dur"] * 10,
            "cap": None if title is None else f"{title}|{c['dur']}",
            "badge": None if h is None else f"<{h['name']}>"}


# The views' filters, as SQL and as the oracle's predicate over (clip, video or None, channel or None):
# on the first table, and on joined columns (an anti-join, coalesce, a comparison meeting NULLs), where
# losing a joined row can make a first-table row enter the view.
FILTERS = {
    "clips": ("clips.dur >= 2", lambda c, v, h: c["dur"] >= 2),
    "orphans": ("clips.dur >= 2 AND channels.name IS NULL", lambda c, v, h: c["dur"] >= 2 and h is None),
    "coalesce": ("coalesce(videos.title, 'none') <> 't1'", lambda c, v, h: (v["title"] if v else "none") != "t1"),
    "compare": ("NOT (videos.views > 40)", lambda c, v, h: not v["views"] > 40),  # (NOT NULL: NULL)
}


def oracle_chain(db, versions, how, options=None, where="clips"):
    """clips ⋈ videos (video_id = vid) ⋈ channels (videos.channel_id = channel_id), filter, columns."""
    clips, videos, channels = (rows_at(db, n, versions[n], options) for n in ("clips", "videos", "channels"))
    out = []
    for c in clips:
        vs = [v for v in videos if c["video_id"] is not None and v["vid"] == c["video_id"]]
        if not vs and how == "left":
            vs = [None]
        for v in vs:
            chs = [h for h in channels if v is not None and v["channel_id"] is not None
                   and h["channel_id"] == v["channel_id"]]
            if not chs and how == "left":
                chs = [None]
            for h in chs:
                if not _passes(where, c, v, h):
                    continue
                out.append(_oracle_row(c, v, h))
    return sorted(out, key=_key)


def _passes(where, c, v, h) -> bool:
    """SQL's WHERE: a NULL (here: a comparison with a missing row's value) does not pass."""
    try:
        return bool(FILTERS[where][1](c, v, h))
    except TypeError:  # (None compared: NULL)
        return False


def oracle_star(db, versions, how, options=None, where="clips"):
    """clips ⋈ videos (video_id = vid) ⋈ channels (clips.video_id = channel_id): both joins on the first table."""
    clips, videos, channels = (rows_at(db, n, versions[n], options) for n in ("clips", "videos", "channels"))
    out = []
    for c in clips:
        key = c["video_id"]
        vs = [v for v in videos if key is not None and v["vid"] == key] or ([None] if how == "left" else [])
        chs = [h for h in channels if key is not None and h["channel_id"] == key] or ([None] if how == "left" else [])
        for v in vs:
            for h in chs:
                if not _passes(where, c, v, h):
                    continue
                out.append(_oracle_row(c, v, h))
    return sorted(out, key=_key)


def star_view(db, how, where="clips"):
    clips, videos, channels = (db.open_table(n) for n in ("clips", "videos", "channels"))
    q = (clips.search(None)
         .join(videos, left_on="video_id", right_on="vid", how=how)
         .join(channels, left_on="clips.video_id", right_on="channel_id", how=how)
         .where(FILTERS[where][0])
         .select({"cid": "clips.id", "title": "videos.title", "lang": "lang", "name": "name", "long": "dur * 10",
                  "cap": (caption, ["title", "dur"]), "badge": (badge, ["channels.name"])}))
    return db.create_materialized_view(f"star_{how}", q)


def _key(r):
    return tuple((v is None, v) for v in r.values())


def chain_view(db, how, where="clips"):
    clips, videos, channels = (db.open_table(n) for n in ("clips", "videos", "channels"))
    q = (clips.search(None)
         .join(videos, left_on="video_id", right_on="vid", how=how)
         .join(channels, on="channel_id", how=how)
         .where(FILTERS[where][0])
         .select({"cid": "clips.id", "title": "videos.title", "lang": "lang", "name": "name", "long": "dur * 10",
                  "cap": (caption, ["title", "dur"]), "badge": (badge, ["channels.name"])}))
    return db.create_materialized_view(f"chain_{how}", q)


def actual(view):
    return sorted(view.to_arrow().to_pylist(), key=_key)


def check(db, view, how, options=None):
    assert actual(view) == oracle_chain(db, view.source_versions, how, options)


def calls(result, column):
    """UDF calls a refresh made (counted by the executors)."""
    return result.udf_rows_computed.get(column, 0)


# -- the API and its names ------------------------------------------------------

def test_inner_and_left_join_match_the_oracle_and_keep_every_row_id(db):
    rng = random.Random(1)
    make_sources(db, rng)
    for how in ("inner", "left"):
        v = chain_view(db, how)
        db.refresh(v.name)
        check(db, v, how)
        keys = v.to_arrow(with_row_id=False) if False else lance.dataset(v.uri).to_table()
        assert {"__source_row_id", "__join_row_id_1", "__join_row_id_2"} <= set(keys.column_names)
        assert "__join_row_id_1" not in v.to_arrow().column_names  # internal: the reader sees the user's columns


def test_to_arrow_computes_the_join_in_process(db):
    rng = random.Random(2)
    make_sources(db, rng)
    clips, videos = db.open_table("clips"), db.open_table("videos")
    got = clips.search(None).join(videos, left_on="video_id", right_on="vid").select(["clips.id", "title"]).to_arrow()
    assert got.column_names == ["id", "title"]  # a qualified name selected: the column's own name
    by_vid = {r["vid"]: r["title"] for r in videos.to_arrow().to_pylist()}
    want = sorted((c["id"], by_vid[c["video_id"]]) for c in clips.to_arrow().to_pylist() if c["video_id"] in by_vid)
    assert sorted(zip(got.column("id").to_pylist(), got.column("title").to_pylist(), strict=True)) == want


def test_default_columns_and_using_keys(db):
    a = db.create_table("a", pa.table({"k": [1, 2, None], "x": [10, 20, 30]}))
    b = db.create_table("b", pa.table({"k": [1, 1, None], "y": ["p", "q", "r"]}))
    inner = a.search(None).join(b, on="k").to_arrow()
    assert inner.column_names == ["k", "x", "y"]  # on= keys once (USING), then each table's other columns
    assert sorted(inner.to_pylist(), key=lambda r: r["y"]) == [{"k": 1, "x": 10, "y": "p"}, {"k": 1, "x": 10, "y": "q"}]
    left = a.search(None).join(b, on="k", how="left").to_arrow().to_pylist()  # NULL keys never match
    assert sorted(left, key=lambda r: (r["x"], r["y"] or "")) == [
        {"k": 1, "x": 10, "y": "p"}, {"k": 1, "x": 10, "y": "q"}, {"k": 2, "x": 20, "y": None},
        {"k": None, "x": 30, "y": None}]


def test_many_to_many_gives_sqls_multiplicities(db):
    a = db.create_table("a", pa.table({"k": [1, 1, 2], "x": [1, 2, 3]}))
    b = db.create_table("b", pa.table({"k": [1, 1, 1, 2], "y": [1, 2, 3, 4]}))
    v = db.create_materialized_view("ab", a.search(None).join(b, on="k"))
    db.refresh("ab")
    assert v.count_rows() == 2 * 3 + 1
    b.delete("y = 2")
    r = db.refresh("ab")
    # the 4 pairs left are the same source rows as before: updates; the 2 with y = 2 go
    assert v.count_rows() == 2 * 2 + 1 and (r.rows_inserted, r.rows_updated, r.rows_deleted) == (0, 4, 2)


@pytest.mark.parametrize("make, match", [
    (lambda a, b, c: a.search(None).join(c, on="k"), "unknown column 'k' of 'c'"),
    (lambda a, b, c: a.search(None).join(b, left_on="nope", right_on="k"), "unknown column 'nope'"),
    (lambda a, b, c: a.search(None).join(b, left_on="zz.k", right_on="k"), "unknown table 'zz'"),
    (lambda a, b, c: a.search(None).join(b, on="k", how="right"), "how='right' is not supported"),
    (lambda a, b, c: a.search(None).join(b, on="k", how="outer"), "'inner' or 'left'"),
    (lambda a, b, c: a.search(None).join(b, on="a.k < b.k"), "equi-joins"),
    (lambda a, b, c: a.search(None).join(b, left_on="k", right_on=["k", "x"]), "one per key"),
    (lambda a, b, c: a.search(None).join(b, left_on="s", right_on="k"), "join key types differ"),
    (lambda a, b, c: a.search(None).join(b, on="k").select(["x"]).to_definition(), "'x' is ambiguous"),
    (lambda a, b, c: a.search(None).join(b, on="k").to_definition(), "select\\(\\) the columns"),
    (lambda a, b, c: a.search(None).join(b, on="k").where("b.nope > 1").select(["a.x"]).to_definition(),
     "unknown column 'nope' of 'b'"),
    (lambda a, b, c: a.search(None).join(b, on="k").select({"v": "a.x + b.x + "}).to_definition(),
     "cannot parse|invalid join view query"),
    (lambda a, b, c: a.search(None).join(a, on="k"), "joined twice"),
    (lambda a, b, c: a.search(None).join("b", on="k"), "takes a table or materialized view"),
    (lambda a, b, c: a.search(None).group_by("k").join(b, on="k"), "comes before"),
    (lambda a, b, c: a.search(None).join(b, on="k").group_by("k").agg({"n": "count(*)"}).to_definition(),
     "is a join aggregate: create it with"),
])
def test_bad_joins_are_refused_in_the_users_words(db, make, match):
    a = db.create_table("a", pa.table({"k": [1], "x": [1], "s": ["1"]}))
    b = db.create_table("b", pa.table({"k": [1], "x": [2]}))
    c = db.create_table("c", pa.table({"j": [1]}))
    with pytest.raises(ValueError, match=match):
        make(a, b, c)
    assert db.table_names() == ["a", "b", "c"]  # nothing written


def test_a_source_without_stable_row_ids_is_refused_before_anything_is_written(db, tmp_path):
    a = db.create_table("a", pa.table({"k": [1], "x": [1]}))
    lance.write_dataset(pa.table({"k": [1], "y": [2]}), db.open_table("a").uri.replace("a.lance", "plain.lance"))
    plain = db.open_table("plain")
    with pytest.raises(ValueError, match="stable row ids"):
        db.create_materialized_view("v", a.search(None).join(plain, on="k"))
    assert "v" not in db.table_names()


# -- incremental refresh, each direction ----------------------------------------

@pytest.mark.parametrize("how", ["inner", "left"])
def test_each_kind_of_change_is_incremental_and_exact(db, how):
    rng = random.Random(3)
    clips, videos, channels = make_sources(db, rng)
    v = chain_view(db, how)
    first = db.refresh(v.name)
    assert first.full
    check(db, v, how)

    videos.update(where="vid = 1", values={"views": 999})  # a column the view does not read: no change at all
    r = db.refresh(v.name)
    assert not r.full and r.rows_deleted == r.rows_inserted == 0 and not any(r.udf_rows_computed.values())
    assert v.source_versions["videos"] == videos.version  # (the new version is recorded)
    check(db, v, how)

    videos.update(where="vid = 1", values={"lang": "xx"})  # read by the view, by no UDF: rows rewritten, 0 calls
    r = db.refresh(v.name)
    assert not r.full and r.rows_updated > 0 and calls(r, "cap") == 0 and calls(r, "badge") == 0
    check(db, v, how)

    videos.update(where="vid = 2", values={"title": "new"})  # read by caption: its matching rows exactly
    r = db.refresh(v.name)
    matching = [c for c in clips.to_arrow().to_pylist() if c["video_id"] == 2 and c["dur"] >= 2]
    assert calls(r, "cap") == len(matching) and calls(r, "badge") == 0
    check(db, v, how)

    videos.update(where="vid = 3", values={"channel_id": 2})  # a mid-chain key: caption's inputs did not change
    r = db.refresh(v.name)
    assert calls(r, "cap") == 0
    check(db, v, how)

    clips.add(clip_rows(rng, 1000, 5))  # appended facts: their rows only
    r = db.refresh(v.name)
    assert calls(r, "cap") <= 5 and r.rows_deleted == 0
    check(db, v, how)
    held = lance.dataset(v.uri).to_table(columns=["cid", "__source_row_version"], filter="cid >= 1000")
    assert set(held.column("__source_row_version").to_pylist()) <= {clips.version}  # (the version each reflects)

    videos.add(video_rows(rng, [6, 7]))  # a dimension insert: unmatched facts now match (a LEFT row loses its NULLs)
    db.refresh(v.name)
    check(db, v, how)

    channels.delete("channel_id = 0")  # matches lost (INNER rows go, LEFT rows are padded)
    db.refresh(v.name)
    check(db, v, how)

    clips.update(where="id % 5 = 0", values={"video_id": 7})  # fact key updates
    videos.delete("vid = 4")  # and a change on the other side, in the same refresh
    db.refresh(v.name)
    check(db, v, how)

    lance.dataset(clips.uri).optimize.compact_files()  # compaction: free
    lance.dataset(videos.uri).optimize.compact_files()
    r = db.refresh(v.name)
    assert r.rows_inserted == r.rows_deleted == 0 and not any(r.udf_rows_computed.values())
    check(db, v, how)
    assert db.refresh(v.name).tasks == 0  # nothing moved: nothing done


def test_a_dimension_change_touches_only_its_rows(db):
    rng = random.Random(5)
    make_sources(db, rng, clips=200)
    v = chain_view(db, "inner")
    db.refresh(v.name)
    plan = v.plan_refresh()
    assert not plan.has_work
    db.open_table("channels").update(where="channel_id = 1", values={"name": "q"})
    plan = v.plan_refresh()
    held = [r for r in v.to_arrow().to_pylist()]
    # only the first-table rows that reach channel 1 are recomputed
    reach = {c["id"] for c in db.open_table("clips").to_arrow().to_pylist()
             for vv in db.open_table("videos").to_arrow().to_pylist()
             if c["video_id"] == vv["vid"] and vv["channel_id"] == 1 and c["dur"] >= 2}
    # (recomputed from the same source rows: updates)
    assert (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete) == (0, len(reach), 0)
    assert 0 < len(reach) < len(held)
    assert plan.reason.startswith("incremental (channels")


def test_recreated_or_overwritten_source_rebuilds(db):
    rng = random.Random(6)
    make_sources(db, rng)
    v = chain_view(db, "left")
    db.refresh(v.name)
    lance.write_dataset(video_rows(rng, range(8)), db.open_table("videos").uri, mode="overwrite")
    r = db.refresh(v.name)
    assert r.full
    check(db, v, "left")


def test_refresh_by_spark_tasks(spark_db):
    pytest.importorskip("pyspark")
    rng = random.Random(7)
    make_sources(spark_db, rng, clips=60)
    v = chain_view(spark_db, "left")
    spark_db.refresh(v.name, max_rows_per_task=20)
    check(spark_db, v, "left")
    spark_db.open_table("videos").update(where="vid = 1", values={"title": "s"})
    spark_db.refresh(v.name)
    check(spark_db, v, "left")


test_refresh_by_spark_tasks = pytest.mark.spark(test_refresh_by_spark_tasks)


# -- random histories, by us and by other writers -------------------------------

OPS = ["add_clips", "delete_clips", "update_clip_dur", "update_clip_key", "add_videos", "delete_videos",
       "update_video_title", "update_video_unread", "update_video_key", "add_channels", "delete_channels",
       "update_channel_name", "pylance_merge_videos", "pylance_delete_clips", "lancedb_update_channels",
       "pylance_recreate_videos", "compact", "refresh"]


def apply(db, op, k, rng, state):
    clips, videos, channels = (db.open_table(n) for n in ("clips", "videos", "channels"))
    if op == "add_clips":
        clips.add(clip_rows(rng, state["next"], 1 + k % 6, videos=10))
        state["next"] += 1 + k % 6
    elif op == "delete_clips":
        clips.delete(f"id % {3 + k % 5} = {k % 3}")
    elif op == "update_clip_dur":
        clips.update(f"id % {2 + k % 4} = 0", values_sql={"dur": f"dur + {k % 3}"})
    elif op == "update_clip_key":
        clips.update(f"id % {3 + k % 4} = 1", values_sql={"video_id": f"{k % 10}"})
    elif op == "add_videos":
        existing = {r["vid"] for r in videos.to_arrow().to_pylist()}
        videos.add(video_rows(rng, [x for x in range(10) if x not in existing][:2] or [100 + k]))
    elif op == "delete_videos":
        videos.delete(f"vid = {k % 10}")
    elif op == "update_video_title":
        videos.update(f"vid % 3 = {k % 3}", values_sql={"title": f"'u{k % 4}'"})
    elif op == "update_video_unread":
        videos.update(f"vid % 2 = {k % 2}", values_sql={"views": f"views + {k}"})
    elif op == "update_video_key":
        videos.update(f"vid = {k % 10}", values_sql={"channel_id": f"{k % 5}"})
    elif op == "add_channels":
        existing = {r["channel_id"] for r in channels.to_arrow().to_pylist()}
        channels.add(channel_rows(rng, [x for x in range(5) if x not in existing][:1] or [50 + k]))
    elif op == "delete_channels":
        channels.delete(f"channel_id = {k % 5}")
    elif op == "update_channel_name":
        channels.update(f"channel_id = {k % 5}", values_sql={"name": f"'n{k % 3}'"})
    elif op == "pylance_merge_videos":
        new = video_rows(rng, [k % 10, (k + 3) % 10])
        lance.dataset(videos.uri).merge_insert("vid").when_matched_update_all().when_not_matched_insert_all().execute(new)
    elif op == "pylance_delete_clips":
        lance.dataset(clips.uri).delete(f"dur > {k % 9}")
    elif op == "lancedb_update_channels":
        import lancedb

        lancedb.connect(db.uri).open_table("channels").update(where=f"channel_id % 2 = {k % 2}",
                                                                values={"country": "L"})
    elif op == "pylance_recreate_videos":  # written anew by another tool: row ids restart (a rebuild)
        lance.write_dataset(video_rows(rng, range(k % 9)), videos.uri, mode="overwrite")
    elif op == "compact":
        lance.dataset([clips, videos, channels][k % 3].uri).optimize.compact_files()
    else:
        return True
    return False


@pytest.mark.parametrize("shape", ["chain", "star"])
@pytest.mark.parametrize("how", ["inner", "left"])
@settings(max_examples=int(os.environ.get("MV_ASSETS_HYPOTHESIS_EXAMPLES", "8")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000)), min_size=2, max_size=10),
       joined_filter=st.sampled_from(["orphans", "coalesce", "compare"]))
@pytest.mark.parametrize("filtered", ["first table", "joined columns"])
def test_random_histories_match_the_oracle(tmp_path_factory, how, shape, filtered, ops, joined_filter):
    """Chain (clips -> videos -> channels) and star (both joins on clips) joins,
    INNER and LEFT, filtered on the first table or on joined columns (IS NULL,
    coalesce, a comparison), over random histories on every side, by us,
    pylance and lancedb (recreation and compaction included), checked after
    every refresh."""
    db = mv.connect(str(tmp_path_factory.mktemp("join")), runner=mv.InlineRunner())
    rng = random.Random(len(ops))
    make_sources(db, rng)
    where = "clips" if filtered == "first table" else joined_filter
    v, oracle = ((chain_view(db, how, where), oracle_chain) if shape == "chain"
                 else (star_view(db, how, where), oracle_star))
    db.refresh(v.name)
    state = {"next": 100}
    for op, k in ops:
        if apply(db, op, k, rng, state):
            db.refresh(v.name)
            assert actual(v) == oracle(db, v.source_versions, how, where=where)
    db.refresh(v.name)
    assert actual(v) == oracle(db, v.source_versions, how, where=where)


# every sequence of up to 2 operations (MV_ASSETS_JOIN_DEPTH=3: up to 3), checked after every step
CLASSES = [op for op in OPS if op not in ("refresh", "compact")]
DEPTH = int(os.environ.get("MV_ASSETS_JOIN_DEPTH", "2"))


def _sequences():
    seqs = [s for n in range(1, min(DEPTH, 2) + 1) for s in itertools.product(CLASSES, repeat=n)]
    if DEPTH >= 3:
        seqs += list(itertools.product(CLASSES, repeat=3))
    return seqs


def test_every_short_sequence_matches_the_oracle_after_every_step(tmp_path_factory):
    rng = random.Random(11)
    base = tmp_path_factory.mktemp("seqs")
    db = mv.connect(str(base / "db"), runner=mv.InlineRunner())
    make_sources(db, rng)
    checked = 0
    for n, seq in enumerate(_sequences()):
        how = "left" if n % 2 else "inner"
        v = db.create_materialized_view(f"s{n}", _chain_query(db, how))
        db.refresh(v.name)
        for step, op in enumerate(seq):
            apply(db, op, n * 7 + step, rng, {"next": 10_000 + n * 100 + step * 10})
            db.refresh(v.name)
            check(db, v, how)
            checked += 1
        db.drop_table(v.name)
    assert checked == sum(len(s) for s in _sequences())


def _chain_query(db, how):
    clips, videos, channels = (db.open_table(n) for n in ("clips", "videos", "channels"))
    return (clips.search(None).join(videos, left_on="video_id", right_on="vid", how=how)
            .join(channels, on="channel_id", how=how).where("clips.dur >= 2")
            .select({"cid": "clips.id", "title": "videos.title", "lang": "lang", "name": "name", "long": "dur * 10",
                     "cap": (caption, ["title", "dur"]), "badge": (badge, ["channels.name"])}))


def test_status_and_policy_see_a_joined_table_move(db):
    """A change to a joined table alone makes the view stale in the status,
    and the eager policy (the Dagster sensor's question) asks for a refresh."""
    rng = random.Random(8)
    make_sources(db, rng)
    v = chain_view(db, "inner")
    db.refresh(v.name)
    assert not v.refresh_decision().refresh
    status = {s["name"]: s for s in db.status().to_pylist()}[v.name]
    assert status["versions_behind"] == 0 and status["stale_count"] == 0
    db.open_table("channels").update(where="channel_id = 1", values={"name": "moved"})
    decision = v.refresh_decision()
    assert decision.refresh and "joined table" in decision.reason
    status = {s["name"]: s for s in db.status().to_pylist()}[v.name]
    assert status["versions_behind"] == 1 and status["stale_count"] == 1
    latest = {n: db.open_table(n).version for n in ("clips", "videos", "channels")}
    assert v.pending_source_versions() == [latest["channels"]]
    db.refresh(v.name)
    assert not v.refresh_decision().refresh
    assert {s["name"]: s for s in db.status().to_pylist()}[v.name]["versions_behind"] == 0
    assert v.source_versions == latest


def test_checks_recompute_the_join_and_catch_a_damaged_view(db):
    rng = random.Random(9)
    make_sources(db, rng)
    v = chain_view(db, "left")
    db.refresh(v.name)
    db.open_table("videos").update(where="vid = 2", values={"title": "z"})
    db.open_table("clips").delete("id = 3")
    db.refresh(v.name)
    assert {c.name: c.passed for c in v.check()} == {
        "no_orphan_rows": True, "matches_source_query": True, "values_match_source": True,
        "udf_values_present": True}
    # the newest refresh's window: the clips of video 2 (updated), clip 3 (deleted), nothing else read
    window = {c.name: c for c in v.check(scope="last_refresh")}
    assert all(c.passed and c.metadata["scope"] == "last_refresh" and "last refresh: the" in c.description
               for c in window.values())
    clip_ids = {r["id"] for r in db.open_table("clips").to_arrow().to_pylist()}
    assert 0 < window["matches_source_query"].metadata["first_rows_checked"] < len(clip_ids)
    assert window["matches_source_query"].metadata["source_rows_changed"] == {"clips": 1, "videos": 1}
    lance.dataset(v.uri).update({"title": "'wrong'"}, where="cid = 5")  # another tool damages it
    lance.dataset(v.uri).delete("cid = 7")
    for got in ({c.name: c for c in v.check()}, {c.name: c for c in v.check(scope="last_refresh")}):
        # (in full, and in the window: another tool's writes after the refresh are in it)
        assert not got["values_match_source"].passed and got["values_match_source"].metadata[
            "differing_by_column"]["title"] >= 1
        assert not got["matches_source_query"].passed and got["matches_source_query"].metadata["missing"] >= 1


def test_plan_refresh_is_an_exact_dry_run(db):
    """plan_refresh counts the view rows and each UDF's calls exactly (the join
    computed, no UDF called); the refresh then does what it said."""
    rng = random.Random(10)
    make_sources(db, rng)
    v = chain_view(db, "left")
    first_plan = v.plan_refresh()
    r = db.refresh(v.name)
    assert (first_plan.rows_to_insert, first_plan.udf_rows) == (r.rows_inserted, r.udf_rows_computed)
    db.open_table("videos").update(where="vid % 2 = 0", values={"title": "even"})
    db.open_table("channels").update(where="channel_id = 1", values={"country": "w"})
    plan = v.plan_refresh()
    assert plan.reason.startswith("incremental (videos") and plan.details["sources"] == {
        n: db.open_table(n).version for n in ("clips", "videos", "channels")}
    r = db.refresh(v.name)
    assert (plan.rows_to_insert, plan.rows_to_delete, plan.udf_rows) == (
        r.rows_inserted, r.rows_deleted, r.udf_rows_computed)
    assert plan.udf_rows["badge"] == 0 < plan.udf_rows["cap"]  # (no channel name changed)
    check(db, v, "left")


def test_views_over_a_join_view_stay_incremental(db):
    """An aggregate view and a filtered view over a join view, and a scalar
    index on it, follow a dimension change through the join view's refresh."""
    rng = random.Random(12)
    make_sources(db, rng, clips=120)
    j = chain_view(db, "inner")
    db.refresh(j.name)
    per_lang = db.create_materialized_view("per_lang", j.search(None).group_by("lang").agg(
        {"n": "count(*)", "total": "sum(long)"}))
    long_ones = db.create_materialized_view("long_ones", j.search(None).where("long >= 50").select(["cid", "cap"]))
    db.refresh("per_lang")
    db.refresh("long_ones")
    j.create_scalar_index("cid")

    def expected():
        rows = oracle_chain(db, j.source_versions, "inner")
        groups: dict = {}
        for r in rows:
            n, t = groups.get(r["lang"], (0, 0.0))
            groups[r["lang"]] = (n + 1, t + r["long"])
        return groups, sorted((r["cid"], r["cap"]) for r in rows if r["long"] >= 50)

    db.open_table("videos").update(where="vid % 2 = 1", values={"lang": "de", "title": "odd"})
    db.refresh(j.name)
    r1, r2 = db.refresh("per_lang"), db.refresh("long_ones")
    assert not r1.full and not r2.full
    groups, longs = expected()
    assert {r["lang"]: (r["n"], r["total"]) for r in per_lang.to_arrow().to_pylist()} == groups
    assert sorted((r["cid"], r["cap"]) for r in long_ones.to_arrow().to_pylist()) == longs
    assert j.search(None).where("cid = 5").to_arrow().num_rows == sum(
        1 for r in oracle_chain(db, j.source_versions, "inner") if r["cid"] == 5)


def test_restore_and_cleaned_history_rebuild(db):
    rng = random.Random(13)
    make_sources(db, rng)
    v = chain_view(db, "left")
    db.refresh(v.name)
    videos = db.open_table("videos")
    before = videos.version
    videos.update(where="vid = 1", values={"title": "changed"})
    db.refresh(v.name)
    videos.restore(before)  # row ids no longer mean the same rows: rebuilt
    r = db.refresh(v.name)
    assert r.full
    check(db, v, "left")
    channels = db.open_table("channels")
    channels.update(where="channel_id = 0", values={"name": "gone"})
    lance.dataset(channels.uri).cleanup_old_versions(older_than=datetime.timedelta(0),
                                                     delete_unverified=True)
    r = db.refresh(v.name)
    assert r.full  # the change feed since the reflected version is gone
    check(db, v, "left")


def test_a_join_view_that_is_not_materialized_is_computed_when_read(db):
    rng = random.Random(15)
    make_sources(db, rng)
    live = db.create_view("live", _chain_query(db, "left"))
    assert live.schema.names == ["cid", "title", "lang", "name", "long", "cap", "badge"]
    versions = {n: db.open_table(n).version for n in ("clips", "videos", "channels")}
    assert sorted(live.to_arrow().to_pylist(), key=_key) == oracle_chain(db, versions, "left")
    db.open_table("channels").update(where="channel_id = 2", values={"name": "now"})  # read anew each time
    versions["channels"] = db.open_table("channels").version
    assert sorted(live.to_arrow().to_pylist(), key=_key) == oracle_chain(db, versions, "left")


def test_a_join_view_declared_in_code_is_described_before_it_exists(db):
    """The Dagster wiring describes a view declared in code from its query,
    over every source (nothing written)."""
    make_sources(db, random.Random(16))
    d = db.describe_query("declared", _chain_query(db, "inner"))
    assert [n for n, _ in d.schema] == ["cid", "title", "lang", "name", "long", "cap", "badge"]
    assert d.definition["function"]["sources"] == ["clips", "videos", "channels"]
    assert "declared" not in db.table_names()


def test_lineage_follows_every_source_of_a_join(db):
    """A join whose joined side is a view: refreshing the join while that view
    is behind is refused; upstream=True refreshes it first; dependents and the
    lineage order know the join reads every table."""
    from mv_assets import SourceBehindError

    rng = random.Random(17)
    clips, videos, _ = make_sources(db, rng)
    en = db.create_materialized_view("en_videos", videos.search(None).where("lang = 'en'"))
    db.refresh("en_videos")
    j = db.create_materialized_view("en_clips", clips.search(None).join(en, left_on="video_id", right_on="vid")
                                    .select({"cid": "clips.id", "title": "title"}))
    db.refresh("en_clips")
    assert db.dependents("videos") == ["en_videos"] and "en_clips" in db.dependents("en_videos")
    assert db.dependents("clips") == ["en_clips"]
    assert db.lineage_order(["en_clips", "en_videos"]) == ["en_videos", "en_clips"]
    assert db.upstream("en_clips") == ["en_videos"] and j.sources == ["clips", "en_videos"]
    videos.update(where="vid = 1", values={"lang": "en", "title": "now en"})
    with pytest.raises(SourceBehindError, match="reads view 'en_videos', which is 1 version"):
        db.refresh("en_clips")
    db.refresh("en_clips", upstream=True)
    want = sorted((c["id"], v["title"]) for c in clips.to_arrow().to_pylist() for v in videos.to_arrow().to_pylist()
                  if v["lang"] == "en" and c["video_id"] == v["vid"])
    assert sorted((r["cid"], r["title"]) for r in j.to_arrow().to_pylist()) == want


def test_a_killed_refresh_resumes_without_computing_finished_tasks_again(db):
    """Two of four tasks finished, then the driver died: nothing is visible,
    and the next refresh resumes them from their checkpoints (UDF calls only
    for the two unfinished tasks), equal to the oracle."""
    rng = random.Random(18)
    make_sources(db, rng, clips=80)
    v = chain_view(db, "left")

    with pytest.raises(RuntimeError, match="driver died"):
        v.refresh(runner=CrashAfter(), max_rows_per_task=20)
    assert lance.dataset(v.uri).count_rows() == 0  # nothing half-visible
    whole = v.plan_refresh(max_rows_per_task=20).udf_rows["cap"]
    r = v.refresh(max_rows_per_task=20)
    assert (r.tasks, r.tasks_resumed) == (4, 2)
    assert 0 < r.udf_rows_computed["cap"] < whole  # the finished tasks' rows were not computed again
    check(db, v, "left")


def test_a_changed_join_is_a_changed_view(db):
    """What a join joins decides the view's rows: a view declared in code whose
    join changed is reported (not silently kept), and the stored shape covers
    the join's keys and names."""
    from mv_assets.api.declare import reconcile

    rng = random.Random(19)
    clips, videos, channels = make_sources(db, rng)
    db.create_materialized_view("declared", _chain_query(db, "inner"))
    assert reconcile(db, "declared", _chain_query(db, "inner")).problems == []
    assert reconcile(db, "declared", _chain_query(db, "left")).problems  # INNER -> LEFT: other rows
    other = (clips.search(None).join(videos, left_on="id", right_on="vid").join(channels, on="channel_id")
             .where("clips.dur >= 2").select({"cid": "clips.id", "title": "videos.title", "lang": "lang",
                                              "name": "name", "long": "dur * 10", "cap": (caption, ["title", "dur"]),
                                              "badge": (badge, ["channels.name"])}))
    assert reconcile(db, "declared", other).problems  # another key
    assert _chain_query(db, "inner").to_definition().shape_fingerprint() != other.to_definition().shape_fingerprint()


def test_the_cli_says_which_sources_moved_and_how_the_view_was_refreshed(db):
    from click.testing import CliRunner

    from mv_assets.cli import main

    def cli(*args):
        return CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", *args], catch_exceptions=False).output

    make_sources(db, random.Random(20))
    chain_view(db, "inner")
    first = cli("refresh", "chain_inner")
    assert "sources clips (new) -> v" in first and "channels (new) -> v" in first and ": full: +" in first
    channels = db.open_table("channels")
    before = channels.version
    channels.update(where="channel_id = 1", values={"name": "cli"})
    plan = cli("plan", "chain_inner")
    assert plan.startswith(f"chain_inner: sources channels v{before} -> v{channels.version} (incremental (channels")
    out = cli("refresh", "chain_inner")
    assert f"sources channels v{before} -> v{channels.version}: incremental: +" in out
    assert "join view" in cli("tables") and "clips, videos, channels" in cli("tables")


@pytest.mark.parametrize("keys", [
    pa.array([1_600_000_000_000_000_001 + i for i in range(4)], pa.timestamp("ns")),
    pa.array([datetime.datetime(2020, 1, 1, i, tzinfo=datetime.timezone.utc) for i in range(4)],
             pa.timestamp("ms", tz="America/New_York")),
    pa.array([decimal.Decimal(f"{i}.50") for i in range(4)], pa.decimal128(10, 2)),
    pa.array([decimal.Decimal(f"{i}.50") for i in range(4)], pa.decimal256(40, 2)),
], ids=["timestamp_ns", "timestamp_zoned", "decimal", "decimal256"])
def test_timestamp_and_decimal_keys_match_through_the_key_filter(db, keys):
    """A refresh reads the joined rows whose keys can match through an IN
    filter of SQL literals: a nanosecond or zoned timestamp key matched
    nothing (the view silently lost every joined row), a decimal key made
    Lance refuse the filter (a float literal)."""
    dims = db.create_table("dims", pa.table({"k": keys, "label": [f"L{i}" for i in range(4)]}))
    facts = db.create_table("facts", pa.table({"id": [0, 1], "k": keys.take([0, 1])}))
    v = db.create_materialized_view("v", facts.search(None).join(dims, on="k").select({"id": "id", "label": "label"}))
    v.refresh()
    facts.add(pa.table({"id": [2, 3], "k": keys.take([2, 3])}))
    v.refresh()
    got = sorted(v.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert got == [{"id": i, "label": f"L{i}"} for i in range(4)]
    assert all(o.passed for o in v.check())


def _swap(uri: str, a: str, b: str) -> None:
    """Another tool swaps the names of columns ``a`` and ``b`` (three renames: no row version moves)."""
    for path, name in ((a, "__tmp"), (b, a), ("__tmp", b)):
        lance.dataset(uri).alter_columns({"path": path, "name": name})


def test_columns_renamed_or_dropped_by_another_tool_under_a_join_view(db):
    """Another tool swaps two columns' names on the first and the joined
    table (no row version moves): the join view and the join aggregate are
    rebuilt, their rows the oracle's (they kept the old values for good,
    refresh after refresh, only check() telling). A column a join reads
    dropped: plan and refresh refuse in our words (a KeyError from inside)."""
    t = db.create_table("t", pa.table({"id": [1, 2], "dk": [1, 2], "x": [5, 6], "w": [500, 600]}), primary_key="id")
    d = db.create_table("d", pa.table({"k": [1, 2], "name": ["p", "q"], "alt": ["P", "Q"]}), primary_key="k")
    j = db.create_materialized_view(
        "j", t.search(None).join(d, left_on="dk", right_on="k").select({"id": "t.id", "x": "x", "name": "name"}))
    ja = db.create_materialized_view(
        "ja", t.search(None).join(d, left_on="dk", right_on="k").group_by("name").agg({"s": "sum(x)"}))
    db.refresh(["j", "ja"])
    _swap(t.uri, "x", "w")
    _swap(d.uri, "name", "alt")
    r = j.refresh()
    assert r.full
    assert sorted((r["id"], r["x"], r["name"]) for r in j.to_arrow().to_pylist()) == [(1, 500, "P"), (2, 600, "Q")]
    ja.refresh()
    assert sorted((r["name"], r["s"]) for r in ja.to_arrow().to_pylist()) == [("P", 500), ("Q", 600)]
    assert all(c.passed for c in [*j.check(), *ja.check()])
    assert not j.refresh().full  # (rebuilt once: the ids it read are recorded)
    lance.dataset(d.uri).drop_columns(["name"])
    for call in (j.plan_refresh, j.refresh, ja.refresh):
        with pytest.raises(ValueError, match=r"view '(j|ja)' reads column 'name' of 'd', which version \d+ does "
                                             "not have"):
            call()
