// startLtmStack(): RabbitMQ with the contract's topology and users, Postgres migrated, Redis (containers, through
// testcontainers) and `worker run` processes, for a shard's own integration tests. See README.md "Testing your shard".
import { spawn, execFileSync } from "node:child_process";
import { createHash, randomBytes, randomInt } from "node:crypto";
import { accessSync, constants, existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { createServer, isIP } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, dirname, join, resolve } from "node:path";
import type { Readable } from "node:stream";

import * as amqp from "amqplib";
import { Redis } from "ioredis";
import type { StartedNetwork, StartedTestContainer } from "testcontainers";

import { buildContext, type ContextInput } from "../builders.js";
import type { EventContext } from "../generated/index.js";
import { RABBITMQ_DEFINITIONS } from "../generated/rabbitmq_definitions.js";
import {
  INVALIDATION_CHANNEL,
  NOTIFICATIONS_EXCHANGE,
  TOOL_CALLS_EXCHANGE,
  TOOL_RESULTS_EXCHANGE,
  WORK_QUEUE,
  shardUser,
} from "../names.js";
import { POSTGRES_IMAGE, RABBITMQ_IMAGE, REDIS_IMAGE, WORKER_IMAGE, resolveImage, type ServiceImage } from "./images.js";
import { ManagementClient } from "./management.js";
import { WorkerProcess } from "./process.js";
import { Deadline, StopWaiting, allOrAbandon, until } from "./wait.js";

/** The label every container of a stack carries (its value: the stack's id; the Python stack uses the same key), to find leftovers. */
export const STACK_LABEL = "org.tomoribot.ltm.testing";

/** How long the whole start may take by default (images present it takes a few seconds; see README). */
export const DEFAULT_START_TIMEOUT_MS = 120_000;

export interface LtmStackOptions {
  /** `worker run` processes to start (default 1) */
  workers?: number;
  /**
   * the `worker` executable; default LTM_WORKER_BIN, else `worker` on PATH, else `.venv/bin/worker` in the
   * current directory or one above it (README.md "Testing your shard")
   */
  workerBin?: string;
  /**
   * Run the worker from its image instead of the installed package (`true`: LTM_WORKER_IMAGE, else `tomoribot-ltm-worker:dev`, what
   * `docker compose -f deploy/compose.yaml build` tags); the services then share a Docker network with it.
   */
  workerImage?: string | boolean;
  /** more environment for every worker (LTM_* settings such as LTM_RETRY_BASE_DELAY_MS) */
  workerEnv?: Record<string, string>;
  /** images, else LTM_POSTGRES_IMAGE / LTM_RABBITMQ_IMAGE / LTM_REDIS_IMAGE, else the pinned official ones */
  images?: { postgres?: string; rabbitmq?: string; redis?: string };
  /** the one deadline of the whole start (default 120 s); its error carries every container's and worker's log */
  startTimeoutMs?: number;
  /**
   * The host address the containers' ports are published on. Default: `127.0.0.1` when the engine runs on this
   * machine (testcontainers reaches it at a loopback address, or at an address of this machine's own interfaces,
   * such as the bridge gateway it takes inside a container whose own dockerd it talks to), else the engine's own default (every interface
   * of the engine's host: a remote engine, or tests inside a container, reach the ports there). Also
   * LTM_STACK_PUBLISH_ADDRESS; `""` asks for the engine's default.
   */
  publishAddress?: string;
}

/** A shard's own RabbitMQ user `shard-<id>`, with the permissions CONTRACT.md gives a shard. */
export interface StackShard {
  shardId: number;
  /** amqp://shard-<id>:<a random password>@127.0.0.1:port/ */
  amqpUrl: string;
  /** the stack's Redis as the shards' user: SUBSCRIBE to the invalidations and PING, nothing else */
  redisUrl: string;
}

/** The bot rows of a try-out, with Discord ids of its own (no other test's save touches them). */
export interface SeededWorld {
  guildId: string;
  channelId: string;
  /** the triggering user */
  userId: string;
  botUserId: string;
  /** `servers.server_id` and `personas.persona_id` of the guild */
  serverId: number;
  personaId: number;
  /** a second member, a participant of the conversation, for personal memories ("target_user") */
  member: { userId: string; username: string; globalName: string; label: string };
  /** the event's `context` for this world (buildContext), with the member as participant and member */
  context(extra?: Partial<ContextInput>): EventContext;
}

/** A started stack: what a shard's test needs. */
export interface LtmStack {
  /** the stack's id (the value of the containers' `org.tomoribot.ltm.testing` label) */
  readonly id: string;
  /** shard 0's URL, user `shard-0` of deploy/rabbitmq/definitions.json (with a random password) */
  readonly amqpUrl: string;
  readonly shardId: number;
  /** Redis as the shards' user of deploy/redis/users.acl (random password): SUBSCRIBE to the invalidations, PING */
  readonly redisUrl: string;
  /** the migrated database, as its owner (for a test's own queries) */
  readonly postgresDsn: string;
  /** an administrator's URL of the broker (for a test that looks at the wire; a shard never has this) */
  readonly adminAmqpUrl: string;
  readonly managementUrl: string;
  /** what each step of the start took, in ms */
  readonly timings: Readonly<Record<string, number>>;
  /** A shard id of its own (random unless given) and its user: results and notices no other test reads. */
  newShard(shardId?: number): Promise<StackShard>;
  /** Insert a server, its persona and two users with fresh Discord ids (the bot's tables). */
  seed(): Promise<SeededWorld>;
  /** Every container's and worker's log so far (the tail of each). */
  logs(): string;
  /** What another process needs to use this stack: JSON for LTM_STACK (attachLtmStack). Holds credentials. */
  describe(): string;
  /** false for a stack attached from LTM_STACK: its stop() leaves it to the process that started it */
  readonly owned: boolean;
  /** Stop the workers (SIGTERM), remove the containers (and the network). Safe to call twice. */
  stop(): Promise<void>;
}

/** The start did not finish: which step, why, and the logs. */
export class LtmStackStartError extends Error {
  constructor(
    message: string,
    readonly step: string,
    readonly logs: string,
    /** the failed stack's id: the value of its containers' label (all removed by now) */
    readonly stackId: string,
  ) {
    super(message);
    this.name = "LtmStackStartError";
  }
}

// ---------------------------------------------------------------------------------------------------------

const WORKER_USER = "worker";
const DATABASE = "tomoribot";

/** A password nobody else knows (every user of a stack gets one; none of deploy/'s development passwords). */
function newPassword(): string {
  return randomBytes(12).toString("hex");
}

/**
 * The Redis users of deploy/redis/users.acl, their rules after the password (test/testing-entry.test.ts keeps
 * them equal to the file's): the worker may PUBLISH to the invalidation channel (and PING, INFO for its probes
 * and `worker check`), a shard may only SUBSCRIBE to it (and PING); neither may touch a key.
 */
export const REDIS_USER_RULES = {
  worker: `resetchannels &${INVALIDATION_CHANNEL} resetkeys -@all +publish +ping +info`,
  shard: `resetchannels &${INVALIDATION_CHANNEL} resetkeys -@all +subscribe +ping`,
} as const;
const LOG_TAIL = 4_000;

/** The tail of each source's output, kept for the error of a failed start and `logs()`. */
class LogBook {
  private readonly sources = new Map<string, string>();
  private readonly files = new Map<string, string>();

  add(source: string, text: string): void {
    const all = (this.sources.get(source) ?? "") + text;
    this.sources.set(source, all.length > 4 * LOG_TAIL ? all.slice(-2 * LOG_TAIL) : all);
  }

  file(source: string, path: string): void {
    this.files.set(source, path);
  }

  text(source: string): string {
    const path = this.files.get(source);
    if (path !== undefined) return existsSync(path) ? readFileSync(path, "utf8") : "";
    return this.sources.get(source) ?? "";
  }

  render(): string {
    const names = [...new Set([...this.sources.keys(), ...this.files.keys()])];
    return names
      .map((name) => {
        const text = this.text(name).slice(-LOG_TAIL).trimEnd();
        return `----- ${name} (last ${LOG_TAIL} characters) -----\n${text === "" ? "(nothing)" : text}`;
      })
      .join("\n");
  }

  consumer(source: string): (stream: Readable) => void {
    return (stream) => {
      stream.on("data", (chunk: Buffer | string) => this.add(source, chunk.toString()));
      stream.on("error", () => {});
    };
  }
}

/**
 * The address the stack's published ports are reached at. TESTCONTAINERS_HOST_OVERRIDE, when set, decides (as it
 * does for testcontainers). Otherwise a port the engine published on one address (dockerd's --ip, such as
 * 127.0.0.1; IPv4 only, the URLs are built without brackets) is reached at that address: testcontainers' own guess may be a bridge gateway, which it takes
 * wherever /.dockerenv exists, and a loopback-bound port does not answer there. A wildcard binding leaves
 * testcontainers' host, its "localhost" read as 127.0.0.1 (which may resolve to ::1, where nothing is published).
 */
async function publishedHost(tc: Testcontainers, container: StartedTestContainer): Promise<string> {
  const guessed = container.getHost();
  if (process.env.TESTCONTAINERS_HOST_OVERRIDE) return guessed;
  try {
    const client = await tc.getContainerRuntimeClient();
    const info = await client.container.inspect(client.container.getById(container.getId()));
    const bindings = Object.values(info.NetworkSettings.Ports ?? {}).flatMap((b) => b ?? []);
    const addresses = new Set(bindings.map((b) => b.HostIp).filter((ip) => ip !== "" && ip !== "0.0.0.0" && !ip.includes(":")));
    if (addresses.size === 1) return [...addresses][0]!;
  } catch {
    // no inspection: testcontainers' guess below
  }
  return guessed === "localhost" ? "127.0.0.1" : guessed;
}

/** RabbitMQ's rabbit_password_hashing_sha256: base64 of a 4-byte salt and sha256(salt + password). */
function passwordHash(password: string): string {
  const salt = randomBytes(4);
  const digest = createHash("sha256").update(Buffer.concat([salt, Buffer.from(password, "utf8")])).digest();
  return Buffer.concat([salt, digest]).toString("base64");
}

/**
 * The definitions with a random password for each user: the development passwords of the file are published,
 * so the stack gives none of them (security review 4, N12). Returns the definitions and each user's password.
 */
function definitionsWithPasswords(): { definitions: typeof RABBITMQ_DEFINITIONS; passwords: Record<string, string> } {
  const passwords: Record<string, string> = {};
  const users = RABBITMQ_DEFINITIONS.users.map((user) => {
    const password = newPassword();
    passwords[user.name] = password;
    return { ...user, password_hash: passwordHash(password), hashing_algorithm: "rabbit_password_hashing_sha256" };
  });
  return { definitions: { ...RABBITMQ_DEFINITIONS, users }, passwords };
}

/**
 * The user, permissions and topic permissions of `shard-<id>`: shard-0's of the definitions, renumbered (its
 * topic permission on tomori.tool_calls is then `^tool\.[A-Za-z0-9_]+(\.shard\.<id>)?$`, deploy/rabbitmq/shard_users.py's).
 */
function shardDefinitions(id: number, password: string): Record<string, unknown> {
  const renumber = (text: string): string => text.replaceAll("shard\\.0", `shard\\.${id}`);
  const name = shardUser(id);
  const template = RABBITMQ_DEFINITIONS.users.find((u) => u.name === shardUser(0));
  if (template === undefined) throw new Error("deploy/rabbitmq/definitions.json has no shard-0 user to copy");
  return {
    users: [{ ...template, name, password_hash: passwordHash(password), hashing_algorithm: "rabbit_password_hashing_sha256" }],
    permissions: RABBITMQ_DEFINITIONS.permissions
      .filter((p) => p.user === shardUser(0))
      .map((p) => ({ ...p, user: name, configure: renumber(p.configure), write: renumber(p.write), read: renumber(p.read) })),
    topic_permissions: RABBITMQ_DEFINITIONS.topic_permissions
      .filter((p) => p.user === shardUser(0))
      .map((p) => ({ ...p, user: name, write: renumber(p.write), read: renumber(p.read) })),
  };
}

/** A fresh Discord id (19 digits). */
function snowflake(): string {
  return `1${String(randomInt(1, 10 ** 9)).padStart(9, "0")}${String(randomInt(0, 10 ** 9)).padStart(9, "0")}`;
}

function urlWithCredentials(host: string, port: number, user: string, password: string, scheme = "amqp"): string {
  return `${scheme}://${encodeURIComponent(user)}:${encodeURIComponent(password)}@${host}:${port}/`;
}

type Testcontainers = typeof import("testcontainers");
/** The part of dockerode (testcontainers' Docker client) the sweep uses. */
interface DockerodeLike {
  listContainers(options: { all: boolean; filters: { label: string[] } }): Promise<Array<{ Id: string }>>;
  getContainer(id: string): { remove(options: { force: boolean; v: boolean }): Promise<unknown> };
}
type Pg = typeof import("pg");

async function optionalPeer<T>(name: string): Promise<T> {
  try {
    return (await import(name)) as T;
  } catch (error) {
    throw new Error(
      `@tomoribot/ltm-client/testing needs the package "${name}" (an optional peer dependency): ` +
        `npm install --save-dev testcontainers pg (${error instanceof Error ? error.message : String(error)})`,
    );
  }
}

/** `worker run` as a process (or a container) with its log in the log book. */
interface StackWorker {
  readonly name: string;
  /** its name in the log book */
  readonly logSource: string;
  alive(): boolean;
  stop(): Promise<void>;
  killNow(): void;
}

/** `worker run` as a process of this machine (process.ts), named in the log book. */
class ProcessWorker implements StackWorker {
  private readonly process: WorkerProcess;

  constructor(
    readonly name: string,
    readonly logSource: string,
    bin: string,
    env: NodeJS.ProcessEnv,
    logPath: string,
  ) {
    // a test process ends when its tests do; the exit hook stops the worker
    this.process = new WorkerProcess(bin, env, logPath).start({ unref: true });
  }

  alive(): boolean {
    return this.process.alive();
  }

  async stop(): Promise<void> {
    await this.process.stop();
  }

  killNow(): void {
    this.process.kill();
  }
}

class WorkerContainer implements StackWorker {
  constructor(
    readonly name: string,
    readonly logSource: string,
    readonly container: StartedTestContainer,
  ) {}
  alive(): boolean {
    return true;
  }
  async stop(): Promise<void> {
    await this.container.stop({ timeout: 30_000 }).catch(() => {});
  }
  killNow(): void {}
}

// ---------------------------------------------------------------------------------------------------------

/** What describe() writes and attachLtmStack() reads. */
interface StackDescription {
  id: string;
  host: string;
  amqpPort: number;
  managementPort: number;
  rabbitAdmin: { user: string; password: string };
  /** the RabbitMQ users' passwords (shard-0, worker, ...) */
  passwords: Record<string, string>;
  postgresDsn: string;
  redisUrl: string;
}

class RunningStack implements LtmStack {
  id = `ltm-${randomBytes(4).toString("hex")}`;
  owned = true;
  readonly timings: Record<string, number> = {};
  readonly book = new LogBook();
  readonly containers: StartedTestContainer[] = [];
  readonly workers: StackWorker[] = [];
  network: StartedNetwork | null = null;
  dir: string | null = null;
  host = "127.0.0.1";
  amqpPort = 0;
  managementPort = 0;
  postgresPassword = newPassword();
  rabbitAdmin = { user: "ltm-admin", password: newPassword() };
  /** the RabbitMQ users' passwords, set when the definitions are imported */
  passwords: Record<string, string> = {};
  /** the Redis users' passwords (deploy/redis/users.acl's users) */
  redisPasswords = { worker: newPassword(), shard: newPassword() };
  redisPort = 0;
  postgresDsn = "";
  redisUrl = "";
  pg: Pg | null = null;
  tc: Testcontainers | null = null;
  private stopped = false;

  get shardId(): number {
    return 0;
  }
  get amqpUrl(): string {
    return urlWithCredentials(this.host, this.amqpPort, shardUser(0), this.passwords[shardUser(0)] ?? "");
  }
  get adminAmqpUrl(): string {
    return urlWithCredentials(this.host, this.amqpPort, this.rabbitAdmin.user, this.rabbitAdmin.password);
  }
  get managementUrl(): string {
    return `http://${this.host}:${this.managementPort}`;
  }

  /** RabbitMQ's HTTP API as the stack's administrator. */
  get management(): ManagementClient {
    return new ManagementClient(this.managementUrl, this.rabbitAdmin.user, this.rabbitAdmin.password);
  }

  async newShard(shardId?: number): Promise<StackShard> {
    const id = shardId ?? randomInt(1_000, 2_000_000_000);
    if (!Number.isInteger(id) || id < 0 || id > 2_147_483_647) throw new RangeError(`shard id ${id}: an integer 0..2147483647`);
    const password = newPassword();
    await this.management.importDefinitions(shardDefinitions(id, password));
    return { shardId: id, amqpUrl: urlWithCredentials(this.host, this.amqpPort, shardUser(id), password), redisUrl: this.redisUrl };
  }

  async seed(): Promise<SeededWorld> {
    if (this.pg === null) throw new Error("the stack is not started");
    const db = new this.pg.Client({ connectionString: this.postgresDsn });
    await db.connect();
    const guildId = snowflake();
    const userId = snowflake();
    const memberId = snowflake();
    try {
      const server = await db.query<{ server_id: number }>(
        "INSERT INTO servers (server_disc_id) VALUES ($1) RETURNING server_id",
        [guildId],
      );
      const serverId = server.rows[0]?.server_id ?? 0;
      const persona = await db.query<{ persona_id: number }>(
        "INSERT INTO personas (server_id, persona_nickname) VALUES ($1, 'Tomori') RETURNING persona_id",
        [serverId],
      );
      const personaId = persona.rows[0]?.persona_id ?? 0;
      await db.query("INSERT INTO users (user_disc_id) VALUES ($1), ($2)", [userId, memberId]);
      const world = {
        guildId,
        channelId: snowflake(),
        userId,
        botUserId: snowflake(),
        serverId,
        personaId,
        member: { userId: memberId, username: "sparrow_ow", globalName: "Sparrow", label: "Sparrow" },
      };
      return {
        ...world,
        context: (extra: Partial<ContextInput> = {}) =>
          buildContext({
            guildId: world.guildId,
            channelId: world.channelId,
            userId: world.userId,
            botUserId: world.botUserId,
            personaId: world.personaId,
            participants: [{ targetId: memberId, displayLabel: "Sparrow", aliases: ["Sparrow", "sparrow_ow"] }],
            members: [{ userId: memberId, username: "sparrow_ow", globalName: "Sparrow" }],
            ...extra,
          }),
      };
    } finally {
      await db.end();
    }
  }

  logs(): string {
    return this.owned ? this.book.render() : `(stack ${this.id} was started by another process: its logs are there)`;
  }

  describe(): string {
    const { id, host, amqpPort, managementPort, rabbitAdmin, passwords, postgresDsn, redisUrl } = this;
    return JSON.stringify({ id, host, amqpPort, managementPort, rabbitAdmin, passwords, postgresDsn, redisUrl } satisfies StackDescription);
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    if (!this.owned) return;
    await Promise.all(this.workers.map((w) => w.stop()));
    // throwaway servers: killed and removed with their volumes, no graceful shutdown to wait for
    await Promise.all(this.containers.map((c) => c.stop({ remove: true, removeVolumes: true, timeout: 0 }).catch(() => {})));
    await this.sweep();
    await this.network?.stop().catch(() => {});
    if (this.dir !== null) rmSync(this.dir, { recursive: true, force: true });
    process.removeListener("exit", this.exitHook);
  }

  /** Remove whatever still carries this stack's label (a container whose start failed half-way). */
  private async sweep(): Promise<void> {
    if (this.tc === null) return;
    try {
      const client = await this.tc.getContainerRuntimeClient();
      const docker = (client.container as unknown as { dockerode?: DockerodeLike }).dockerode;
      if (docker === undefined) return;
      const left = await docker.listContainers({ all: true, filters: { label: [`${STACK_LABEL}=${this.id}`] } });
      await Promise.all(left.map((info) => docker.getContainer(info.Id).remove({ force: true, v: true }).catch(() => {})));
    } catch {
      // the engine is gone: nothing can be removed
    }
  }

  /** At process exit without stop(): kill the workers, remove the containers (Ryuk may be off) - synchronously. */
  readonly exitHook = (): void => {
    if (this.stopped) return;
    for (const worker of this.workers) worker.killNow();
    if (this.owned && this.tc !== null) {
      try {
        const ids = execFileSync("docker", ["ps", "-a", "-q", "--filter", `label=${STACK_LABEL}=${this.id}`], { encoding: "utf8", timeout: 20_000 })
          .split("\n")
          .filter((id) => id !== "");
        if (ids.length > 0) execFileSync("docker", ["rm", "-f", "-v", ...ids], { stdio: "ignore", timeout: 20_000 });
        if (this.network !== null) execFileSync("docker", ["network", "rm", this.network.getName()], { stdio: "ignore", timeout: 20_000 });
      } catch {
        // no docker CLI: `docker ps -a --filter label=org.tomoribot.ltm.testing` finds what is left
      }
    }
    if (this.dir !== null) rmSync(this.dir, { recursive: true, force: true });
  };
}

/**
 * Start the stack: RabbitMQ with deploy/rabbitmq/definitions.json (the contract's topology and users), Postgres
 * migrated with `worker migrate`, Redis with the users of deploy/redis/users.acl, and `options.workers`
 * `worker run` consuming. Resolves once each is ready (an AMQP connection as shard-0 finds the exchanges, a
 * query is answered, PING, the workers consume the events queue); rejects with LtmStackStartError (with every
 * log) when that takes longer than `startTimeoutMs`, or a step fails, after removing what it started.
 */
export async function startLtmStack(options: LtmStackOptions = {}): Promise<LtmStack> {
  const deadline = new Deadline(options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS);
  const stack = new RunningStack();
  process.on("exit", stack.exitHook);
  let step = "finding the worker";
  const started = Date.now();
  let failedStep: string | null = null; // the first step that failed (the three services' steps run at once)
  const timed = async <T>(name: string, body: () => Promise<T>): Promise<T> => {
    step = name;
    const t0 = Date.now();
    try {
      const value = await body();
      stack.timings[name] = Date.now() - t0;
      return value;
    } catch (error) {
      failedStep ??= name;
      throw error;
    }
  };
  try {
    const workerImage = options.workerImage === true ? process.env.LTM_WORKER_IMAGE?.trim() || WORKER_IMAGE : options.workerImage || null;
    // before any container: a missing `worker` fails in milliseconds, not after the services started
    const workerBin = workerImage === null ? findWorkerBin(options) : null;
    step = "loading testcontainers and pg";
    const tc = await optionalPeer<Testcontainers>("testcontainers");
    stack.tc = tc;
    const pgModule = await optionalPeer<{ default: Pg }>("pg");
    stack.pg = pgModule.default;
    if (workerImage !== null) stack.network = await new tc.Network().start();
    const publishAddress = await publishAddressOf(tc, options);
    const Container = withPublishAddress(tc, publishAddress);

    const images = {
      rabbitmq: options.images?.rabbitmq ?? resolveImage(RABBITMQ_IMAGE),
      postgres: options.images?.postgres ?? resolveImage(POSTGRES_IMAGE),
      redis: options.images?.redis ?? resolveImage(REDIS_IMAGE),
    };
    const container = (which: ServiceImage, image: string, alias: string, ports: number[]) => {
      let c = new Container(image)
        .withPorts(...ports)
        .withName(`${stack.id}-${alias}`)
        .withLabels({ [STACK_LABEL]: stack.id })
        .withLogConsumer(stack.book.consumer(`${which.service} (${image})`))
        .withStartupTimeout(Math.max(1_000, deadline.left()));
      if (stack.network !== null) c = c.withNetwork(stack.network).withNetworkAliases(alias);
      return c;
    };
    const startOne = async (which: ServiceImage, image: string, c: ReturnType<typeof container>) => {
      try {
        const s = await c.start();
        stack.containers.push(s);
        return s;
      } catch (error) {
        const reason = error instanceof Error ? error.message : String(error);
        throw new Error(`${which.service} from image ${image} did not start (set ${which.envVar} to use another image): ${reason}`);
      }
    };

    const [rabbit, postgres, redis] = await timed("containers started", async () => {
      const results = await Promise.allSettled([
        startOne(
          RABBITMQ_IMAGE,
          images.rabbitmq,
          container(RABBITMQ_IMAGE, images.rabbitmq, "rabbitmq", [5672, 15672])
            .withEnvironment({ RABBITMQ_DEFAULT_USER: stack.rabbitAdmin.user, RABBITMQ_DEFAULT_PASS: stack.rabbitAdmin.password })
            .withWaitStrategy(tc.Wait.forLogMessage(/Server startup complete/)),
        ),
        startOne(
          POSTGRES_IMAGE,
          images.postgres,
          container(POSTGRES_IMAGE, images.postgres, "postgres", [5432])
            .withEnvironment({ POSTGRES_PASSWORD: stack.postgresPassword, POSTGRES_DB: DATABASE })
            .withWaitStrategy(tc.Wait.forLogMessage(/ready to accept connections/)),
        ),
        startOne(
          REDIS_IMAGE,
          images.redis,
          container(REDIS_IMAGE, images.redis, "redis", [6379])
            .withCommand(redisCommand(stack.redisPasswords))
            .withWaitStrategy(tc.Wait.forLogMessage(/Ready to accept connections/)),
        ),
      ]);
      const failed = results.filter((r): r is PromiseRejectedResult => r.status === "rejected");
      if (failed.length > 0) throw new Error(failed.map((r) => (r.reason as Error).message).join("\n"));
      return results.map((r) => (r as PromiseFulfilledResult<StartedTestContainer>).value) as [
        StartedTestContainer,
        StartedTestContainer,
        StartedTestContainer,
      ];
    });

    stack.host = await publishedHost(tc, rabbit);
    stack.amqpPort = rabbit.getMappedPort(5672);
    stack.managementPort = rabbit.getMappedPort(15672);
    stack.postgresDsn = `postgresql://postgres:${stack.postgresPassword}@${stack.host}:${postgres.getMappedPort(5432)}/${DATABASE}`;
    stack.redisPort = redis.getMappedPort(6379);
    stack.redisUrl = redisUrl(stack.host, stack.redisPort, "shard", stack.redisPasswords.shard);

    await allOrAbandon(deadline, [
      timed("RabbitMQ: definitions imported, topology seen as shard-0", async () => {
        await until(`RabbitMQ's management API (${stack.managementUrl})`, deadline, async () => (await stack.management.request("GET", "/api/overview")).ok);
        const { definitions, passwords } = definitionsWithPasswords();
        await stack.management.importDefinitions(definitions);
        stack.passwords = passwords;
        await until("the contract's exchanges, as shard-0 over AMQP", deadline, async () => {
          const connection = await amqp.connect(stack.amqpUrl, { timeout: 5_000 });
          try {
            const channel = await connection.createChannel();
            for (const exchange of [TOOL_CALLS_EXCHANGE, TOOL_RESULTS_EXCHANGE, NOTIFICATIONS_EXCHANGE]) {
              await channel.checkExchange(exchange);
            }
            return true;
          } finally {
            await connection.close().catch(() => {});
          }
        });
      }),
      timed("Postgres: a query answered, `worker migrate`", async () => {
        await until("a query answered by Postgres", deadline, async () => {
          const db = new stack.pg!.Client({ connectionString: stack.postgresDsn, connectionTimeoutMillis: 5_000 });
          try {
            await db.connect();
            await db.query("SELECT 1");
            return true;
          } finally {
            await db.end().catch(() => {});
          }
        });
        await migrate(stack, options, workerImage, workerBin, tc, deadline);
      }),
      timed("Redis: PING as the shards' user", async () => {
        await until("PONG from Redis", deadline, async () => {
          const client = new Redis(stack.redisUrl, {
            lazyConnect: true,
            enableReadyCheck: false, // the shards' user may not run INFO
            maxRetriesPerRequest: 0,
            retryStrategy: () => null,
            connectTimeout: 5_000,
          });
          client.on("error", () => {});
          try {
            await client.connect();
            return (await client.ping()) === "PONG";
          } finally {
            client.disconnect();
          }
        });
      }),
    ]);

    const count = options.workers ?? 1;
    await timed(`${count} worker(s) consuming`, async () => {
      stack.dir = mkdtempSync(join(tmpdir(), "ltm-stack-"));
      for (let i = 0; i < count; i += 1) {
        const name = `worker-${i}`;
        if (workerImage === null) {
          const logPath = join(stack.dir, `${name}.log`);
          const source = `${name} (worker run)`;
          stack.book.file(source, logPath);
          stack.workers.push(new ProcessWorker(name, source, workerBin ?? "worker", workerEnv(stack, options, false), logPath));
        } else {
          const source = `${name} (${workerImage})`;
          const c = await new tc.GenericContainer(workerImage)
            .withName(`${stack.id}-${name}`)
            .withLabels({ [STACK_LABEL]: stack.id })
            .withNetwork(stack.network!)
            .withEnvironment(workerEnv(stack, options, true) as Record<string, string>)
            .withLogConsumer(stack.book.consumer(source))
            .withWaitStrategy(tc.Wait.forLogMessage(/"event": ?"consuming"/))
            .withStartupTimeout(Math.max(1_000, deadline.left()))
            .start();
          stack.workers.push(new WorkerContainer(name, source, c));
        }
      }
      // ready = each worker logged "consuming", and the broker counts that many consumers on the events queue
      await until(`${count} worker(s) logging "consuming"`, deadline, async () => {
        const dead = stack.workers.find((w) => !w.alive());
        if (dead !== undefined) throw new StopWaiting(`${dead.name} exited`);
        const logged = stack.workers.filter((w) => /"event": ?"consuming"/.test(stack.book.text(w.logSource)));
        return logged.length === count;
      });
      // the broker's own count, at once (the management API's queue statistics lag by up to 5 s)
      await until(`${count} consumer(s) on ${WORK_QUEUE}`, deadline, async () => {
        const connection = await amqp.connect(stack.adminAmqpUrl, { timeout: 5_000 });
        try {
          const channel = await connection.createChannel();
          return (await channel.checkQueue(WORK_QUEUE)).consumerCount >= count;
        } finally {
          await connection.close().catch(() => {});
        }
      });
    });
    stack.timings.total = Date.now() - started;
    return stack;
  } catch (error) {
    deadline.abandon();
    const reason = error instanceof Error ? error.message : String(error);
    step = failedStep ?? step;
    const logs = stack.logs();
    await stack.stop();
    throw new LtmStackStartError(
      `the LTM stack did not start (step: ${step}, ${Date.now() - started} ms of ${deadline.ms}): ${reason}\n${logs}`,
      step,
      logs,
      stack.id,
    );
  }
}

/** Is `path` a file this process may execute? */
function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/**
 * The `worker` executable: the workerBin option, else LTM_WORKER_BIN, else `worker` on PATH, else
 * `.venv/bin/worker` in the current directory or the one above it (a shard that installed the worker's package
 * into its own virtual environment). Throws, saying where it looked and what to do, when none is there.
 */
export function findWorkerBin(options: Pick<LtmStackOptions, "workerBin"> = {}, env: NodeJS.ProcessEnv = process.env, cwd = process.cwd()): string {
  const given = options.workerBin ?? env.LTM_WORKER_BIN?.trim();
  if (given) {
    const path = given.includes("/") ? resolve(cwd, given) : onPath(given, env);
    if (path !== null && executable(path)) return path;
    const source = options.workerBin !== undefined ? "the workerBin option" : "LTM_WORKER_BIN";
    throw new Error(`${source} names ${given}, which is not an executable file: give the path of the worker's \`worker\` (e.g. /path/to/worker-repository/.venv/bin/worker)`);
  }
  const found = onPath("worker", env);
  if (found !== null) return found;
  const venvs = [cwd, dirname(cwd)].map((dir) => join(dir, ".venv", "bin", "worker"));
  const venv = venvs.find(executable);
  if (venv !== undefined) return venv;
  throw new Error(
    "cannot find the LTM worker's `worker` executable: no workerBin option, LTM_WORKER_BIN not set, no `worker` on " +
      `PATH, no ${venvs.join(" or ")}. Install the worker's package (in its repository: python3 -m venv .venv && ` +
      ".venv/bin/pip install -e .) and run the tests with LTM_WORKER_BIN=/path/to/that/repository/.venv/bin/worker",
  );
}

function onPath(name: string, env: NodeJS.ProcessEnv): string | null {
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    if (dir === "") continue;
    const path = join(dir, name);
    if (executable(path)) return path;
  }
  return null;
}

/** The publish address of the options, the environment, or by where the engine is (see `publishAddress`). */
async function publishAddressOf(tc: Testcontainers, options: LtmStackOptions): Promise<string> {
  const chosen = options.publishAddress ?? process.env.LTM_STACK_PUBLISH_ADDRESS;
  if (chosen !== undefined) return chosen.trim();
  const override = process.env.TESTCONTAINERS_HOST_OVERRIDE?.trim();
  if (override) return publishAddressFor(override, { override: true });
  return publishAddressFor((await tc.getContainerRuntimeClient()).info.containerRuntime.host, { override: false });
}

/**
 * The publish address for an engine testcontainers reaches at `host`: 127.0.0.1 for a loopback host, and for
 * testcontainers' own guess (not an override, which names where the ports must answer) when it is an address
 * of this machine's own interfaces; else "" (the engine's default).
 */
export async function publishAddressFor(host: string, { override }: { override: boolean }): Promise<string> {
  return isLoopback(host) || (!override && (await isOwnAddress(host))) ? "127.0.0.1" : "";
}

function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || host === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/**
 * Whether `host` (an IP address) is one of this machine's own: a socket can listen on it. testcontainers, run
 * where /.dockerenv exists, takes the engine's bridge gateway for its host; when that gateway is ours (the
 * engine runs in this network namespace, as in a CI container that starts its own dockerd) the engine's
 * loopback is ours too and a port published on 127.0.0.1 answers here. A sibling container's gateway belongs
 * to the machine outside. (os.networkInterfaces() will not do: it leaves out an interface without a carrier,
 * as the bridge is while no container runs.)
 */
function isOwnAddress(host: string): Promise<boolean> {
  const bare = host.replace(/^\[|\]$/g, "");
  if (isIP(bare) === 0) return Promise.resolve(false);
  return new Promise((done) => {
    const probe = createServer();
    probe.once("error", () => done(false));
    probe.listen(0, bare, () => probe.close(() => done(true)));
  });
}

/**
 * testcontainers' GenericContainer that publishes its ports on `address` (testcontainers itself publishes on
 * every interface of the engine's host, which a stock engine opens to the network: security review 4, N12).
 */
function withPublishAddress(tc: Testcontainers, address: string) {
  return class extends tc.GenericContainer {
    withPorts(...ports: number[]): this {
      this.withExposedPorts(...ports);
      if (address !== "") {
        const bindings = { ...this.hostConfig.PortBindings };
        for (const port of ports) bindings[`${port}/tcp`] = [{ HostIp: address, HostPort: "0" }];
        this.hostConfig.PortBindings = bindings;
      }
      return this;
    }
  };
}

/** The Redis server's command: the users of deploy/redis/users.acl (hashed passwords), nobody else. */
function redisCommand(passwords: { worker: string; shard: string }): string[] {
  const hash = (password: string) => `#${createHash("sha256").update(password, "utf8").digest("hex")}`;
  const user = (name: keyof typeof REDIS_USER_RULES) => ["--user", name, "on", hash(passwords[name]), ...REDIS_USER_RULES[name].split(" ")];
  return [
    "redis-server",
    // the official image's defaults, stated (a command replaces the image's): every interface of the container
    // (its port is published on the host's loopback), no persistence
    "--bind", "*", "-::*",
    "--protected-mode", "no",
    "--save", "",
    "--appendonly", "no",
    "--user", "default", "off",
    ...user("worker"),
    ...user("shard"),
  ];
}

function redisUrl(host: string, port: number | string, user: string, password: string): string {
  return `redis://${encodeURIComponent(user)}:${encodeURIComponent(password)}@${host}:${port}/0`;
}

/** The environment of `worker run`/`migrate`: the stack's services (by alias inside the network). */
function workerEnv(stack: RunningStack, options: LtmStackOptions, inNetwork: boolean): NodeJS.ProcessEnv {
  const password = stack.passwords[WORKER_USER] ?? "";
  const services = inNetwork
    ? {
        LTM_POSTGRES_DSN: `postgresql://postgres:${stack.postgresPassword}@postgres:5432/${DATABASE}`,
        LTM_RABBITMQ_URL: urlWithCredentials("rabbitmq", 5672, WORKER_USER, password),
        LTM_REDIS_URL: redisUrl("redis", 6379, WORKER_USER, stack.redisPasswords.worker),
      }
    : {
        LTM_POSTGRES_DSN: stack.postgresDsn,
        LTM_RABBITMQ_URL: urlWithCredentials(stack.host, stack.amqpPort, WORKER_USER, password),
        LTM_REDIS_URL: redisUrl(stack.host, stack.redisPort, WORKER_USER, stack.redisPasswords.worker),
      };
  const base: NodeJS.ProcessEnv = inNetwork ? {} : { PATH: process.env.PATH, HOME: process.env.HOME };
  return { ...base, ...services, LTM_LOG_FORMAT: "json", ...options.workerEnv };
}

async function migrate(
  stack: RunningStack,
  options: LtmStackOptions,
  workerImage: string | null,
  bin: string | null,
  tc: Testcontainers,
  deadline: Deadline,
): Promise<void> {
  if (workerImage !== null || bin === null) {
    const image = workerImage ?? WORKER_IMAGE;
    await new tc.GenericContainer(image)
      .withName(`${stack.id}-migrate`)
      .withLabels({ [STACK_LABEL]: stack.id })
      .withNetwork(stack.network!)
      .withEnvironment(workerEnv(stack, options, true) as Record<string, string>)
      .withCommand(["migrate"])
      .withLogConsumer(stack.book.consumer(`worker migrate (${image})`))
      .withWaitStrategy(tc.Wait.forOneShotStartup())
      .withStartupTimeout(Math.max(1_000, deadline.left()))
      .start()
      .then((done) => done.stop({ remove: true, removeVolumes: true }));
    return;
  }
  await new Promise<void>((done, fail) => {
    const child = spawn(bin, ["migrate"], { env: workerEnv(stack, options, false), stdio: ["ignore", "pipe", "pipe"] });
    const timer = setTimeout(() => child.kill("SIGKILL"), Math.max(1_000, deadline.left()));
    const forget = deadline.onAbandon(() => child.kill("SIGKILL"));
    child.stdout.on("data", (d: Buffer) => stack.book.add("worker migrate", d.toString()));
    child.stderr.on("data", (d: Buffer) => stack.book.add("worker migrate", d.toString()));
    child.on("error", (error) => {
      clearTimeout(timer);
      forget();
      fail(new Error(`cannot run ${bin} (set LTM_WORKER_BIN or the workerBin option): ${error.message}`));
    });
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      forget();
      if (code === 0) done();
      else fail(new Error(deadline.abandoned ? `${bin} migrate stopped: another step failed` : `${bin} migrate exited with ${code ?? signal}`));
    });
  });
}

let shared: Promise<LtmStack> | null = null;

/**
 * Use a stack another process started (its describe(), e.g. from LTM_STACK): newShard(), seed() and the URLs
 * work; stop() leaves the stack running for its owner. Checks that the broker and Postgres answer.
 */
export async function attachLtmStack(description: string): Promise<LtmStack> {
  const parsed = JSON.parse(description) as StackDescription;
  const stack = new RunningStack();
  Object.assign(stack, parsed, { owned: false });
  stack.pg = (await optionalPeer<{ default: Pg }>("pg")).default;
  const overview = await stack.management.request("GET", "/api/overview").catch((error: Error) => error);
  if (overview instanceof Error || !overview.ok) {
    const why = overview instanceof Error ? overview.message : `HTTP ${overview.status}`;
    throw new Error(`the stack ${parsed.id} of LTM_STACK does not answer (${why}): has its owner stopped it?`);
  }
  return stack;
}

/**
 * One stack per test process, started by the first call and reused by every later one (the options of the
 * first call count). It stops by itself when the process has nothing left to do (`beforeExit`), or call
 * stopLtmStack() in an `after` hook. With LTM_STACK set (`ltm-stack -- node --test`, a global setup), every
 * process attaches to that one stack instead. A start that failed is remembered: every later call rejects at
 * once with the same error (a file's other tests fail in milliseconds instead of starting again each), until
 * stopLtmStack() forgets it.
 */
export function getLtmStack(options: LtmStackOptions = {}): Promise<LtmStack> {
  if (shared === null) {
    const description = process.env.LTM_STACK?.trim();
    shared = description ? attachLtmStack(description) : startLtmStack(options);
    // kept when it rejects: the callers see the rejection; this only keeps it from counting as unhandled
    shared.catch(() => {});
    process.once("beforeExit", () => {
      void stopLtmStack();
    });
  }
  return shared;
}

/** Stop the stack of getLtmStack(), if one was started; a failed start is forgotten (the next call starts anew). */
export async function stopLtmStack(): Promise<void> {
  const current = shared;
  shared = null;
  if (current === null) return;
  const stack = await current.catch(() => null);
  await stack?.stop();
}

/**
 * Why no container engine can be used here (testcontainers finds none, or testcontainers is not installed), or
 * null when one answers: for a test that skips without Docker, e.g. `test("...", { skip: await
 * containerEngineProblem() ?? false }, ...)`.
 */
export async function containerEngineProblem(timeoutMs = 20_000): Promise<string | null> {
  let timer: NodeJS.Timeout | undefined;
  try {
    const tc = await optionalPeer<Testcontainers>("testcontainers");
    const timeout = new Promise<never>((_, fail) => {
      timer = setTimeout(() => fail(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
      timer.unref();
    });
    await Promise.race([tc.getContainerRuntimeClient(), timeout]);
    return null;
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  } finally {
    clearTimeout(timer);
  }
}
