"""Private TLS-only Postgres, RabbitMQ and Redis servers on spare ports, with a throwaway CA.

:class:`Authority` makes a CA (openssl CLI, EC P-256 keys: quick to make) and signs server certificates
for ``localhost`` and ``127.0.0.1``; a second, unrelated authority stands in for "the wrong CA". Each server
keeps its data, configuration and log under one temporary directory and accepts nothing but TLS:

- :class:`TlsPostgres`: ``initdb`` in the directory, ``ssl = on``, a ``pg_hba.conf`` of ``hostssl`` lines
  only (a plaintext connection finds no entry), no Unix socket; run as the ``postgres`` account when this
  process is root (Postgres refuses root).
- :class:`TlsRabbit`: one private RabbitMQ node (its own name, cookie and ports, as tests/e2e/cluster.py)
  with ``listeners.tcp = none`` and one ``listeners.ssl`` listener.
- :class:`TlsRedis`: ``redis-server --port 0 --tls-port N``, no persistence.

``close`` stops each server (killing it if it does not stop) and removes its directory; the fixtures call it
even when a test or a start fails.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from glob import glob
from pathlib import Path
from urllib.parse import quote

from tests.e2e.cluster import RabbitCluster, find_server
from worker.testing.workers import free_port

START_TIMEOUT = 60.0


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")


_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Pair:
    """A certificate and its key (PEM files)."""

    cert: Path
    key: Path


class Authority:
    """A throwaway certificate authority in ``directory`` (its certificate is :attr:`ca`)."""

    def __init__(self, directory: Path, name: str) -> None:
        self.dir = directory
        self.name = name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = self.dir / f"{name}-ca.pem"
        self._key = self.dir / f"{name}-ca.key"
        _openssl(
            "req", "-x509", *_EC_KEY, "-keyout", str(self._key), "-out", str(self.ca), "-days", "2",
            "-subj", f"/CN=LTM test CA {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=self.dir,
        )  # fmt: skip

    def issue(self, name: str, *, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Pair:
        """A certificate for ``hosts`` (server and client use) signed by this authority."""
        key, csr, cert = (self.dir / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        sans = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
        extensions = self.dir / f"{name}.ext"
        extensions.write_text(
            f"subjectAltName={sans}\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\n"
        )
        _openssl("req", "-new", *_EC_KEY, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={hosts[0]}",
                 cwd=self.dir)  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self._key),
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions),
            cwd=self.dir,
        )  # fmt: skip
        return Pair(cert, key)


def _wait_for_port(port: int, alive: object, what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if not callable(alive) or not alive() or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not start on {port}:\n{tail}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


# -- Postgres ------------------------------------------------------------------------------------------------


def find_postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` holding ``initdb`` and ``postgres``, else one on PATH."""
    found = sorted(
        (Path(p) for p in glob("/usr/lib/postgresql/*/bin") if (Path(p) / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1]
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("postgres") else None


class TlsPostgres:
    """A private Postgres that accepts only TLS connections (``hostssl``, trust) on a spare port."""

    def __init__(self, bin_dir: Path, server: Pair, client_ca: Path | None = None) -> None:
        self.bin_dir = bin_dir
        #: with a CA here, a client must present a certificate it signed (``clientcert=verify-ca``)
        self.client_ca = client_ca
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ltm-tls-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # Postgres wants its key readable by its own account only
        self.cert, self.key = self.dir / "server.pem", self.dir / "server.key"
        shutil.copy(server.cert, self.cert)
        shutil.copy(server.key, self.key)
        self.key.chmod(0o600)
        self.ca = self.dir / "client-ca.pem"
        if client_ca is not None:
            shutil.copy(client_ca, self.ca)
        self.account = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self.account is not None:
            for path in (self.dir, self.cert, self.key, *([self.ca] if client_ca else [])):
                os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def _run_as(self) -> dict[str, int]:
        if self.account is None:
            return {}
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def start(self) -> TlsPostgres:
        subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
             "--no-sync", "-E", "UTF8", "--locale", "C"],
            capture_output=True, timeout=120, check=True, **self._run_as(),  # type: ignore[call-overload]
        )  # fmt: skip
        client = " clientcert=verify-ca" if self.client_ca is not None else ""
        (self.data / "pg_hba.conf").write_text(
            "# TLS only: a plaintext connection finds no entry\n"
            f"hostssl all all 127.0.0.1/32 trust{client}\n"
            f"hostssl all all ::1/128 trust{client}\n"
        )
        settings = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": "",
            "ssl": "on",
            "ssl_cert_file": str(self.cert),
            "ssl_key_file": str(self.key),
            **({"ssl_ca_file": str(self.ca)} if self.client_ca is not None else {}),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "16MB",
            "max_connections": "60",
        }
        args = [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(  # type: ignore[call-overload]
                [str(self.bin_dir / "postgres"), "-D", str(self.data), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._run_as(),
            )
        _wait_for_port(self.port, lambda: self.proc is not None and self.proc.poll() is None, "postgres",
                       self.log)  # fmt: skip
        # listening is not accepting: wait for the start-up to finish
        deadline = time.monotonic() + START_TIMEOUT
        while "ready to accept connections" not in self.log.read_text(errors="replace"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"postgres did not get ready:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        return self

    def replace_certificate(self, pair: Pair) -> None:
        """Give the server another certificate: the files rewritten in place (owner and mode kept), then
        SIGHUP, on which Postgres re-reads them for new connections."""
        self.cert.write_bytes(pair.cert.read_bytes())
        self.key.write_bytes(pair.key.read_bytes())
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def dsn(
        self,
        database: str = "postgres",
        *,
        ca: Path | None = None,
        client: Pair | None = None,
        sslmode: str = "verify-full",
    ) -> str:
        query = f"sslmode={sslmode}"
        if ca is not None:
            query += f"&sslrootcert={quote(str(ca))}"
        if client is not None:
            query += f"&sslcert={quote(str(client.cert))}&sslkey={quote(str(client.key))}"
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?{query}"

    def close(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- RabbitMQ ------------------------------------------------------------------------------------------------


def find_rabbitmq_bin() -> Path | None:
    return find_server()


class TlsRabbit(RabbitCluster):
    """One private RabbitMQ node whose only AMQP listener is TLS (``Node.amqp_port`` is the TLS port)."""

    def __init__(self, bin_dir: Path, server: Pair, ca: Path, *, client_certificates: bool = False) -> None:
        # no management plugin: its default port (15672) is the machine broker's, and this node needs none
        super().__init__(bin_dir, size=1, management=False)
        #: a client must present a certificate ``ca`` signed (``verify_peer``, ``fail_if_no_peer_cert``)
        self.client_certificates = client_certificates
        self.node = self.nodes[0]
        self.port = self.node.amqp_port
        self.server = server
        self.ca = ca

    def _env(self, node: object) -> dict[str, str]:
        env = super()._env(node)  # type: ignore[arg-type]
        # RABBITMQ_NODE_PORT would add a plaintext listener beside the configured ones
        env.pop("RABBITMQ_NODE_PORT", None)
        return env

    def _launch(self, node: object) -> None:
        self.node.base.mkdir(exist_ok=True)
        (self.node.base / "rabbitmq.conf").write_text(
            "listeners.tcp = none\n"
            f"listeners.ssl.default = 127.0.0.1:{self.port}\n"
            f"ssl_options.cacertfile = {self.ca}\n"
            f"ssl_options.certfile = {self.server.cert}\n"
            f"ssl_options.keyfile = {self.server.key}\n"
            + (
                "ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n"
                if self.client_certificates
                else "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"
            )
            + "loopback_users.guest = false\n"
        )
        subprocess.run(
            [str(self.bin_dir / "rabbitmq-server"), "-detached"],
            env=self._env(self.node),
            capture_output=True,
            timeout=120,
            check=True,
        )

    def start(self) -> TlsRabbit:  # type: ignore[override]
        self._launch(self.node)
        self.await_startup(self.node)
        _wait_for_port(self.port, lambda: True, "rabbitmq TLS listener", self.node.base / "rabbitmq.conf")
        return self

    def url(
        self, vhost: str, *, ca: Path | None = None, client: Pair | None = None, host: str = "127.0.0.1"
    ) -> str:
        params = [f"cafile={quote(str(ca))}"] if ca is not None else []
        if client is not None:
            params += [f"certfile={quote(str(client.cert))}", f"keyfile={quote(str(client.key))}"]
        query = "?" + "&".join(params) if params else ""
        return f"amqps://guest:guest@{host}:{self.port}/{quote(vhost, safe='')}{query}"


# -- Redis ---------------------------------------------------------------------------------------------------


def find_redis_server() -> str | None:
    """``redis-server`` when it is built with TLS (Debian's redis 7 is), else None."""
    found = shutil.which("redis-server")
    if found is None:
        return None
    done = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, check=False)
    version = done.stdout.split("v=", 1)[-1].split(".", 1)[0]
    return found if version.isdigit() and int(version) >= 6 else None


class TlsRedis:
    """A private ``redis-server`` with a TLS port and no plaintext port."""

    def __init__(self, executable: str, server: Pair, ca: Path, *, client_certificates: bool = False) -> None:
        self.executable = executable
        #: a client must present a certificate ``ca`` signed (``--tls-auth-clients yes``)
        self.client_certificates = client_certificates
        self.server = server
        self.ca = ca
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ltm-tls-redis-"))
        self.log = self.dir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> TlsRedis:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.executable,
                    "--port", "0",
                    "--tls-port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--tls-cert-file", str(self.server.cert),
                    "--tls-key-file", str(self.server.key),
                    "--tls-ca-cert-file", str(self.ca),
                    "--tls-auth-clients", "yes" if self.client_certificates else "no",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(self.dir),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        _wait_for_port(self.port, lambda: self.proc is not None and self.proc.poll() is None, "redis",
                       self.log)  # fmt: skip
        return self

    def replace_certificate(self, pair: Pair, client: Pair | None = None) -> None:
        """Give the server another certificate (``CONFIG SET``, over a connection that trusts the current
        one, as ``client`` where the server wants a client certificate): new connections get it."""
        import redis

        admin = redis.Redis.from_url(self.url(ca=self.ca, client=client), socket_timeout=30)
        try:
            # both at once: a certificate without its key (or the reverse) is refused
            admin.execute_command(
                "CONFIG", "SET", "tls-cert-file", str(pair.cert), "tls-key-file", str(pair.key)
            )
        finally:
            admin.close()

    def url(self, *, ca: Path | None = None, client: Pair | None = None, host: str = "127.0.0.1") -> str:
        params = [f"ssl_ca_certs={quote(str(ca))}"] if ca is not None else []
        if client is not None:
            params += [f"ssl_certfile={quote(str(client.cert))}", f"ssl_keyfile={quote(str(client.key))}"]
        query = "?" + "&".join(params) if params else ""
        return f"rediss://{host}:{self.port}/0{query}"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
        _stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
