// `worker <args>` as a child process with its output in a log file: the one worker process of the kit. The
// stack (stack.ts) starts `worker run` with it for a shard's tests; the kit's own tests (test/harness.ts) start
// theirs with it too and read its JSON log lines.
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync } from "node:fs";

import { sleep } from "./wait.js";

/** How much of the log an error message quotes. */
const TAIL_CHARS = 3000;

/**
 * A `worker` child (`run --log-format json` unless told) in a process group of its own, so a stop reaches the
 * worker and nothing else; stdout and stderr appended to `logPath`.
 */
export class WorkerProcess {
  private child: ChildProcess | null = null;
  private exited: number | null = null;

  constructor(
    readonly bin: string,
    readonly env: NodeJS.ProcessEnv,
    readonly logPath: string,
    readonly args: readonly string[] = ["run", "--log-format", "json"],
  ) {}

  /** Start the child; `unref`: the parent may end while it runs (whoever started it stops it). */
  start({ unref = false }: { unref?: boolean } = {}): this {
    const fd = openSync(this.logPath, "a");
    this.exited = null;
    const child = spawn(this.bin, [...this.args], { env: this.env, stdio: ["ignore", fd, fd], detached: true });
    closeSync(fd);
    child.on("error", () => {
      this.exited = this.exited ?? 127; // not found, not executable
    });
    child.on("exit", (code, signal) => {
      this.exited = code ?? (signal === null ? -1 : 128);
    });
    if (unref) child.unref();
    this.child = child;
    return this;
  }

  /** The exit code once the child has ended (128 after a signal), else null. */
  get exitCode(): number | null {
    return this.exited;
  }

  alive(): boolean {
    return this.child?.pid !== undefined && this.exited === null;
  }

  /** The JSON log lines written so far (other lines skipped). */
  lines(): Array<Record<string, unknown>> {
    if (!existsSync(this.logPath)) return [];
    const out: Array<Record<string, unknown>> = [];
    for (const raw of readFileSync(this.logPath, "utf8").split("\n")) {
      try {
        const line: unknown = JSON.parse(raw);
        if (typeof line === "object" && line !== null) out.push(line as Record<string, unknown>);
      } catch {
        // not a JSON line
      }
    }
    return out;
  }

  count(event: string): number {
    return this.lines().filter((line) => line.event === event).length;
  }

  /** Wait until the log has `atLeast` lines with this `event`; fails at once when the child exits first. */
  async waitForLog(event: string, atLeast = 1, timeoutMs = 30_000): Promise<void> {
    const end = Date.now() + timeoutMs;
    while (this.count(event) < atLeast) {
      if (this.exited !== null) throw new Error(`worker exited (${this.exited}) before logging ${event}:\n${this.tail()}`);
      if (Date.now() > end) throw new Error(`worker did not log "${event}" x${atLeast} within ${timeoutMs} ms:\n${this.tail()}`);
      await sleep(50);
    }
  }

  /** The end of the log, for an error message. */
  tail(): string {
    return existsSync(this.logPath) ? readFileSync(this.logPath, "utf8").slice(-TAIL_CHARS) : "";
  }

  /** SIGTERM (the worker finishes what it holds), SIGKILL after `graceMs`; the exit code. */
  async stop(graceMs = 30_000): Promise<number | null> {
    if (this.alive()) {
      this.child?.kill("SIGTERM");
      const end = Date.now() + graceMs;
      while (this.alive() && Date.now() < end) await sleep(50);
      this.kill();
      while (this.child !== null && this.exited === null && Date.now() < end + 5_000) await sleep(20);
    }
    return this.exited;
  }

  /** SIGKILL the process group (no cleanup, as a crash). */
  kill(): void {
    const pid = this.child?.pid;
    if (pid !== undefined && this.exited === null) {
      try {
        process.kill(-pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
  }
}
