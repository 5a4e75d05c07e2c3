// `ltm-stack -- node --test ...`: one stack for every test file of a run. Each file's getLtmStack() attaches to it
// through LTM_STACK (one id in both files), a save works through it, and the stack is gone afterwards. Skipped
// without a Docker engine, unless LTM_REQUIRE_DOCKER=1 (CI), which makes that a failure.
import assert from "node:assert/strict";
import { execFile, execFileSync, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { REDIS_IMAGE, STACK_LABEL, containerEngineProblem, resolveImage } from "../src/testing/index.js";
import { PACKAGE_ROOT, workerBin } from "./harness.js";

const run = promisify(execFile);

const problem = await containerEngineProblem();
const required = process.env.LTM_REQUIRE_DOCKER === "1";
const skip = problem !== null && !required ? `no Docker engine answers (${problem}); LTM_REQUIRE_DOCKER=1 makes this a failure` : false;

/** A shard's test file: attaches, saves a memory through its own shard, prints the stack's id. */
const SHARD_TEST = `
import assert from "node:assert/strict";
import { test } from "node:test";
import { LtmClient } from "@tomoribot/ltm-client";
import { getLtmStack } from "@tomoribot/ltm-client/testing";

test("a save through the run's stack", async (t) => {
  const started = Date.now();
  const stack = await getLtmStack();
  const shard = await stack.newShard();
  const world = await stack.seed();
  t.diagnostic("attached " + (Date.now() - started) + " ms");
  assert.equal(stack.owned, false);
  const ltm = await LtmClient.connect({ url: shard.amqpUrl, shardId: shard.shardId });
  try {
    const result = await ltm.createMemory({
      toolCallId: "call_shared",
      arguments: { memory_content: "{user} likes sharing", memory_scope: "server_wide" },
      context: world.context(),
    });
    assert.equal(result.status, "memory_saved_successfully");
  } finally {
    await ltm.close();
    await stack.stop(); // attached: leaves the stack to ltm-stack
  }
  console.log("stack-id " + stack.id);
});
`;

test("ltm-stack -- node --test: both files attach to one stack, which is removed at the end", { skip }, async (t) => {
  if (problem !== null) throw new Error(`LTM_REQUIRE_DOCKER=1, but no Docker engine answers: ${problem}`);
  mkdirSync(join(PACKAGE_ROOT, "build"), { recursive: true });
  const dir = mkdtempSync(join(PACKAGE_ROOT, "build", "shared-"));
  try {
    for (const name of ["a.test.mjs", "b.test.mjs"]) writeFileSync(join(dir, name), SHARD_TEST);
    const env: NodeJS.ProcessEnv = { ...process.env, LTM_WORKER_BIN: workerBin() };
    delete env.NODE_TEST_CONTEXT;
    delete env.LTM_STACK;
    const cli = join(PACKAGE_ROOT, "dist/testing/cli.js");
    const { stdout, stderr } = await run(
      process.execPath,
      [cli, "--", process.execPath, "--test", "--test-reporter=tap", join(dir, "a.test.mjs"), join(dir, "b.test.mjs")],
      { cwd: PACKAGE_ROOT, env, timeout: 300_000 },
    ).catch((error: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`ltm-stack failed: ${error.message}\n${error.stdout ?? ""}${error.stderr ?? ""}`);
    });
    t.diagnostic(stderr.trim());
    for (const line of stdout.split("\n").filter((l) => /attached \d+ ms/.test(l))) t.diagnostic(line.trim());
    assert.match(stdout, /^# pass 2$/m, stdout);
    const ids = [...stdout.matchAll(/stack-id (ltm-[0-9a-f]+)/g)].map((m) => m[1]);
    assert.equal(ids.length, 2, stdout);
    assert.equal(ids[0], ids[1], "the two files used different stacks");
    const left = execFileSync("docker", ["ps", "-a", "-q", "--filter", `label=${STACK_LABEL}=${String(ids[0])}`], { encoding: "utf8" });
    assert.equal(left.trim(), "", "ltm-stack left the stack's containers behind");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("SIGTERM to ltm-stack while the stack starts: it exits 143 and removes what it had started", { skip }, async () => {
  if (problem !== null) throw new Error(`LTM_REQUIRE_DOCKER=1, but no Docker engine answers: ${problem}`);
  // Redis from a tag of this test's own, so its containers are told apart from other tests' stacks
  const probe = `ltm-sigterm-probe:${process.pid}`;
  execFileSync("docker", ["tag", resolveImage(REDIS_IMAGE), probe]);
  const env: NodeJS.ProcessEnv = { ...process.env, LTM_WORKER_BIN: workerBin(), LTM_REDIS_IMAGE: probe };
  delete env.NODE_TEST_CONTEXT;
  delete env.LTM_STACK;
  const cli = spawn(process.execPath, [join(PACKAGE_ROOT, "dist/testing/cli.js"), "--", process.execPath, "-e", ""], { env, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  cli.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | null>((done) => cli.on("exit", (code) => done(code)));
  try {
    let stackId = "";
    for (let waited = 0; stackId === "" && waited < 120_000; waited += 100) {
      // by the image name the container was created with (an ancestor filter would match the image's other tags)
      const rows = execFileSync("docker", ["ps", "-a", "--filter", `label=${STACK_LABEL}`, "--format", `{{.Image}}\t{{.Label "${STACK_LABEL}"}}`], { encoding: "utf8" });
      stackId = rows.split("\n").find((row) => row.startsWith(`${probe}\t`))?.split("\t")[1] ?? "";
      if (stackId === "") await new Promise((r) => setTimeout(r, 100));
    }
    assert.notEqual(stackId, "", `no container from ${probe} within 120 s: ${stderr}`);
    // all three created (a create still in flight at the signal could land after the exit hook's removal)
    const ours = () => execFileSync("docker", ["ps", "-a", "-q", "--filter", `label=${STACK_LABEL}=${stackId}`], { encoding: "utf8" }).trim();
    for (let waited = 0; ours().split("\n").length < 3 && waited < 120_000; waited += 100) await new Promise((r) => setTimeout(r, 100));
    cli.kill("SIGTERM");
    assert.equal(await exited, 143, stderr);
    assert.match(stderr, /SIGTERM while the stack was starting/);
    assert.equal(ours(), "", `ltm-stack left stack ${stackId}'s containers behind`);
  } finally {
    cli.kill("SIGKILL");
    await run("docker", ["rmi", probe]).catch(() => {});
  }
});
