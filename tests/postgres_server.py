"""A throw-away PostgreSQL server on 127.0.0.1 (Debian's postgresql package),
for Dagster's Postgres storage in tests; stopped by PID."""

import glob
import os
import shutil
import subprocess
import tempfile
import time

from mv_assets.dagster.devserver import free_port


def postgres_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


class PostgresServer:
    def __init__(self) -> None:
        initdb, postgres = postgres_bin("initdb"), postgres_bin("postgres")
        if not initdb or not postgres:
            raise FileNotFoundError("PostgreSQL server binaries (Debian's postgresql) are not installed")
        self.dir = tempfile.mkdtemp(prefix="mv_pg_")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        # the server refuses to run as root: run it as the postgres user then
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.prefix:
            shutil.chown(self.dir, "postgres")
        subprocess.run([*self.prefix, initdb, "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proc = subprocess.Popen(
            [*self.prefix, postgres, "-D", self.data, "-p", str(self.port), "-h", "127.0.0.1", "-k", self.dir,
             "-c", "fsync=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.time() + 30
        while True:
            try:
                import psycopg2

                psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres").close()
                break
            except Exception:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("PostgreSQL did not start") from None
                time.sleep(0.2)

    def create_database(self, name: str) -> None:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()

    def query(self, db: str, sql: str) -> list[tuple]:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=db)
        with conn.cursor() as cur:
            cur.execute(sql)
            rows = cur.fetchall()
        conn.close()
        return rows

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # smart shutdown of the postmaster
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
