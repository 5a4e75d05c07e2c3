// `npm test`'s test run: one template database migrated by `worker migrate` for the whole run (its name in
// LTM_TS_TEMPLATE_DB; every Stack of test/harness.ts is a copy of it), then Node's test runner over every
// build/test/*.test.js with the arguments given here, then the template dropped. Exits with the runner's code.
import { spawn } from "node:child_process";
import { readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { createTemplateDatabase, dropDatabase } from "./harness.js";

const here = dirname(fileURLToPath(import.meta.url));
const files = readdirSync(here)
  .filter((name) => name.endsWith(".test.js"))
  .sort()
  .map((name) => join(here, name));

const template = await createTemplateDatabase();
let code = 1;
try {
  code = await new Promise<number>((done, fail) => {
    const child = spawn(process.execPath, ["--test", ...process.argv.slice(2), ...files], {
      stdio: "inherit",
      env: { ...process.env, LTM_TS_TEMPLATE_DB: template },
    });
    child.on("error", fail);
    child.on("exit", (status, signal) => done(status ?? (signal === null ? 1 : 128)));
  });
} finally {
  await dropDatabase(template).catch((error: unknown) => {
    console.error(`the template database ${template} was not dropped:`, error);
  });
}
process.exit(code);
