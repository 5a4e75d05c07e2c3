// The round trip against @tomoribot/ltm-client/testing: startLtmStack's containers (RabbitMQ with the contract's
// definitions, Postgres migrated, Redis) and `worker run`, as a shard's own test would use them. Skipped when no
// Docker engine answers, unless LTM_REQUIRE_DOCKER=1 (CI), which makes that a failure. Prints the start and
// reuse times as diagnostics (`# ...` lines).
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { pathToFileURL } from "node:url";

import * as amqp from "amqplib";
import { Redis } from "ioredis";
import pg from "pg";

import {
  InvalidationSubscriber,
  LtmClient,
  invalidationIdOf,
  type Notification,
  type ServerStateInvalidation,
  type UserInvalidation,
} from "../src/index.js";
import {
  LtmStackStartError,
  STACK_LABEL,
  containerEngineProblem,
  getLtmStack,
  startLtmStack,
  stopLtmStack,
  type LtmStack,
  WORKER_IMAGE,
} from "../src/testing/index.js";
import { Inbox, PACKAGE_ROOT, waitFor, workerBin } from "./harness.js";
import { callId } from "./kit.js";

const problem = await containerEngineProblem();
const required = process.env.LTM_REQUIRE_DOCKER === "1";
const skip = problem !== null && !required ? `no Docker engine answers (${problem}); LTM_REQUIRE_DOCKER=1 makes this a failure` : false;

function engineOrFail(): void {
  if (problem !== null) throw new Error(`LTM_REQUIRE_DOCKER=1, but no Docker engine answers: ${problem}`);
}

/** The ids of the containers (running or not) of the stack `id`. */
function containersOf(id: string): string[] {
  const out = execFileSync("docker", ["ps", "-a", "-q", "--filter", `label=${STACK_LABEL}=${id}`], { encoding: "utf8" });
  return out.split("\n").filter((line) => line !== "");
}

/** The stack of this file, started by its first test (what a shard's own tests do: getLtmStack()). */
function stack(): Promise<LtmStack> {
  return getLtmStack({ workerBin: workerBin(), startTimeoutMs: 180_000 });
}

after(async () => {
  await stopLtmStack();
});

test("startLtmStack: a server-wide and a personal save as shard-0 of the definitions: results, notices, invalidations", { skip }, async (t) => {
  engineOrFail();
  const started = Date.now();
  const ltm = await stack();
  t.diagnostic(`stack started in ${Date.now() - started} ms: ${JSON.stringify(ltm.timings)}`);
  const world = await ltm.seed();

  const states = new Inbox<ServerStateInvalidation>();
  const users = new Inbox<UserInvalidation>();
  const invalidations = await InvalidationSubscriber.start({ url: ltm.redisUrl, onServerState: states.push, onUser: users.push });
  const notices = new Inbox<Notification>();
  // shard-0 with its password of deploy/rabbitmq/definitions.json: the client may do only what a shard may
  const client = await LtmClient.connect({ url: ltm.amqpUrl, shardId: ltm.shardId, onNotice: notices.push, timeoutMs: 60_000 });
  const db = new pg.Client({ connectionString: ltm.postgresDsn });
  await db.connect();
  try {
    const server = await client.createMemory({
      toolCallId: callId(),
      arguments: { memory_content: "{user} likes dogs", memory_scope: "server_wide" },
      context: world.context(),
    });
    const personal = await client.createMemory({
      toolCallId: callId(),
      arguments: { memory_content: "{user} likes cats", memory_scope: "target_user", target_user: world.member.label },
      context: world.context(),
    });
    assert.equal(server.status, "memory_saved_successfully");
    assert.equal(server.replayed, false);
    assert.equal(server.data.scope, "server_wide");
    const row = await db.query("SELECT content FROM server_memories WHERE server_memory_id = $1 AND server_id = $2", [
      server.data.memory_id,
      world.serverId,
    ]);
    assert.deepEqual(row.rows, [{ content: "{user} likes dogs" }]);
    assert.equal(personal.status, "memory_saved_successfully");
    assert.ok("target_user" in personal.data);
    assert.equal(personal.data.target_user, "Sparrow");

    const serverNotice = await notices.waitFor("the server-wide save's notice", (n) => n.event_id === server.event_id);
    assert.equal(serverNotice.notice.kind, "server_memory");
    const personalNotice = await notices.waitFor("the personal save's notice", (n) => n.event_id === personal.event_id);
    assert.equal(personalNotice.notice.kind, "personal_memory");

    const state = await states.waitFor("tomori_state invalidation", (m) => m.invalidation_id === invalidationIdOf(server.event_id));
    assert.equal(state.server_disc_id, world.guildId);
    const user = await users.waitFor("user invalidation", (m) => m.invalidation_id === invalidationIdOf(personal.event_id));
    assert.equal(user.user_disc_id, world.member.userId);
    assert.equal(notices.items.length, 2);
  } finally {
    await db.end();
    await client.close();
    await invalidations.close();
  }
});

test("a second test reuses the stack: a shard and a guild of its own, its save answered to it alone", { skip }, async (t) => {
  engineOrFail();
  const first = await stack(); // started by the first test (or here, when run alone)
  const reused = Date.now();
  const ltm = await stack();
  const shard = await ltm.newShard();
  const world = await ltm.seed();
  t.diagnostic(`a second test's getLtmStack() + newShard() + seed(): ${Date.now() - reused} ms`);
  assert.equal(ltm, first, "getLtmStack() hands every test the same stack");
  assert.notEqual(shard.shardId, ltm.shardId);

  const notices = new Inbox<Notification>();
  const other = new Inbox<Notification>();
  const client = await LtmClient.connect({ url: shard.amqpUrl, shardId: shard.shardId, onNotice: notices.push, timeoutMs: 60_000 });
  // shard-0, connected meanwhile, receives nothing of this shard's save
  const bystander = await LtmClient.connect({ url: ltm.amqpUrl, shardId: ltm.shardId, onNotice: other.push });
  try {
    const result = await client.createMemory({
      toolCallId: callId(),
      arguments: { memory_content: "{user} likes isolation", memory_scope: "server_wide" },
      context: world.context(),
    });
    assert.equal(result.status, "memory_saved_successfully");
    const notice = await notices.waitFor("the notice", (n) => n.event_id === result.event_id);
    assert.equal(notice.guild_disc_id, world.guildId);
    // the new user is a shard's: another shard's queue is refused
    await assert.rejects(
      LtmClient.connect({
        url: shard.amqpUrl,
        shardId: ltm.shardId,
        logger: { debug() {}, info() {}, warn() {}, error() {} },
        reconnect: { initialDelayMs: 50, maxDelayMs: 100, startupRetries: 1 },
      }),
      /ACCESS_REFUSED/,
    );
  } finally {
    await client.close();
    await bystander.close();
  }
  assert.equal(other.items.length, 0, "shard-0 got a notice of another shard's save");
});

test("what the stack exposes: ports on 127.0.0.1, no development password, Redis users that confine a shard, the shard's own key", { skip }, async () => {
  engineOrFail();
  const ltm = await stack();
  // every port asked to be published on the loopback address (security review 4, N12: a stock engine publishes
  // on every interface); the request, not the result, which an engine run with --ip 127.0.0.1 narrows anyway
  const ports = execFileSync("docker", ["ps", "-q", "--filter", `label=${STACK_LABEL}=${ltm.id}`], { encoding: "utf8" })
    .split("\n")
    .filter((id) => id !== "")
    .flatMap((id) => {
      const info = JSON.parse(execFileSync("docker", ["inspect", "--format", "{{json .HostConfig.PortBindings}}", id], { encoding: "utf8" })) as Record<
        string,
        Array<{ HostIp: string; HostPort: string }> | null
      >;
      return Object.values(info).flatMap((bindings) => bindings ?? []);
    });
  assert.equal(ports.length, 4, JSON.stringify(ports)); // AMQP, management, Postgres, Redis
  assert.deepEqual([...new Set(ports.map((p) => p.HostIp))], ["127.0.0.1"]);

  // the definitions' development passwords do not log in; the stack's own do
  const devUrl = new URL(ltm.amqpUrl);
  assert.notEqual(devUrl.password, "shard-0-dev-password");
  devUrl.password = "shard-0-dev-password";
  await assert.rejects(amqp.connect(devUrl.toString()), /ACCESS[-_]REFUSED|403/);
  const shard = await ltm.newShard();
  assert.notEqual(new URL(shard.amqpUrl).password, `shard-${shard.shardId}-dev-password`);
  assert.equal(shard.redisUrl, ltm.redisUrl);

  // the shard's topic permission: tool.<name> and its own tool.<name>.shard.<id> (deploy/rabbitmq/shard_users.py's)
  const admin = new URL(ltm.adminAmqpUrl);
  const auth = Buffer.from(`${decodeURIComponent(admin.username)}:${decodeURIComponent(admin.password)}`).toString("base64");
  const response = await fetch(`${ltm.managementUrl}/api/users/shard-${shard.shardId}/topic-permissions`, { headers: { authorization: `Basic ${auth}` } });
  const topics = (await response.json()) as Array<{ exchange: string; write: string }>;
  assert.equal(topics.find((t) => t.exchange === "tomori.tool_calls")?.write, `^tool\\.[A-Za-z0-9_]+(\\.shard\\.${shard.shardId})?$`);

  // Redis: the shards' user subscribes and pings, and may neither publish nor read a key; no user, nothing
  const redis = new Redis(ltm.redisUrl, { lazyConnect: true, enableReadyCheck: false, maxRetriesPerRequest: 0 });
  try {
    await redis.connect();
    assert.equal(await redis.ping(), "PONG");
    await assert.rejects(redis.publish("tomori:cache-invalidation", "{}"), /NOPERM/);
    await assert.rejects(redis.get("any-key"), /NOPERM/);
  } finally {
    redis.disconnect();
  }
  const anonymousUrl = new URL(ltm.redisUrl);
  anonymousUrl.username = "";
  anonymousUrl.password = "";
  const anonymous = new Redis(anonymousUrl.toString(), { lazyConnect: true, enableReadyCheck: false, maxRetriesPerRequest: 0, retryStrategy: () => null });
  const refusals: string[] = [];
  anonymous.on("error", (error: Error) => refusals.push(error.message));
  try {
    // ioredis 6 opens with HELLO, which Redis refuses before a login: the connection fails
    await assert.rejects(anonymous.connect().then(() => anonymous.ping()));
    assert.ok(refusals.some((text) => /NOAUTH/.test(text)), refusals.join("; "));
  } finally {
    anonymous.disconnect();
  }
});

test("a step that fails while the others still wait ends the start, and the process, at once (newcomer review 4, F3)", { skip }, async (t) => {
  engineOrFail();
  // a `worker` whose migrate fails at once: the Postgres step fails while RabbitMQ's is still waiting for its boot
  mkdirSync(join(PACKAGE_ROOT, "build"), { recursive: true });
  const dir = mkdtempSync(join(PACKAGE_ROOT, "build", "stack-fails-"));
  const fake = join(dir, "worker");
  writeFileSync(fake, `#!/bin/sh\necho "fake worker: migrate refuses" >&2\nexit 3\n`);
  chmodSync(fake, 0o755);
  // a shard's test process of its own: it must end by itself once the start has failed, long before the deadline
  const script = join(dir, "start.mjs");
  writeFileSync(
    script,
    `import { startLtmStack } from ${JSON.stringify(pathToFileURL(join(PACKAGE_ROOT, "build/src/testing/index.js")).href)};
     const began = Date.now();
     try {
       await startLtmStack({ workerBin: ${JSON.stringify(fake)}, startTimeoutMs: 600_000 });
       console.log(JSON.stringify({ started: true }));
     } catch (error) {
       console.log(JSON.stringify({ ms: Date.now() - began, step: error.step, stackId: error.stackId, message: error.message.split("\\n")[0] }));
     }`,
  );
  try {
    const child = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"] });
    let output = "";
    let reported = 0;
    child.stdout.on("data", (chunk: Buffer) => {
      output += chunk.toString();
      reported ||= Date.now();
    });
    let code: number | null = null;
    child.on("exit", (exit) => {
      code = exit ?? -1;
    });
    try {
      // the deadline of the start is 600 s: a process that lives on waits for it (before the fix, 104 s past the error)
      await waitFor("the test process's exit", () => code !== null, 300_000);
    } finally {
      child.kill("SIGKILL");
    }
    const report = JSON.parse(output.trim()) as { ms: number; step: string; stackId: string; message: string };
    assert.equal(code, 0);
    assert.match(report.step, /Postgres/);
    assert.match(report.message, /migrate exited with 3/);
    t.diagnostic(`the start failed after ${report.ms} ms; the process exited ${Date.now() - reported} ms after that (or less)`);
    assert.deepEqual(containersOf(report.stackId), [], "the failed start left containers behind");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a start that fails within its deadline: LtmStackStartError with the containers' and the worker's logs, nothing left", { skip }, async () => {
  engineOrFail();
  // a `worker` whose `migrate` is the real one and whose `run` says something and exits
  const dir = mkdtempSync(join(tmpdir(), "ltm-stack-test-"));
  const fake = join(dir, "worker");
  writeFileSync(
    fake,
    `#!/bin/sh\nif [ "$1" = migrate ]; then exec "${workerBin()}" "$@"; fi\necho "fake worker: refusing to run" >&2\nexit 3\n`,
  );
  chmodSync(fake, 0o755);
  try {
    const error = await startLtmStack({ workerBin: fake, startTimeoutMs: 180_000 }).then(
      () => assert.fail("the stack started with a worker that exits"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof LtmStackStartError, String(error));
    assert.match(error.step, /worker/);
    assert.match(error.message, /worker-0 exited/);
    assert.match(error.logs, /fake worker: refusing to run/);
    assert.match(error.logs, /migrations applied/);
    assert.match(error.logs, /user 'shard-0' authenticated/); // RabbitMQ's container log (its readiness check)
    assert.match(error.logs, /ready to accept connections/i); // Postgres' and Redis' logs
    assert.deepEqual(containersOf(error.stackId), [], "the failed start left containers behind");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("an image that cannot start: the error names the image and its variable", { skip }, async () => {
  engineOrFail();
  const error = await startLtmStack({ workerBin: workerBin(), images: { redis: "ltm-ts-test/no-such-image:0" }, startTimeoutMs: 60_000 }).then(
    () => assert.fail("the stack started without a Redis image"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof LtmStackStartError, String(error));
  assert.match(error.message, /Redis from image ltm-ts-test\/no-such-image:0 did not start \(set LTM_REDIS_IMAGE/);
  assert.deepEqual(containersOf(error.stackId), [], "the failed start left containers behind");
});

/** The worker image workerImage: true runs, when the engine has it (built by `docker compose ... build`). */
function workerImagePresent(): string | null {
  const image = process.env.LTM_WORKER_IMAGE?.trim() || WORKER_IMAGE;
  try {
    execFileSync("docker", ["image", "inspect", image], { stdio: "ignore" });
    return image;
  } catch {
    return null;
  }
}

const workerImage = problem === null ? workerImagePresent() : null;
const imageWanted = `${process.env.LTM_WORKER_IMAGE?.trim() || WORKER_IMAGE} (docker compose -f deploy/compose.yaml build, or LTM_WORKER_IMAGE)`;
// LTM_REQUIRE_DOCKER=1 (CI, which builds the image first) makes a missing image a failure, as a missing engine
const imageSkip =
  skip ||
  (problem === null && workerImage === null && !required
    ? `no worker image ${imageWanted} on this engine; LTM_REQUIRE_DOCKER=1 makes this a failure`
    : false);

test("workerImage: two worker containers on the stack's network, a save answered", { skip: imageSkip }, async (t) => {
  engineOrFail();
  if (workerImage === null) throw new Error(`LTM_REQUIRE_DOCKER=1, but the engine has no worker image ${imageWanted}`);
  const own = await startLtmStack({ workerImage: true, workers: 2, startTimeoutMs: 180_000 });
  try {
    t.diagnostic(`stack with worker image ${String(workerImage)} started: ${JSON.stringify(own.timings)}`);
    const shard = await own.newShard();
    const world = await own.seed();
    const client = await LtmClient.connect({ url: shard.amqpUrl, shardId: shard.shardId, timeoutMs: 60_000 });
    try {
      const result = await client.createMemory({
        toolCallId: callId(),
        arguments: { memory_content: "{user} likes images", memory_scope: "server_wide" },
        context: world.context(),
      });
      assert.equal(result.status, "memory_saved_successfully");
    } finally {
      await client.close();
    }
    assert.match(own.logs(), /worker-1 \(/);
  } finally {
    await own.stop();
  }
  assert.deepEqual(containersOf(own.id), [], "stop() left containers behind");
});
