"""The S3 servers the tests and benches run: moto's as it comes, and moto's
with its LIST answered from the keys under the prefix (tests/moto_indexed.py,
what the catalog bench's ``--s3-list indexed`` runs). The second must answer
every listing as the first does, also after overwrites and deletes."""

import random

from s3_server import S3Server


def _listing(client, bucket: str, **kw) -> list:
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 7},
                                                                 **kw):
        out += [("key", o["Key"], o["Size"], o["ETag"]) for o in page.get("Contents", [])]
        out += [("prefix", p["Prefix"]) for p in page.get("CommonPrefixes", [])]
    return out


def test_the_indexed_server_lists_as_moto_does():
    rng = random.Random(7)
    names = [f"cat/t{rng.randrange(12)}.lance/{rng.choice(['_versions', 'data', '_transactions'])}/{i}.x"
             for i in range(300)] + ["cat/_mv_assets/summaries.json", "cat/t1.lance0/x", "cat/t1.lancf", "other/a"]
    plain, indexed = S3Server(), S3Server(indexed_list=True)
    try:
        sides = []
        for server in (plain, indexed):
            client = server.client()
            client.create_bucket(Bucket="same")
            for n in names:
                client.put_object(Bucket="same", Key=n, Body=n.encode())
            sides.append(client)
        queries = [{}, {"Prefix": "cat/"}, {"Prefix": "cat/", "Delimiter": "/"}, {"Prefix": "cat/t1.lance/"},
                   {"Prefix": "cat/t1.lance/_versions/", "Delimiter": "/"}, {"Prefix": "cat/t1"},
                   {"Prefix": "cat/t3.lance/", "StartAfter": "cat/t3.lance/data/150.x"}, {"Prefix": "nothing/"}]

        def same() -> None:
            for q in queries:
                assert _listing(sides[1], "same", **q) == _listing(sides[0], "same", **q), q

        same()
        for client in sides:  # overwritten (new e-tags), deleted, added: the index follows
            for n in names[::5]:
                client.put_object(Bucket="same", Key=n, Body=b"again " + n.encode())
            client.delete_objects(Bucket="same", Delete={"Objects": [{"Key": n} for n in names[1::7]]})
            client.delete_object(Bucket="same", Key=names[2])
            client.put_object(Bucket="same", Key="cat/t1.lance/_versions/new.x", Body=b"new")
            client.copy_object(Bucket="same", Key="cat/t2.lance/data/copied.x",
                               CopySource={"Bucket": "same", "Key": "cat/t1.lance/_versions/new.x"})
        same()
        assert any(k[1] == "cat/t1.lance/_versions/new.x" for k in _listing(sides[1], "same", Prefix="cat/t1.lance/"))
    finally:
        plain.stop()
        indexed.stop()
