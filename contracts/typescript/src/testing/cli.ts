#!/usr/bin/env node
// ltm-stack -- <command...>: start one LTM stack, run the command with LTM_STACK describing it (getLtmStack() in
// every test process then attaches to it instead of starting its own), stop the stack, exit with the command's
// status. `ltm-stack -- node --test` shares one stack among all test files of a run.
import { spawn } from "node:child_process";

import { startLtmStack } from "./stack.js";

const separator = process.argv.indexOf("--");
const command = separator === -1 ? process.argv.slice(2) : process.argv.slice(separator + 1);
if (command.length === 0 || command[0] === undefined) {
  console.error("usage: ltm-stack -- <command> [args...]   (e.g. ltm-stack -- node --test)");
  process.exit(2);
}
const workers = Number.parseInt(process.env.LTM_STACK_WORKERS ?? "1", 10);
const started = Date.now();
// A signal while the stack starts: exit through process.exit, so the stack's exit hook removes the containers
// and workers started so far (a signal's default action would end the process without running it).
const quit = (signal: NodeJS.Signals) => () => {
  console.error(`ltm-stack: ${signal} while the stack was starting; removing what it started`);
  process.exit(signal === "SIGINT" ? 130 : 143);
};
process.once("SIGINT", quit("SIGINT"));
process.once("SIGTERM", quit("SIGTERM"));
const stack = await startLtmStack({ workers: Number.isInteger(workers) && workers > 0 ? workers : 1 });
console.error(`ltm-stack: stack ${stack.id} ready in ${Date.now() - started} ms`);
process.removeAllListeners("SIGINT");
process.removeAllListeners("SIGTERM");
const child = spawn(command[0], command.slice(1), { stdio: "inherit", env: { ...process.env, LTM_STACK: stack.describe() } });
const forward = (signal: NodeJS.Signals) => () => child.kill(signal);
process.on("SIGINT", forward("SIGINT"));
process.on("SIGTERM", forward("SIGTERM"));
const status = await new Promise<number>((done) => {
  child.on("error", (error) => {
    console.error(`ltm-stack: cannot run ${command[0]}: ${error.message}`);
    done(127);
  });
  child.on("exit", (code, signal) => done(code ?? (signal === null ? 1 : 128)));
});
await stack.stop();
process.exit(status);
