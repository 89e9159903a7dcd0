"""What a request costs on the tests' S3 server (moto's, on 127.0.0.1) by the
size of the bucket: the catalog benches count requests exactly, but their
seconds are the server's, and moto's LIST filters every key of the bucket.

Prints the mean time of a LIST by prefix (with a delimiter, as Lance lists a
dataset's versions) and of a GET of a small object, in a bucket of 150 keys
and in one of 16,000 (1,000 datasets' worth of small files); on moto's server
as it comes and with its LIST answered from the keys under the prefix.

Usage: python bench/bench_s3_server_list.py
"""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from s3_server import S3Server  # noqa: E402


def main() -> None:
    for indexed in (False, True):
        print("moto's server, its LIST by prefix (tests/moto_indexed.py)" if indexed else "moto's server as it comes")
        _measure(S3Server(indexed_list=indexed))


def _measure(s3: S3Server) -> None:
    try:
        c = s3.client()
        small, big = s3.new_bucket(), s3.new_bucket()

        def put(bucket: str, key: str) -> None:
            c.put_object(Bucket=bucket, Key=key, Body=b"x")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: put(small, f"catalog/t{i % 10}.lance/_versions/{i}.manifest"), range(150)))
            list(pool.map(lambda i: put(big, f"catalog/t{i % 1000}.lance/data/{i}.lance"), range(15_000)))
            list(pool.map(lambda i: put(big, f"catalog/t{i}.lance/_versions/{i}.manifest"), range(1_000)))
        for label, bucket in (("150 keys", small), ("16,000 keys", big)):
            t0 = time.perf_counter()
            for i in range(100):
                c.list_objects_v2(Bucket=bucket, Prefix=f"catalog/t{i % 10}.lance/_versions/", Delimiter="/")
            t1 = time.perf_counter()
            for i in range(100):
                key = f"catalog/t{i % 10}.lance/_versions/{i % 10}.manifest"
                c.get_object(Bucket=bucket, Key=key)["Body"].read()
            t2 = time.perf_counter()
            print(f"{label:>12}: LIST by prefix {1000 * (t1 - t0) / 100:6.1f} ms, GET {1000 * (t2 - t1) / 100:6.1f} ms",
                  flush=True)
    finally:
        s3.stop()


if __name__ == "__main__":
    main()
