// Measures @tomoribot/ltm-client/testing (docs/testing-your-shard.md): the whole stack's start (images present),
// a later test's reuse (newShard() + seed()), and, for the isolation decision, what a vhost + database + worker
// per test would cost instead (vhost with the definitions, CREATE DATABASE, worker migrate, worker run consuming).
//
//   npm run build && node scripts/stack-times.mjs [rounds=3]      (Docker engine; LTM_WORKER_BIN or worker on PATH)
import { spawn, execFile } from "node:child_process";
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

import * as amqp from "amqplib";
import pg from "pg";

import { RABBITMQ_DEFINITIONS } from "../dist/generated/rabbitmq_definitions.js";
import { startLtmStack } from "../dist/testing/index.js";

const run = promisify(execFile);
const rounds = Number.parseInt(process.argv[2] ?? "3", 10);
const workerBin = process.env.LTM_WORKER_BIN ?? "worker";
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

/** A vhost with the contract's definitions, a migrated database and one `worker run` consuming: one test's own. */
async function isolatedPerTest(stack, n) {
  const d = JSON.parse(stack.describe());
  const vhost = `per-test-${n}`;
  const database = `per_test_${n}`;
  const auth = `Basic ${Buffer.from(`${d.rabbitAdmin.user}:${d.rabbitAdmin.password}`).toString("base64")}`;
  const api = (method, path, body) =>
    fetch(`http://${d.host}:${d.managementPort}${path}`, {
      method,
      headers: { authorization: auth, "content-type": "application/json" },
      body: body === undefined ? null : JSON.stringify(body),
    }).then(async (r) => {
      if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
    });
  const t0 = performance.now();
  await api("PUT", `/api/vhosts/${vhost}`);
  const definitions = { ...RABBITMQ_DEFINITIONS, vhosts: [{ name: vhost }] };
  for (const key of ["permissions", "topic_permissions", "policies", "exchanges", "queues", "bindings"]) {
    definitions[key] = RABBITMQ_DEFINITIONS[key].map((item) => ({ ...item, vhost }));
  }
  await api("POST", "/api/definitions", definitions);
  const t1 = performance.now();
  const admin = new pg.Client({ connectionString: d.postgresDsn });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${database}`);
  await admin.end();
  const dsn = d.postgresDsn.replace(/\/[^/]+$/, `/${database}`);
  const env = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    LTM_POSTGRES_DSN: dsn,
    LTM_RABBITMQ_URL: `amqp://worker:worker-dev-password@${d.host}:${d.amqpPort}/${vhost}`,
    LTM_REDIS_URL: d.redisUrl,
    LTM_LOG_FORMAT: "json",
  };
  await run(workerBin, ["migrate"], { env });
  const t2 = performance.now();
  const dir = mkdtempSync(join(tmpdir(), "ltm-stack-times-"));
  const log = join(dir, "worker.log");
  const fd = openSync(log, "a");
  const child = spawn(workerBin, ["run"], { env, stdio: ["ignore", fd, fd] });
  closeSync(fd);
  const adminUrl = `amqp://${d.rabbitAdmin.user}:${d.rabbitAdmin.password}@${d.host}:${d.amqpPort}/${vhost}`;
  for (;;) {
    if (/"event": ?"consuming"/.test(readFileSync(log, "utf8"))) {
      const connection = await amqp.connect(adminUrl);
      const { consumerCount } = await (await connection.createChannel()).checkQueue("ltm.create_memory");
      await connection.close();
      if (consumerCount > 0) break;
    }
    if (child.exitCode !== null) throw new Error(`worker exited: ${readFileSync(log, "utf8")}`);
    await sleep(50);
  }
  const t3 = performance.now();
  child.kill("SIGTERM");
  await new Promise((done) => child.once("exit", done));
  rmSync(dir, { recursive: true, force: true });
  return { vhost: t1 - t0, databaseAndMigrate: t2 - t1, workerConsuming: t3 - t2, total: t3 - t0 };
}

const starts = [];
const reuses = [];
const perTest = [];
for (let round = 0; round < rounds; round += 1) {
  const t0 = performance.now();
  const stack = await startLtmStack({ workerBin });
  const start = performance.now() - t0;
  starts.push(start);
  console.log(`round ${round + 1}: start ${(start / 1000).toFixed(1)} s ${JSON.stringify(stack.timings)}`);
  try {
    const mine = [];
    for (let i = 0; i < 10; i += 1) {
      const t1 = performance.now();
      await stack.newShard();
      await stack.seed();
      mine.push(performance.now() - t1);
    }
    reuses.push(...mine);
    console.log(`round ${round + 1}: reuse (newShard + seed) median ${median(mine).toFixed(0)} ms, max ${Math.max(...mine).toFixed(0)} ms`);
    const isolated = await isolatedPerTest(stack, round);
    perTest.push(isolated.total);
    console.log(
      `round ${round + 1}: a vhost + database + worker per test instead: ${(isolated.total / 1000).toFixed(1)} s ` +
        `(vhost ${isolated.vhost.toFixed(0)} ms, database + migrate ${isolated.databaseAndMigrate.toFixed(0)} ms, ` +
        `worker consuming ${isolated.workerConsuming.toFixed(0)} ms)`,
    );
  } finally {
    await stack.stop();
  }
}
console.log(
  `summary over ${rounds} round(s): start median ${(median(starts) / 1000).toFixed(1)} s (min ${(Math.min(...starts) / 1000).toFixed(1)}, ` +
    `max ${(Math.max(...starts) / 1000).toFixed(1)}); reuse median ${median(reuses).toFixed(0)} ms (max ${Math.max(...reuses).toFixed(0)}); ` +
    `vhost + database + worker per test median ${(median(perTest) / 1000).toFixed(1)} s`,
);
