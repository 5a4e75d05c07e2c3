// Test harness: real services, one RabbitMQ vhost and one Postgres database per test, `worker run` as a child
// process. Services come from LTM_TEST_POSTGRES_DSN / LTM_TEST_RABBITMQ_URL / LTM_TEST_REDIS_URL, else the
// local defaults (the same variables the Python suite reads). Vhosts, users and permissions go through RabbitMQ's
// management API (LTM_TEST_RABBITMQ_MANAGEMENT_URL, else port 15672 of the broker's host): HTTP calls of
// milliseconds; `rabbitmqctl` (an Erlang VM's start, about 1.2 s a call) only where no API answers. Databases
// are copies of one template migrated once per `npm test` (LTM_TS_TEMPLATE_DB, made by test/run.ts), else of a
// template this process migrates the first time a stack asks. Waits, the management API and worker processes are
// the testing entry's own (src/testing/wait.ts, management.ts, process.ts): what a shard team's stack runs on is
// what these tests run on.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, mkdirSync, rmSync, writeFileSync, chmodSync, copyFileSync } from "node:fs";
import { connect as tcpConnect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import pg from "pg";

import { ManagementClient } from "../src/testing/management.js";
import { WorkerProcess } from "../src/testing/process.js";
import { Deadline, StopWaiting, sleep, until } from "../src/testing/wait.js";

export { WorkerProcess };

const run = promisify(execFile);

/** The package root (build/test/harness.js -> ../..). */
export const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const REPO_ROOT = resolve(PACKAGE_ROOT, "../..");

export const POSTGRES_DSN = process.env.LTM_TEST_POSTGRES_DSN ?? "postgresql://postgres@127.0.0.1:5432/postgres";
export const RABBITMQ_URL = process.env.LTM_TEST_RABBITMQ_URL ?? "amqp://guest:guest@127.0.0.1:5672/";
export const REDIS_URL = process.env.LTM_TEST_REDIS_URL ?? "redis://127.0.0.1:6379/0";

// Discord ids of the seeded world (those of tests/factories.py)
export const GUILD = "1150000000000000001";
export const CHANNEL = "1150000000000000100";
export const TRIGGER = "1150000000000000200";
export const SPARROW = "1150000000000000201";
export const BOT = "1150000000000000999";

/** `worker`: LTM_WORKER_BIN, else the repository's .venv, else the one on PATH. */
export function workerBin(): string {
  if (process.env.LTM_WORKER_BIN) return process.env.LTM_WORKER_BIN;
  const venv = join(REPO_ROOT, ".venv/bin/worker");
  return existsSync(venv) ? venv : "worker";
}

export function hex(): string {
  return randomBytes(4).toString("hex");
}

/**
 * Poll until `check` returns a value other than undefined/false, and return it: the kit's `until` on a deadline of
 * `timeoutMs`; an error `check` throws ends the wait at once (a test's check does not fail "not yet").
 */
export async function waitFor<T>(what: string, check: () => T | undefined | false | Promise<T | undefined | false>, timeoutMs = 30_000): Promise<T> {
  const checked = async (): Promise<T | undefined | false> => {
    try {
      return await check();
    } catch (error) {
      throw new StopWaiting(`${what}: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
    }
  };
  return until(what, new Deadline(timeoutMs), checked, 50);
}

export { sleep };

/** rabbitmqctl, against the machine's node or `node`. */
export async function rabbitmqctl(args: string[], node?: string): Promise<string> {
  const full = node === undefined ? args : ["-n", node, ...args];
  try {
    const { stdout } = await run("rabbitmqctl", full, { timeout: 60_000 });
    return stdout;
  } catch (error) {
    const e = error as { stderr?: string; message: string };
    throw new Error(`rabbitmqctl ${full.join(" ")} failed: ${e.stderr ?? e.message}`);
  }
}

/** What the tests administer on the machine's broker: vhosts, users, permissions, tracing. */
export interface BrokerAdmin {
  addVhost(vhost: string, user: string): Promise<void>;
  deleteVhost(vhost: string): Promise<void>;
  addUser(user: string, password: string): Promise<void>;
  deleteUser(user: string): Promise<void>;
  setPermissions(vhost: string, user: string, configure: string, write: string, read: string): Promise<void>;
  setTopicPermissions(vhost: string, user: string, exchange: string, write: string, read: string): Promise<void>;
  tracing(vhost: string, on: boolean): Promise<void>;
}

export const MANAGEMENT_URL =
  process.env.LTM_TEST_RABBITMQ_MANAGEMENT_URL ?? `http://${new URL(RABBITMQ_URL).hostname}:15672`;

/** The kit's management client (src/testing/management.ts) as the URL's user, with a test's vhost and tracing. */
class ManagementApi extends ManagementClient implements BrokerAdmin {
  async addVhost(vhost: string, user: string): Promise<void> {
    await this.putVhost(vhost);
    await this.setPermissions(vhost, user, ".*", ".*", ".*");
  }

  async tracing(vhost: string, on: boolean): Promise<void> {
    await this.putVhost(vhost, { tracing: on });
  }
}

/** The same through `rabbitmqctl`, for a broker on this machine without the management plugin. */
class Rabbitmqctl implements BrokerAdmin {
  async addVhost(vhost: string, user: string): Promise<void> {
    await rabbitmqctl(["add_vhost", vhost]);
    await this.setPermissions(vhost, user, ".*", ".*", ".*");
  }

  async deleteVhost(vhost: string): Promise<void> {
    try {
      await rabbitmqctl(["delete_vhost", vhost]);
    } catch (error) {
      if (!/no_such_vhost|does not exist/.test(String(error))) throw error;
    }
  }

  async addUser(user: string, password: string): Promise<void> {
    await rabbitmqctl(["add_user", user, password]);
  }

  async deleteUser(user: string): Promise<void> {
    await rabbitmqctl(["delete_user", user]);
  }

  async setPermissions(vhost: string, user: string, configure: string, write: string, read: string): Promise<void> {
    await rabbitmqctl(["set_permissions", "-p", vhost, user, configure, write, read]);
  }

  async setTopicPermissions(vhost: string, user: string, exchange: string, write: string, read: string): Promise<void> {
    await rabbitmqctl(["set_topic_permissions", "-p", vhost, user, exchange, write, read]);
  }

  async tracing(vhost: string, on: boolean): Promise<void> {
    await rabbitmqctl([on ? "trace_on" : "trace_off", "-p", vhost]);
  }
}

let brokerAdmin: Promise<BrokerAdmin> | undefined;

/** How this process administers the machine's broker: the management API when it answers, else rabbitmqctl. */
export function broker(): Promise<BrokerAdmin> {
  brokerAdmin ??= (async () => {
    const url = new URL(RABBITMQ_URL);
    const api = new ManagementApi(
      MANAGEMENT_URL,
      decodeURIComponent(url.username || "guest"),
      decodeURIComponent(url.password || "guest"),
      30_000,
    );
    return (await api.answers()) ? api : new Rabbitmqctl();
  })();
  return brokerAdmin;
}

/** The user the tests' own connections log in as (the URL's). */
export function brokerUser(): string {
  return decodeURIComponent(new URL(RABBITMQ_URL).username || "guest");
}

function withVhost(url: string, vhost: string): string {
  const u = new URL(url);
  u.pathname = `/${encodeURIComponent(vhost)}`;
  return u.toString();
}

function withDatabase(dsn: string, database: string): string {
  const u = new URL(dsn);
  u.pathname = `/${database}`;
  return u.toString();
}

/** A free TCP port on loopback (for private servers). */
export async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => done(port));
    });
  });
}

/** A vhost of its own on the machine's broker (guest may do anything in it); `delete()` removes it. */
export async function createVhost(): Promise<{ url: string; delete: () => Promise<void> }> {
  const vhost = `ltm-ts-${hex()}`;
  const admin = await broker();
  await admin.addVhost(vhost, brokerUser());
  return {
    url: withVhost(RABBITMQ_URL, vhost),
    delete: async () => {
      // a vhost whose deletion failed would be left on the machine's broker unnoticed: try again, then say so
      for (let attempt = 1; ; attempt += 1) {
        try {
          await admin.deleteVhost(vhost); // one already gone is no error
          return;
        } catch (error) {
          if (attempt >= 3) {
            console.error(`could not delete vhost ${vhost} (left behind: rabbitmqctl delete_vhost ${vhost}):`, error);
            return;
          }
          await sleep(1000 * attempt);
        }
      }
    },
  };
}

/** `CREATE DATABASE name`, empty or a copy of `template`, on the tests' Postgres. */
export async function createDatabase(name: string, template?: string): Promise<void> {
  const admin = new pg.Client({ connectionString: POSTGRES_DSN });
  await admin.connect();
  try {
    await admin.query(template === undefined ? `CREATE DATABASE ${name}` : `CREATE DATABASE ${name} TEMPLATE ${template}`);
  } finally {
    await admin.end();
  }
}

/** `DROP DATABASE name WITH (FORCE)`, if it exists. */
export async function dropDatabase(name: string): Promise<void> {
  const admin = new pg.Client({ connectionString: POSTGRES_DSN });
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  } finally {
    await admin.end();
  }
}

/** A database migrated by `worker migrate` that nobody may connect to any more (a connection would make every
 * `CREATE DATABASE ... TEMPLATE` of it fail): the template of one test run's stacks. */
export async function createTemplateDatabase(): Promise<string> {
  const name = `ltm_ts_tpl_${hex()}`;
  await createDatabase(name);
  try {
    const env = { PATH: process.env.PATH, HOME: process.env.HOME, LTM_POSTGRES_DSN: withDatabase(POSTGRES_DSN, name) };
    await run(workerBin(), ["migrate"], { env, timeout: 120_000 });
    const admin = new pg.Client({ connectionString: POSTGRES_DSN });
    await admin.connect();
    try {
      await admin.query(`ALTER DATABASE ${name} WITH ALLOW_CONNECTIONS false`);
    } finally {
      await admin.end();
    }
  } catch (error) {
    await dropDatabase(name).catch(() => {});
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(`the template database could not be migrated: ${e.message}\n${e.stdout ?? ""}${e.stderr ?? ""}`);
  }
  return name;
}

export interface StackOptions {
  /** a RabbitMQ URL of another broker (a private node); its vhost is used as it is */
  rabbitmqUrl?: string;
  /** run on the private node's default vhost instead of creating one on the machine's broker */
  ownVhost?: boolean;
}

/** A database and a vhost of its own, the bot rows a save needs, and worker processes. */
export class Stack {
  readonly workers: WorkerProcess[] = [];
  personaId = 0;

  private constructor(
    readonly name: string,
    readonly dir: string,
    readonly amqpUrl: string,
    readonly vhost: string | null,
    readonly database: string,
    readonly dsn: string,
    readonly db: pg.Client,
  ) {}

  static async create(options: StackOptions = {}): Promise<Stack> {
    const name = `ltm_ts_${hex()}`;
    const dir = mkdtempSync(join(tmpdir(), "ltm-ts-"));
    let vhost: string | null = null;
    let amqpUrl = options.rabbitmqUrl ?? RABBITMQ_URL;
    if (options.rabbitmqUrl === undefined) {
      vhost = name.replaceAll("_", "-");
      await (await broker()).addVhost(vhost, brokerUser());
      amqpUrl = withVhost(RABBITMQ_URL, vhost);
    }
    // a copy of the run's migrated template (test/run.ts) when there is one: milliseconds, not a `worker migrate`
    const template = process.env.LTM_TS_TEMPLATE_DB;
    await createDatabase(name, template);
    const dsn = withDatabase(POSTGRES_DSN, name);
    const db = new pg.Client({ connectionString: dsn });
    await db.connect();
    const stack = new Stack(name, dir, amqpUrl, vhost, name, dsn, db);
    if (template === undefined) await stack.runWorker(["migrate"]);
    await stack.seed();
    return stack;
  }

  /** The rows the original bot would have: a server, its persona, the triggering user and Sparrow. */
  private async seed(): Promise<void> {
    const server = await this.db.query<{ server_id: number }>(
      "INSERT INTO servers (server_disc_id) VALUES ($1) RETURNING server_id",
      [GUILD],
    );
    const serverId = server.rows[0]?.server_id;
    const persona = await this.db.query<{ persona_id: number }>(
      "INSERT INTO personas (server_id, persona_nickname) VALUES ($1, 'Tomori') RETURNING persona_id",
      [serverId],
    );
    this.personaId = persona.rows[0]?.persona_id ?? 0;
    await this.db.query("INSERT INTO users (user_disc_id) VALUES ($1), ($2)", [TRIGGER, SPARROW]);
  }

  /** The environment a worker command of this stack runs with; short retries for speed. */
  env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
    return {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      LTM_POSTGRES_DSN: this.dsn,
      LTM_RABBITMQ_URL: this.amqpUrl,
      LTM_REDIS_URL: REDIS_URL,
      LTM_RETRY_BASE_DELAY_MS: "50",
      LTM_RETRY_MAX_DELAY_MS: "400",
      LTM_SHUTDOWN_GRACE_SECONDS: "5",
      LTM_LOG_FORMAT: "json",
      ...extra,
    };
  }

  /** Start `worker run` and wait until it consumes. */
  async worker(extra: Record<string, string> = {}): Promise<WorkerProcess> {
    const process = new WorkerProcess(workerBin(), this.env(extra), join(this.dir, `worker-${this.workers.length}.log`));
    this.workers.push(process);
    process.start();
    await process.waitForLog("consuming");
    return process;
  }

  /** Run a one-shot worker command (`migrate`, `dlq replay`, ...) and return its output. */
  async runWorker(args: string[], extra: Record<string, string> = {}): Promise<string> {
    try {
      const { stdout, stderr } = await run(workerBin(), args, { env: this.env(extra), timeout: 60_000 });
      return stdout + stderr;
    } catch (error) {
      const e = error as { stdout?: string; stderr?: string; message: string };
      throw new Error(`worker ${args.join(" ")} failed: ${e.message}\n${e.stdout ?? ""}${e.stderr ?? ""}`);
    }
  }

  async dispose(): Promise<void> {
    for (const worker of this.workers) worker.kill();
    await this.db.end().catch(() => {});
    await dropDatabase(this.database);
    if (this.vhost !== null) await (await broker()).deleteVhost(this.vhost).catch(() => {});
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** TLS settings of a private server: its certificate and key, the CA of client certificates (PEM files). */
export interface ServerTls {
  ca: string;
  cert: string;
  key: string;
  /** the server refuses a client without a certificate `ca` signed */
  clientCertificates?: boolean;
}

/**
 * A RabbitMQ node of its own (ports, data dir), for the broker-restart, blocked and TLS tests; the machine's is
 * untouched. With `tls` its only AMQP listener is TLS (`listeners.tcp = none`), and `url` is `amqps://`.
 */
export class PrivateRabbit {
  private constructor(
    readonly node: string,
    readonly port: number,
    readonly dir: string,
    readonly tls: boolean,
  ) {}

  get url(): string {
    return `${this.tls ? "amqps" : "amqp"}://guest:guest@127.0.0.1:${this.port}/`;
  }

  static async start(options: { tls?: ServerTls } = {}): Promise<PrivateRabbit> {
    const id = hex();
    const node = `ltmts${id}@localhost`;
    const port = await freePort();
    const distPort = await freePort();
    const dir = mkdtempSync(join(tmpdir(), "ltm-ts-rabbit-"));
    writeFileSync(join(dir, "enabled_plugins"), "[].\n");
    let config = `listeners.tcp.local = 127.0.0.1:${port}\n`;
    const tls = options.tls;
    if (tls !== undefined) {
      // copies inside the node's directory, which the rabbitmq user (who runs the node) can read
      for (const [name, from] of [["ca.pem", tls.ca], ["server.pem", tls.cert], ["server.key", tls.key]] as const) {
        copyFileSync(from, join(dir, name));
      }
      config =
        "listeners.tcp = none\n" +
        `listeners.ssl.default = 127.0.0.1:${port}\n` +
        `ssl_options.cacertfile = ${join(dir, "ca.pem")}\n` +
        `ssl_options.certfile = ${join(dir, "server.pem")}\n` +
        `ssl_options.keyfile = ${join(dir, "server.key")}\n` +
        (tls.clientCertificates
          ? "ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n"
          : "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n");
    }
    writeFileSync(join(dir, "rabbitmq.conf"), config);
    writeFileSync(join(dir, "rabbitmq-env.conf"), "");
    // the packaged rabbitmq-server runs the node as the rabbitmq user, which must write here
    chmodSync(dir, 0o777);
    await run("chown", ["-R", "rabbitmq:rabbitmq", dir]).catch(() => {});
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      RABBITMQ_NODENAME: node,
      RABBITMQ_NODE_PORT: String(port),
      RABBITMQ_DIST_PORT: String(distPort),
      RABBITMQ_MNESIA_BASE: join(dir, "mnesia"),
      RABBITMQ_LOG_BASE: join(dir, "log"),
      RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, "enabled_plugins"),
      RABBITMQ_CONFIG_FILE: join(dir, "rabbitmq.conf"),
      RABBITMQ_CONF_ENV_FILE: join(dir, "rabbitmq-env.conf"),
      RABBITMQ_PID_FILE: join(dir, "pid"),
      ERL_EPMD_ADDRESS: "127.0.0.1",
      ERL_FLAGS: "-kernel inet_dist_use_interface {127,0,0,1}",
    };
    // RABBITMQ_NODE_PORT would add a plaintext listener beside the TLS one
    if (tls !== undefined) delete env.RABBITMQ_NODE_PORT;
    const rabbit = new PrivateRabbit(node, port, dir, tls !== undefined);
    try {
      await run("rabbitmq-server", ["-detached"], { env, timeout: 60_000 });
      // the detached node registers with epmd a moment later; until then await_startup says "not running"
      await waitFor(`private RabbitMQ node ${node}`, async () => {
        try {
          await rabbitmqctl(["await_startup", "--timeout", "60"], node);
          return true;
        } catch {
          return false;
        }
      }, 90_000);
      await waitForPort(port, `the private RabbitMQ node's listener on ${port}`);
    } catch (error) {
      await rabbit.stop();
      throw error;
    }
    return rabbit;
  }

  async stopApp(): Promise<void> {
    await rabbitmqctl(["stop_app"], this.node);
  }

  async startApp(): Promise<void> {
    await rabbitmqctl(["start_app"], this.node);
    await rabbitmqctl(["await_startup", "--timeout", "60"], this.node);
  }

  async stop(): Promise<void> {
    await rabbitmqctl(["stop"], this.node).catch(() => {});
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A redis-server of its own on a spare port, restartable (the machine's 6379 is never touched). With `tls` it has
 * a TLS port and no plaintext one (`--port 0 --tls-port N`), and `url` is `rediss://`.
 */
export class PrivateRedis {
  private child: ChildProcess | null = null;

  private constructor(
    readonly port: number,
    readonly tls: ServerTls | undefined,
  ) {}

  get url(): string {
    return `${this.tls === undefined ? "redis" : "rediss"}://127.0.0.1:${this.port}/0`;
  }

  static async start(options: { tls?: ServerTls } = {}): Promise<PrivateRedis> {
    const redis = new PrivateRedis(await freePort(), options.tls);
    try {
      await redis.launch();
    } catch (error) {
      await redis.stop();
      throw error;
    }
    return redis;
  }

  private async launch(): Promise<void> {
    const tls = this.tls;
    const listen =
      tls === undefined
        ? ["--port", String(this.port)]
        : [
            "--port", "0",
            "--tls-port", String(this.port),
            "--tls-cert-file", tls.cert,
            "--tls-key-file", tls.key,
            "--tls-ca-cert-file", tls.ca,
            "--tls-auth-clients", tls.clientCertificates ? "yes" : "no",
          ];
    const child = spawn("redis-server", [...listen, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], {
      stdio: "ignore",
    });
    this.child = child;
    if (tls !== undefined) {
      // redis-cli may be built without TLS: a listening port is enough (a client waits for its handshake)
      await waitForPort(this.port, `redis-server's TLS port ${this.port}`, 20_000, () => child.exitCode === null);
      return;
    }
    await waitFor(`redis-server on ${this.port}`, async () => {
      try {
        const { stdout } = await run("redis-cli", ["-p", String(this.port), "ping"]);
        return stdout.trim() === "PONG";
      } catch {
        return false;
      }
    }, 20_000);
  }

  /** Stop the server (SIGTERM) and wait until it has exited. */
  async stop(): Promise<void> {
    const child = this.child;
    this.child = null;
    if (child === null || child.exitCode !== null) return;
    const exited = new Promise<void>((done) => child.once("exit", () => done()));
    child.kill("SIGTERM");
    await exited;
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.launch();
  }
}

/** Wait until something accepts TCP connections on 127.0.0.1:`port` (while `alive()` holds). */
export async function waitForPort(port: number, what: string, timeoutMs = 60_000, alive: () => boolean = () => true): Promise<void> {
  await waitFor(what, async () => {
    if (!alive()) throw new Error(`${what}: the server exited`);
    return new Promise<boolean>((done) => {
      const socket = tcpConnect({ host: "127.0.0.1", port }, () => {
        socket.destroy();
        done(true);
      });
      socket.once("error", () => {
        socket.destroy();
        done(false);
      });
    });
  }, timeoutMs);
}

/** The executable `name` is on PATH (or in the sbin directories, where the packaged rabbitmq-server lives). */
export function onPath(name: string): boolean {
  const dirs = [...(process.env.PATH ?? "").split(":"), "/usr/sbin", "/sbin"];
  return dirs.some((dir) => dir !== "" && existsSync(join(dir, name)));
}

/**
 * A tool a test needs is not installed: the test is skipped with `message`, except with `CI` set (as the Python
 * suite), where it fails: a CI machine must have every server the tests start.
 */
export function skipUnlessCi(t: { skip: (message: string) => void }, message: string): void {
  if (process.env.CI) throw new Error(`${message} (CI=${process.env.CI}: a missing program is a failure here)`);
  t.skip(message);
}

/** A certificate and its key (PEM files). */
export interface CertificatePair {
  cert: string;
  key: string;
}

async function openssl(args: string[], cwd: string): Promise<void> {
  try {
    await run("openssl", args, { cwd, timeout: 60_000 });
  } catch (error) {
    const e = error as { stderr?: string; message: string };
    throw new Error(`openssl ${args.join(" ")} failed: ${e.stderr ?? e.message}`);
  }
}

const EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

/** A throwaway certificate authority in `dir` (EC P-256 keys, quick to make), made with the openssl CLI. */
export class Authority {
  private constructor(
    readonly dir: string,
    /** its certificate (PEM file) */
    readonly ca: string,
    private readonly caKey: string,
  ) {}

  static async create(dir: string, name: string): Promise<Authority> {
    mkdirSync(dir, { recursive: true });
    const ca = join(dir, `${name}-ca.pem`);
    const key = join(dir, `${name}-ca.key`);
    await openssl(
      ["req", "-x509", ...EC_KEY, "-keyout", key, "-out", ca, "-days", "2", "-subj", `/CN=LTM kit test CA ${name}`,
       "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
      dir,
    );
    return new Authority(dir, ca, key);
  }

  /** A certificate for localhost and 127.0.0.1, for server and client use, signed by this authority. */
  async issue(name: string): Promise<CertificatePair> {
    const key = join(this.dir, `${name}.key`);
    const csr = join(this.dir, `${name}.csr`);
    const cert = join(this.dir, `${name}.pem`);
    const extensions = join(this.dir, `${name}.ext`);
    writeFileSync(
      extensions,
      "subjectAltName=DNS:localhost,IP:127.0.0.1\n" +
        "basicConstraints=critical,CA:FALSE\n" +
        "keyUsage=critical,digitalSignature,keyEncipherment\n" +
        "extendedKeyUsage=serverAuth,clientAuth\n" +
        "subjectKeyIdentifier=hash\n" +
        "authorityKeyIdentifier=keyid,issuer\n",
    );
    await openssl(["req", "-new", ...EC_KEY, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"], this.dir);
    await openssl(
      ["x509", "-req", "-in", csr, "-CA", this.ca, "-CAkey", this.caKey, "-CAcreateserial", "-out", cert,
       "-days", "2", "-extfile", extensions],
      this.dir,
    );
    return { cert, key };
  }
}

/** Collects what a callback receives. */
export class Inbox<T> {
  readonly items: T[] = [];
  readonly push = (item: T): void => {
    this.items.push(item);
  };

  async waitFor(what: string, predicate: (item: T) => boolean, timeoutMs = 30_000): Promise<T> {
    return waitFor(what, () => this.items.find(predicate), timeoutMs);
  }
}
