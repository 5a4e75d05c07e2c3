// Waiting with one deadline: what the stack's start (stack.ts) counts every step down to, and what the kit's own
// tests (test/harness.ts) wait with. Polls what it waits for; a step that cannot succeed any more says so at once.

/** One point in time every wait of a start counts down to; `abandon()` ends them all early. */
export class Deadline {
  private readonly end: number;
  private readonly abandonHooks: Array<() => void> = [];
  /** another step failed: every wait on this deadline stops at its next look */
  abandoned = false;
  constructor(readonly ms: number) {
    this.end = Date.now() + ms;
  }
  left(): number {
    return Math.max(0, this.end - Date.now());
  }
  passed(): boolean {
    return Date.now() >= this.end;
  }
  abandon(): void {
    if (this.abandoned) return;
    this.abandoned = true;
    for (const hook of this.abandonHooks.splice(0)) hook();
  }
  /** Run `hook` when the start is abandoned (kill a child process); returns the way to take it back. */
  onAbandon(hook: () => void): () => void {
    this.abandonHooks.push(hook);
    return () => {
      const at = this.abandonHooks.indexOf(hook);
      if (at >= 0) this.abandonHooks.splice(at, 1);
    };
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** Thrown inside `until` to stop waiting at once (a worker that exited will not become ready). */
export class StopWaiting extends Error {}

/**
 * Steps that run at once: the first failure abandons the others (their waits stop at once), and this rejects
 * with it only when every step has settled, so nothing of a failed start runs on (a step still polling would
 * keep the process alive until the deadline).
 */
export async function allOrAbandon(deadline: Deadline, steps: Array<Promise<unknown>>): Promise<void> {
  let first: { error: unknown } | null = null;
  await Promise.allSettled(
    steps.map((step) =>
      step.catch((error: unknown) => {
        first ??= { error };
        deadline.abandon();
      }),
    ),
  );
  if (first !== null) throw (first as { error: unknown }).error;
}

/**
 * Retry `attempt` every `intervalMs` until it returns something other than false or undefined, and return that
 * (a thrown error counts as "not yet", except StopWaiting, which ends the wait); past the deadline, an error
 * naming `what` and the last error.
 */
export async function until<T>(
  what: string,
  deadline: Deadline,
  attempt: () => Promise<T | false | undefined> | T | false | undefined,
  intervalMs = 100,
): Promise<T> {
  let last = "";
  for (;;) {
    if (deadline.abandoned) throw new StopWaiting(`${what}: abandoned (another step failed)`);
    try {
      const value = await attempt();
      if (value !== false && value !== undefined) return value;
    } catch (error) {
      if (error instanceof StopWaiting) throw error;
      last = describeError(error);
    }
    if (deadline.passed()) throw new Error(`${what}: not within the deadline (${deadline.ms} ms)${last ? `; last error: ${last}` : ""}`);
    await sleep(intervalMs);
  }
}

/** An error's message with its causes: fetch's "fetch failed" alone does not say "ECONNREFUSED 172.17.0.1:32771". */
export function describeError(error: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = error; e !== undefined && e !== null && parts.length < 4; e = (e as { cause?: unknown }).cause) {
    parts.push(e instanceof Error ? e.message : String(e));
    if (!(e instanceof Error)) break;
  }
  return parts.join(": ");
}
