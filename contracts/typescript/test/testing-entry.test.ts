// @tomoribot/ltm-client/testing without containers: its image defaults are the worker's (worker/testing/images.py),
// the environment overrides them, the package's main entry loads neither testcontainers nor pg, the Redis users
// are deploy/redis/users.acl's, and a `worker` that cannot be found fails the start before anything starts.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { POSTGRES_IMAGE, RABBITMQ_IMAGE, REDIS_IMAGE, SERVICE_IMAGES, resolveImage } from "../src/testing/images.js";
import {
  LtmStackStartError,
  REDIS_USER_RULES,
  findWorkerBin,
  getLtmStack,
  publishAddressFor,
  startLtmStack,
  stopLtmStack,
} from "../src/testing/stack.js";
import { PACKAGE_ROOT, REPO_ROOT } from "./harness.js";

interface PythonImage {
  service: string;
  default: string;
  env_var: string;
}

/** worker/testing/images.py's IMAGES, read by Python itself (the module imports nothing of the worker). */
function pythonImages(): PythonImage[] {
  const script = [
    "import json, runpy, sys",
    "module = runpy.run_path(sys.argv[1])",
    "print(json.dumps([{'service': i.service, 'default': i.default, 'env_var': i.env_var} for i in module['IMAGES']]))",
  ].join("\n");
  const output = execFileSync(process.env.PYTHON ?? "python3", ["-c", script, join(REPO_ROOT, "worker/testing/images.py")], {
    encoding: "utf8",
  });
  return JSON.parse(output) as PythonImage[];
}

test("the kit's image defaults and variables are those of worker/testing/images.py", () => {
  const python = pythonImages();
  for (const image of SERVICE_IMAGES) {
    const same = python.find((p) => p.service === image.service);
    assert.ok(same, `worker/testing/images.py has no ${image.service} image`);
    assert.equal(image.default, same.default, `${image.service}'s default`);
    assert.equal(image.envVar, same.env_var, `${image.service}'s variable`);
  }
  // every service image of the worker is in the kit (the Python image is the worker image's base: not a service)
  const services = python.filter((p) => p.service !== "Python").map((p) => p.service).sort();
  assert.deepEqual(services, SERVICE_IMAGES.map((i) => i.service).sort());
});

test("an image variable overrides its default; unset or blank, the pinned default", () => {
  assert.equal(resolveImage(RABBITMQ_IMAGE, { LTM_RABBITMQ_IMAGE: "mirror.example/rabbitmq:3.13.7-management" }), "mirror.example/rabbitmq:3.13.7-management");
  assert.equal(resolveImage(POSTGRES_IMAGE, { LTM_POSTGRES_IMAGE: "  " }), POSTGRES_IMAGE.default);
  assert.equal(resolveImage(REDIS_IMAGE, {}), "redis:7.4.1");
});

test("the main entry loads neither testcontainers nor pg; the testing entry resolves through the package's exports", () => {
  // run from the package directory, so "@tomoribot/ltm-client" resolves to the package itself (its exports map)
  const script = `
    import { createRequire } from "node:module";
    const require = createRequire(import.meta.url);
    const loaded = (name) => Object.keys(require.cache).some((path) => path.includes("/node_modules/" + name + "/"));
    const main = await import("@tomoribot/ltm-client");
    const before = { testcontainers: loaded("testcontainers"), pg: loaded("pg"), client: typeof main.LtmClient };
    const testing = await import("@tomoribot/ltm-client/testing");
    await testing.containerEngineProblem(1);
    const after = { testcontainers: loaded("testcontainers"), startLtmStack: typeof testing.startLtmStack };
    console.log(JSON.stringify({ before, after }));
  `;
  const output = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: PACKAGE_ROOT, encoding: "utf8" });
  const { before, after } = JSON.parse(output) as {
    before: { testcontainers: boolean; pg: boolean; client: string };
    after: { testcontainers: boolean; startLtmStack: string };
  };
  assert.deepEqual(before, { testcontainers: false, pg: false, client: "function" });
  // the check can see testcontainers once something loads it
  assert.deepEqual(after, { testcontainers: true, startLtmStack: "function" });
});

test("the stack's Redis users have the rules of deploy/redis/users.acl", () => {
  const acl = readFileSync(join(REPO_ROOT, "deploy/redis/users.acl"), "utf8");
  const rules = new Map<string, string>();
  for (const line of acl.split("\n")) {
    const match = /^user (\S+) on #[0-9a-f]{64} (.*)$/.exec(line.trim());
    if (match?.[1] !== undefined && match[2] !== undefined) rules.set(match[1], match[2]);
  }
  assert.deepEqual(Object.fromEntries(rules), { ...REDIS_USER_RULES });
  assert.match(acl, /^user default off$/m);
});

test("the worker is found: the option, LTM_WORKER_BIN, PATH, then .venv/bin/worker here or one directory up", () => {
  const root = mkdtempSync(join(tmpdir(), "ltm-worker-bin-"));
  try {
    const make = (path: string) => {
      mkdirSync(join(path, ".."), { recursive: true });
      writeFileSync(path, "#!/bin/sh\n");
      chmodSync(path, 0o755);
      return path;
    };
    const shard = join(root, "shard");
    const nested = join(shard, "test");
    mkdirSync(nested, { recursive: true });
    const onPath = make(join(root, "bin", "worker"));
    const venv = make(join(shard, ".venv", "bin", "worker"));
    const given = make(join(root, "given", "worker"));
    assert.equal(findWorkerBin({ workerBin: given }, {}, shard), given);
    assert.equal(findWorkerBin({}, { LTM_WORKER_BIN: given, PATH: join(root, "bin") }, shard), given);
    assert.equal(findWorkerBin({}, { PATH: join(root, "bin") }, shard), onPath);
    assert.equal(findWorkerBin({}, { PATH: "" }, shard), venv);
    assert.equal(findWorkerBin({}, { PATH: "" }, nested), venv, "the shard's .venv from its test directory");
    assert.throws(() => findWorkerBin({}, { PATH: "" }, root), /cannot find the LTM worker's `worker` executable: .*LTM_WORKER_BIN=\/path\/to\/that\/repository\/\.venv\/bin\/worker/);
    assert.throws(() => findWorkerBin({}, { LTM_WORKER_BIN: join(root, "nothing") }, shard), /LTM_WORKER_BIN names .*nothing, which is not an executable file/);
    writeFileSync(join(root, "plain"), "");
    assert.throws(() => findWorkerBin({ workerBin: join(root, "plain") }, {}, shard), /the workerBin option names/);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test("a worker that cannot be found fails the start before any container or engine is asked for (newcomer review 4, F3 and F5)", async () => {
  const error = await startLtmStack({ workerBin: "/nonexistent/ltm/worker", startTimeoutMs: 600_000 }).then(
    () => assert.fail("the stack started without a worker"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof LtmStackStartError, String(error));
  assert.equal(error.step, "finding the worker");
  assert.match(error.message, /the workerBin option names \/nonexistent\/ltm\/worker, which is not an executable file/);
});

test("getLtmStack remembers a failed start: later calls reject at once with its error, until stopLtmStack", async () => {
  const attached = process.env.LTM_STACK;
  delete process.env.LTM_STACK;
  const failed = (promise: Promise<unknown>) => promise.then(() => assert.fail("the start succeeded"), (error: unknown) => error);
  try {
    const first = await failed(getLtmStack({ workerBin: "/nonexistent/ltm/first" }));
    assert.ok(first instanceof LtmStackStartError, String(first));
    assert.match(first.message, /\/nonexistent\/ltm\/first/);
    // a second start would look for this worker and name it: the same error object says none was made
    const second = await failed(getLtmStack({ workerBin: "/nonexistent/ltm/second" }));
    assert.equal(second, first);
    await stopLtmStack();
    const anew = await failed(getLtmStack({ workerBin: "/nonexistent/ltm/second" }));
    assert.ok(anew instanceof LtmStackStartError, String(anew));
    assert.notEqual(anew, first);
    assert.match(anew.message, /\/nonexistent\/ltm\/second/);
  } finally {
    await stopLtmStack();
    if (attached !== undefined) process.env.LTM_STACK = attached;
  }
});

test("ports are published on 127.0.0.1 for a loopback engine, or for a guessed host that is this machine's own address", async () => {
  for (const host of ["localhost", "127.0.0.1", "::1", "[::1]"]) {
    assert.equal(await publishAddressFor(host, { override: false }), "127.0.0.1", host);
    assert.equal(await publishAddressFor(host, { override: true }), "127.0.0.1", host);
  }
  // an address of an interface of this machine (a CI container's own docker0 gateway, which testcontainers guesses
  // where /.dockerenv exists; the CI run of 2026-12-05 published on every interface for it)
  const own = Object.values(networkInterfaces())
    .flatMap((addresses) => addresses ?? [])
    .find((a) => !a.internal && a.family === "IPv4");
  if (own !== undefined) {
    assert.equal(await publishAddressFor(own.address, { override: false }), "127.0.0.1", own.address);
    // an override names where the ports must answer: a port on 127.0.0.1 would not
    assert.equal(await publishAddressFor(own.address, { override: true }), "", own.address);
  }
  // an address no interface here has (TEST-NET-3): a remote engine, or a sibling container's gateway
  assert.equal(await publishAddressFor("203.0.113.7", { override: false }), "");
  assert.equal(await publishAddressFor("docker.example", { override: false }), "");
});
