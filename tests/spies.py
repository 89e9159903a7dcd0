"""Spies on what a plan reads, for the tests that bound it: what the view's
keys streamed (mv_assets.ops.refresh.ViewKeys) held, and the whole reads of
a dataset. Each installs itself with pytest's ``monkeypatch`` (``undo()`` ends it)."""

import os

import lance


def view_key_reads(monkeypatch, view_uri: str) -> tuple[list, list]:
    """Two lists that grow from now on: ``(rows streamed, rows kept)`` for
    each streamed read of a view's keys, and the columns of each read of the
    view at ``view_uri`` whole (no filter)."""
    from mv_assets.ops import refresh as refresh_ops

    held: list = []
    whole: list = []
    real_touching, real_to_table = refresh_ops.ViewKeys.touching, lance.LanceDataset.to_table

    def touching(self, ids):
        out = real_touching(self, ids)
        held.append((self.rows_read, self.rows_kept))
        return out

    def to_table(self, *a, **k):
        if self.uri == view_uri and k.get("filter") is None:
            whole.append(k.get("columns"))
        return real_to_table(self, *a, **k)

    monkeypatch.setattr(refresh_ops.ViewKeys, "touching", touching)
    monkeypatch.setattr(lance.LanceDataset, "to_table", to_table)
    return held, whole


def whole_source_scans(monkeypatch, uri: str) -> list:
    """A list that grows by one with each scan of every fragment of the
    dataset at ``uri`` (no ``fragments=``) from now on: its filter."""
    scans: list = []
    real = lance.LanceDataset.scanner
    name = os.path.basename(uri.rstrip("/"))

    def scanner(self, *args, **kwargs):
        if kwargs.get("fragments") is None and os.path.basename(self.uri.rstrip("/")) == name:
            scans.append(kwargs.get("filter"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "scanner", scanner)
    return scans
