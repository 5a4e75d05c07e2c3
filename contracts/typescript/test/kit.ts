// Helpers shared by the end-to-end tests: a client wired to inboxes, a recording logger, the sockets a call opens.
import assert from "node:assert/strict";
import net from "node:net";

import { LtmClient, type LateResultInfo, type Logger, type LtmClientOptions, type Notification, type ToolResult } from "../src/index.js";
import { buildContext, type ContextInput } from "../src/index.js";
import { BOT, CHANNEL, GUILD, Inbox, SPARROW, TRIGGER } from "./harness.js";

export interface LogLine {
  level: "debug" | "info" | "warn" | "error";
  message: string;
  fields: Record<string, unknown>;
}

/** A logger that keeps every line, so a test can wait for what the kit did with a message. */
export function recordingLogger(): { logger: Logger; lines: Inbox<LogLine> } {
  const lines = new Inbox<LogLine>();
  const at =
    (level: LogLine["level"]) =>
    (message: string, fields?: Record<string, unknown>): void =>
      lines.push({ level, message, fields: fields ?? {} });
  return { logger: { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") }, lines };
}

export interface Harnessed {
  client: LtmClient;
  notices: Inbox<Notification>;
  late: Inbox<{ result: ToolResult; info: LateResultInfo }>;
  log: Inbox<LogLine>;
}

/** LtmClient.connect with every callback recorded. */
export async function connectClient(url: string, options: Partial<LtmClientOptions> = {}): Promise<Harnessed> {
  const notices = new Inbox<Notification>();
  const late = new Inbox<{ result: ToolResult; info: LateResultInfo }>();
  const { logger, lines } = recordingLogger();
  const client = await LtmClient.connect({
    url,
    shardId: 3,
    timeoutMs: 30_000,
    onNotice: notices.push,
    onLateResult: (result, info) => late.push({ result, info }),
    logger,
    reconnect: { initialDelayMs: 100, maxDelayMs: 1_000 },
    ...options,
  });
  return { client, notices, late, log: lines };
}

/** The seeded world's context: guild, channel, triggering user, Sparrow as a member and participant. */
export function worldContext(personaId: number, extra: Partial<ContextInput> = {}) {
  return buildContext({
    guildId: GUILD,
    channelId: CHANNEL,
    userId: TRIGGER,
    botUserId: BOT,
    personaId,
    participants: [{ targetId: SPARROW, displayLabel: "Sparrow", aliases: ["Sparrow", "sparrow_ow"] }],
    members: [{ userId: SPARROW, username: "sparrow_ow", globalName: "Sparrow" }],
    ...extra,
  });
}

let calls = 0;
/** A fresh tool-call id. */
export function callId(): string {
  calls += 1;
  return `call_ts_${process.pid}_${calls}`;
}

/** Node keeps the socket's TCP_NODELAY setting under this symbol (net.js `kSetNoDelay`). */
export function noDelayOf(socket: net.Socket): boolean {
  const key = Object.getOwnPropertySymbols(socket).find((s) => s.description === "kSetNoDelay");
  assert.ok(key !== undefined, "this Node keeps no kSetNoDelay on its sockets: the test cannot read the option");
  return (socket as unknown as Record<symbol, unknown>)[key] === true;
}

/** The sockets opened while `body` runs (every net.Socket connect goes through the prototype). */
export async function socketsOpenedBy<T>(body: () => Promise<T>): Promise<{ value: T; sockets: net.Socket[] }> {
  const sockets: net.Socket[] = [];
  const original = net.Socket.prototype.connect;
  net.Socket.prototype.connect = function (this: net.Socket, ...args: unknown[]) {
    sockets.push(this);
    return (original as (...a: unknown[]) => net.Socket).apply(this, args);
  } as typeof original;
  try {
    return { value: await body(), sockets };
  } finally {
    net.Socket.prototype.connect = original;
  }
}
