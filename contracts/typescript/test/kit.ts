// Helpers shared by the end-to-end tests: a client wired to inboxes, a recording logger.
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
