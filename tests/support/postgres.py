"""A throwaway PostgreSQL server for tests: a cluster in a temp dir on a free loopback port, owned by an unprivileged
user, removed afterwards. Without the server binaries the tests that need it skip (they must run where CI=true).

Use the fixtures in a test module with `pytest_plugins = ["support.postgres"]`. Whatever needs the server is marked
`postgres` (`-m "not postgres"` leaves it out): store_url's and STORES' "postgresql" parameter carries the mark, and a
module that only runs on PostgreSQL sets `pytestmark = pytest.mark.postgres`.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.live_server import free_port

INSTALL = "install the PostgreSQL server to run them: apt-get install postgresql (Debian/Ubuntu)"
STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
"""Parameters of a fixture that opens a store on each backend (request.param is "sqlite" or "postgresql")."""


def find_bin() -> Path | None:
    """The newest Debian-style /usr/lib/postgresql/N/bin, else the folder of `initdb` on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    initdb = found[-1] if found else shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def run_as() -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the `postgres` user (else `nobody`)."""
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
            return ["runuser", "-u", user, "--"]
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a postgres nor a nobody user exists")


@dataclass
class Cluster:
    bin: Path
    root: Path
    port: int
    prefix: list[str]

    @property
    def data(self) -> Path:
        return self.root / "data"

    def pg_ctl_command(self, *args: str) -> list[str]:
        return [*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.data), *args]

    def pg_ctl(self, *args: str) -> None:
        subprocess.run(self.pg_ctl_command(*args), check=True, capture_output=True, timeout=60)

    def start_command(self) -> list[str]:
        """pg_ctl start (again, after a stop) on the cluster's port, loopback only."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        return self.pg_ctl_command("-o", options, "-l", str(self.root / "log"), "-w", "start")

    def start(self) -> None:
        subprocess.run(self.start_command(), check=True, capture_output=True, timeout=60)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database; returns its SQLAlchemy URL."""
        import psycopg
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def start_cluster(bin_dir: Path) -> Cluster:
    root = Path(tempfile.mkdtemp(prefix="specscope-pg-"))
    prefix = run_as()
    if prefix:
        shutil.chown(root, user=prefix[2])
    cluster = Cluster(bin_dir, root, free_port(), prefix)
    subprocess.run([*prefix, str(bin_dir / "initdb"), "-D", str(cluster.data), "-U", "postgres", "--auth=trust",
                    "-E", "UTF8", "--no-sync"], check=True, capture_output=True, timeout=120)
    cluster.start()
    return cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One PostgreSQL server for the session, stopped and deleted at its end."""
    with own_cluster() as cluster:
        yield cluster


@contextmanager
def own_cluster() -> Iterator[Cluster]:
    """A PostgreSQL server of the caller's own (one a test may stop and start), stopped and deleted at the end;
    without the server binaries the test skips (fails where CI=true)."""
    bin_dir = find_bin()
    if bin_dir is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL tests must run in CI; {INSTALL}")
        pytest.skip(f"no PostgreSQL server binaries; {INSTALL}")
    cluster = start_cluster(bin_dir)
    try:
        yield cluster
    finally:
        cluster.pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store database: a SQLite file, then a fresh database on the test PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'specscope.db'}"
    return request.getfixturevalue("pg_cluster").new_database()
