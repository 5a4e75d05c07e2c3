// docs/testing-your-shard.md, "## TypeScript": its code block, as written, compiled with the page's own
// `npx tsc` flags against the built package and run with `node --test` (it starts its own stack). Skipped without a Docker engine, unless
// LTM_REQUIRE_DOCKER=1 (CI), which makes that a failure.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { containerEngineProblem } from "../src/testing/index.js";
import { PACKAGE_ROOT, REPO_ROOT, workerBin } from "./harness.js";

const run = promisify(execFile);

/** The first ```ts block of docs/testing-your-shard.md's "## TypeScript". */
export function readmeExample(page: string): string {
  const typescript = page.split(/^## /m).find((part) => part.startsWith("TypeScript\n"));
  assert.ok(typescript, 'docs/testing-your-shard.md has no "## TypeScript"');
  const block = /^```ts\n([\s\S]*?)^```$/m.exec(typescript);
  assert.ok(block?.[1], 'no ```ts block in "## TypeScript"');
  return block[1];
}

/** The flags of the page's `npx tsc ... --outDir build stack.test.ts` line (the same section), without the output and file. */
export function readmeTscFlags(readme: string): string[] {
  const line = /^npx tsc (.*) --outDir build stack\.test\.ts$/m.exec(readme);
  assert.ok(line?.[1], 'no "npx tsc ... --outDir build stack.test.ts" line in docs/testing-your-shard.md');
  return line[1].split(" ");
}

const problem = await containerEngineProblem();
const required = process.env.LTM_REQUIRE_DOCKER === "1";
const skip = problem !== null && !required ? `no Docker engine answers (${problem}); LTM_REQUIRE_DOCKER=1 makes this a failure` : false;

test("docs/testing-your-shard.md's TypeScript example type-checks and passes as written", { skip }, async (t) => {
  if (problem !== null) throw new Error(`LTM_REQUIRE_DOCKER=1, but no Docker engine answers: ${problem}`);
  const readme = readFileSync(join(REPO_ROOT, "docs", "testing-your-shard.md"), "utf8");
  const example = readmeExample(readme);
  // inside the package, so "@tomoribot/ltm-client" and ".../testing" resolve to it through its exports (dist/)
  mkdirSync(join(PACKAGE_ROOT, "build"), { recursive: true });
  const dir = mkdtempSync(join(PACKAGE_ROOT, "build", "readme-"));
  try {
    const source = join(dir, "shard.test.ts");
    writeFileSync(source, example);
    const tsc = join(PACKAGE_ROOT, "node_modules/typescript/bin/tsc");
    const flags = readmeTscFlags(readme); // the README's own compile line
    await run(process.execPath, [tsc, ...flags, "--rootDir", dir, "--outDir", dir, source], { cwd: PACKAGE_ROOT }).catch((error: { stdout?: string; message: string }) => {
      throw new Error(`the README example does not type-check: ${error.stdout ?? error.message}`);
    });
    const started = Date.now();
    // as a shard's own run: not a child of this test runner (NODE_TEST_CONTEXT would make it report to us)
    const env: NodeJS.ProcessEnv = { ...process.env, LTM_WORKER_BIN: workerBin() };
    delete env.NODE_TEST_CONTEXT;
    const { stdout } = await run(process.execPath, ["--test", "--test-reporter=tap", join(dir, "shard.test.js")], {
      cwd: PACKAGE_ROOT,
      env,
      timeout: 300_000,
    }).catch((error: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`the README example failed: ${error.message}\n${error.stdout ?? ""}${error.stderr ?? ""}`);
    });
    t.diagnostic(`the docs example ran in ${Date.now() - started} ms (its stack's start included)`);
    assert.match(stdout, /^# pass 1$/m, stdout);
    assert.match(stdout, /^# fail 0$/m, stdout);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
