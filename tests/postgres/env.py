"""A PostgreSQL server for the CDC tests: Debian's own build (`apt-get install postgresql`, found in
/usr/lib/postgresql/<newest>/bin, or the folder $PIPE_POSTGRES_BIN names), a fresh cluster made by
initdb and started on a free port of 127.0.0.1, with logical decoding on (wal_level=logical) for
Debezium (tests/kafka/connect.py).

One per test session and worker (the `postgres` fixture of tests/conftest.py). By hand:

    python -m tests.postgres.env       # starts one, prints how to connect (psql and a DSN)

The cluster is a test's, not a server's: fsync off, no unix socket, one superuser with a random
password (scram-sha-256 for every connection, replication included). initdb and postgres refuse to
run as root: under root (CI) they run as Debian's `postgres` user, and the cluster then lives in a
folder of /tmp that user can reach (pytest's temporary folders are 0700 root), linked from the
workdir as `data`."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.kafka.env import _free_port

BIN_ROOT = Path("/usr/lib/postgresql")
SUPERUSER = "pipe"
# what logical decoding and a test cluster need, as -c options of `postgres` (postgresql.conf stays initdb's)
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",  # TCP only: no socket file in a folder of the system's
    "wal_level": "logical",
    "max_replication_slots": "20",  # a slot per Debezium connector, several per session
    "max_wal_senders": "20",
    "fsync": "off",  # a test's cluster: nothing to keep across a crash of the machine
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
}


class SetupError(RuntimeError):
    pass


def bin_dir() -> Path:
    """The folder of initdb and postgres: $PIPE_POSTGRES_BIN, else the newest Debian install."""
    if os.environ.get("PIPE_POSTGRES_BIN"):
        where = Path(os.environ["PIPE_POSTGRES_BIN"])
        if not (where / "postgres").is_file():
            raise SetupError(f"PIPE_POSTGRES_BIN={where} has no `postgres` in it")
        return where
    versions = sorted((p for p in BIN_ROOT.glob("*/bin/postgres") if p.parent.parent.name.isdigit()),
                      key=lambda p: int(p.parent.parent.name))
    if not versions:
        raise SetupError(f"the CDC tests need PostgreSQL's server (no {BIN_ROOT}/<version>/bin/postgres): "
                         "`apt-get install postgresql` (Debian/Ubuntu), or set PIPE_POSTGRES_BIN")
    return versions[-1].parent


def version() -> str:
    return bin_dir().parent.name


class PostgresServer:
    """A running PostgreSQL cluster on 127.0.0.1:`port`; `user`/`password` are its superuser's.
    `execute`/`query` run SQL in a database (each call its own autocommitted connection, so several
    statements in one string, e.g. "BEGIN; ...; COMMIT", are one round trip); `stop()` ends it."""

    def __init__(self, workdir: Path, timeout_s: float = 60):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bin = bin_dir()
        self.user, self.password = SUPERUSER, secrets.token_urlsafe(18)
        self.host = "127.0.0.1"
        self._as_postgres = os.geteuid() == 0
        self._outside: Path | None = None  # the folder made under /tmp when running as root
        if self._as_postgres:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise SetupError("running as root, the CDC tests start PostgreSQL as the `postgres` user, "
                                 "which does not exist: `apt-get install postgresql` makes it") from None
            self._uid, self._gid = owner.pw_uid, owner.pw_gid
            self._outside = Path(tempfile.mkdtemp(prefix="pipe-postgres-"))
            os.chmod(self._outside, 0o755)  # mkdtemp makes 0700
            home = self._outside
            self.data = home / "data"
            link = self.workdir / "data"
            if not link.exists():
                link.symlink_to(self.data)
        else:
            home = self.workdir
            self.data = self.workdir / "data"
        self.log = self.workdir / "postgres.log"
        pwfile = home / "pwfile"
        pwfile.write_text(self.password + "\n")
        os.chmod(pwfile, 0o600)
        if self._as_postgres:
            os.chown(pwfile, self._uid, self._gid)
            os.chown(home, self._uid, self._gid)
        try:
            done = subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, f"--pwfile={pwfile}",
                                   "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"],
                                  capture_output=True, text=True, **self._run_as())
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise SetupError(f"initdb failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.start(timeout_s)

    def _run_as(self) -> dict:
        """subprocess arguments that run a child as `postgres` when we are root (it has no other groups)."""
        if not self._as_postgres:
            return {}
        return {"user": self._uid, "group": self._gid, "extra_groups": [], "cwd": self.data.parent,
                "env": {**os.environ, "HOME": str(self.data.parent)}}

    def start(self, timeout_s: float = 60) -> None:
        """Starts postgres: on a free port the first time, on the same port after `stop()` (so a
        connector's configuration stays right across a `restart()`)."""
        import psycopg

        first = self.port is None
        for attempt in range(3):  # the free port can be taken by someone else before postgres binds it
            if first:
                self.port = _free_port()
            args = [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port)]
            for key, value in SETTINGS.items():
                args += ["-c", f"{key}={value}"]
            logged = self.log.stat().st_size if self.log.exists() else 0
            with open(self.log, "a") as log:
                self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **self._run_as())
            deadline = time.monotonic() + timeout_s
            while self.proc.poll() is None:
                try:
                    psycopg.connect(self.dsn(), connect_timeout=2).close()
                    return
                except psycopg.OperationalError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise SetupError(f"PostgreSQL did not answer on {self.host}:{self.port} within {timeout_s:.0f} s:\n"
                                         f"{self._log_tail()}") from None
                    time.sleep(0.1)
            said = self.log.read_text(errors="replace")[logged:]
            if "could not bind" not in said or not first or attempt == 2:
                raise SetupError(f"PostgreSQL did not start (exit {self.proc.returncode}):\n{said[-3000:]}")

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self, timeout_s: float = 30) -> None:
        """Fast shutdown (SIGINT: open sessions and walsenders are ended, not waited for), then kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the postmaster and its children
                self.proc.wait()

    def restart(self) -> None:
        """A fast shutdown and a start on the same port and data (Debezium reconnects on its own)."""
        self.stop()
        self.start()

    def remove(self) -> None:
        """stop(), and delete the cluster when it lives outside the workdir (root: under /tmp)."""
        self.stop()
        if self._outside is not None:
            shutil.rmtree(self._outside, ignore_errors=True)

    # --- how to reach it --------------------------------------------------------------------------

    def params(self, database: str = "postgres") -> dict[str, str | int]:
        """Connection parameters, as Debezium and libpq name them."""
        return {"host": self.host, "port": self.port, "user": self.user, "password": self.password, "dbname": database}

    def dsn(self, database: str = "postgres") -> str:
        """A libpq connection string (psycopg.connect, psql)."""
        return " ".join(f"{k}={v}" for k, v in self.params(database).items())

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{database}"

    def connect(self, database: str = "postgres", autocommit: bool = True):
        """A psycopg connection (the caller closes it; `with server.connect() as conn:`)."""
        import psycopg

        return psycopg.connect(self.dsn(database), autocommit=autocommit)

    def execute(self, sql: str, params=None, database: str = "postgres") -> None:
        """Runs `sql` (several statements when `params` is None) in `database`, autocommitted: one
        transaction per statement unless the string holds BEGIN ... COMMIT."""
        with self.connect(database) as conn:
            conn.execute(sql, params)

    def query(self, sql: str, params=None, database: str = "postgres") -> list[tuple]:
        with self.connect(database) as conn:
            return conn.execute(sql, params).fetchall()

    def create_database(self, name: str) -> str:
        """CREATE DATABASE name (owned by the superuser); returns the name."""
        from psycopg import sql

        with self.connect() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        """DROP DATABASE, ending its sessions (a Debezium connector's slot must be dropped first)."""
        from psycopg import sql

        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def main() -> int:
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="pipe-postgres-")))
    print(f"PostgreSQL {version()} ({server.bin}) on {server.host}:{server.port}, data in {server.data}\n"
          f"  psql '{server.dsn()}'\n  {server.url()}\n"
          f"superuser {server.user}, password {server.password}; wal_level=logical. Ctrl-C stops it", flush=True)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        server.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
