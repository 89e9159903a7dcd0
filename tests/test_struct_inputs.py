"""A UDF parameter reading a field of a struct column, in Geneva's dot
notation (``input_columns=["info.vals"]``), and a list passed as a NumPy
array to a parameter annotated ``np.ndarray``: in a view and in a table's
computed column, through updates, with the view's checks, against an oracle
of plain pyarrow over the source."""

import numpy as np
import pyarrow as pa
import pytest

import mv_assets as mv

INFO = pa.struct([("vals", pa.list_(pa.int32())), ("tag", pa.string())])


def _rows(ids, vals=lambda i: list(range(i % 4)) if i % 5 else None, tag=lambda i: f"t{i}"):
    infos = [None if i % 7 == 3 else {"vals": vals(i), "tag": tag(i)} for i in ids]
    return pa.table({"id": pa.array(list(ids), pa.int64()), "info": pa.array(infos, INFO)})


def _oracle(table) -> dict:
    """id -> sum of info.vals (None where the struct or its field is NULL)."""
    t = table.to_arrow() if hasattr(table, "to_arrow") else table
    out = {}
    for r in t.to_pylist():
        info = r["info"]
        vals = None if info is None else info["vals"]
        out[r["id"]] = None if vals is None else int(sum(vals))
    return out


@mv.udf(data_type=pa.int64(), input_columns=["info.vals"])
def total(vals: np.ndarray | None) -> int | None:
    assert isinstance(vals, np.ndarray)
    return int(np.sum(vals))


@mv.udf(data_type=pa.string(), input_columns=["info.tag", "id"])
def labelled(tag: pa.Array, ident: pa.Array) -> pa.Array:
    return pa.array([f"{t}/{i}" for t, i in zip(tag.to_pylist(), ident.to_pylist(), strict=True)])


def test_a_view_reads_struct_fields_and_follows_updates(tmp_path):
    db = mv.connect(str(tmp_path / "catalog"))
    src = db.create_table("src", _rows(range(20)), primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "total": total, "label": labelled}))
    spec = {c.name: c for c in view.definition.udf_columns}
    assert spec["total"].the_udf.input_columns == ["info"]  # the struct column is what is read
    assert spec["total"].the_udf.input_paths == ["info.vals"]
    for change in (lambda: None, lambda: src.add(_rows(range(20, 30))),
                   lambda: (src.delete("id = 4"), src.add(_rows([4], vals=lambda i: [5, 6], tag=lambda i: "new"))),
                   lambda: src.delete("id < 3")):
        change()
        view.refresh()
        got = {r["id"]: r["total"] for r in view.to_arrow().to_pylist()}
        assert got == _oracle(src)
        labels = {r["id"]: r["label"] for r in view.to_arrow().to_pylist()}
        assert labels == {r["id"]: f"{r['info'] and r['info']['tag']}/{r['id']}" for r in src.to_arrow().to_pylist()}
    for scope in ("full", "last_refresh"):  # a NULL field under a present struct is an input NULL, not a gap
        outcomes = view.check(scope)
        assert all(o.passed for o in outcomes), [(o.name, o.metadata) for o in outcomes if not o.passed]


def test_a_table_column_reads_a_struct_field(tmp_path):
    db = mv.connect(str(tmp_path / "catalog"))
    tbl = db.create_table("t", _rows(range(12)))
    tbl.add_columns({"total": total})
    tbl.backfill("total")
    assert {r["id"]: r["total"] for r in tbl.to_arrow().to_pylist()} == _oracle(tbl)


def test_a_missing_struct_field_is_refused_before_anything_is_written(tmp_path):
    db = mv.connect(str(tmp_path / "catalog"))
    src = db.create_table("src", _rows(range(3)))
    bad = mv.udf(lambda v: 1, data_type=pa.int64(), input_columns=["info.nope"], name="bad")
    with pytest.raises(ValueError, match="info.nope"):
        db.create_materialized_view("v", src.search(None).select({"id": "id", "x": bad}))
    assert "v" not in db.table_names()


def test_with_declared_code_only_the_struct_field_is_still_read(tmp_path, monkeypatch):
    """``MV_ASSETS_CODE=declared`` runs the code this process declared, not the
    stored pickle: the declared UDF names ``info.vals``, and is bound as the
    view stored it (the struct column read, its field passed)."""
    db = mv.connect(str(tmp_path / "catalog"))
    src = db.create_table("src", _rows(range(10)))
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "total": total}))
    view.refresh()
    monkeypatch.setenv("MV_ASSETS_CODE", "declared")
    src.add(_rows(range(10, 16)))
    again = mv.connect(str(tmp_path / "catalog")).open_table("v")
    again.refresh()
    assert {r["id"]: r["total"] for r in again.to_arrow().to_pylist()} == _oracle(src)
