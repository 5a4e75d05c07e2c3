"""A private PgBouncer in transaction pooling mode in front of the test Postgres, on a spare port.

Its own configuration, auth file, log and pid file live in a temporary directory; it is started in the
foreground as a child process and killed at the end. Every database of the Postgres behind it is reachable
through it (``* = host=... port=...``), so each test's own database works through the same instance; each
(database, user) pair gets at most :data:`SERVER_CONNECTIONS` server connections, however many clients
connect.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from worker.testing.workers import free_port

#: server connections per database and user: fewer than the workers the tests start
SERVER_CONNECTIONS = 3
START_TIMEOUT = 30.0


def find_pgbouncer() -> str | None:
    """The pgbouncer executable, or None where it is not installed (Debian puts it in /usr/sbin)."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


class PgBouncer:
    """One pgbouncer process in front of the Postgres of ``postgres_dsn``."""

    def __init__(self, executable: str, postgres_dsn: str) -> None:
        self.executable = executable
        backend = urlsplit(postgres_dsn)
        self.backend_host = backend.hostname or "127.0.0.1"
        self.backend_port = backend.port or 5432
        self.user = backend.username or "postgres"
        self.password = backend.password or ""
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ltm-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        # pgbouncer logs in to Postgres with the password of this file (none for a trusting Postgres)
        (self.dir / "users.txt").write_text(f'"{self.user}" "{self.password}"\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.backend_host} port={self.backend_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            # the test Postgres trusts local connections; the auth file only names the users
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {SERVER_CONNECTIONS}\n"
            f"max_db_connections = {SERVER_CONNECTIONS}\n"
            "reserve_pool_size = 0\n"
            "max_client_conn = 500\n"
            # SHOW POOLS on the admin console (database "pgbouncer") for the tests' figures
            f"admin_users = {self.user}\n"
            # a client waits this long for a server connection before it gets an error
            "query_wait_timeout = 60\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        command = [self.executable]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root: give it an unprivileged user
            account = _unprivileged_account()
            os.chown(self.dir, account.pw_uid, account.pw_gid)
            for entry in self.dir.iterdir():
                os.chown(entry, account.pw_uid, account.pw_gid)
            command += ["-u", account.pw_name]
        command.append(str(self.dir / "pgbouncer.ini"))
        self.proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start on {self.port}:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def through(self, postgres_dsn: str) -> str:
        """``postgres_dsn`` rewritten to go through this pgbouncer (same user and database)."""
        parts = urlsplit(postgres_dsn)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def show(self, what: str) -> list[dict[str, str]]:
        """``SHOW <what>`` on the admin console (through psql: the console speaks only the simple query
        protocol), one dict per row."""
        psql = shutil.which("psql")
        if psql is None:
            raise RuntimeError("psql is not installed (it comes with the Postgres client package)")
        done = subprocess.run(
            [
                psql,
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.user,
                "-d",
                "pgbouncer",
                "-A",
                "-F",
                "|",
                "-c",
                f"SHOW {what}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={**os.environ, "PGPASSWORD": self.password},
        )
        header, *rows = [line for line in done.stdout.splitlines() if "|" in line]
        names = header.split("|")
        return [dict(zip(names, row.split("|"), strict=False)) for row in rows]

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _unprivileged_account() -> pwd.struct_passwd:
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("no unprivileged account (postgres, nobody) to run pgbouncer as")
