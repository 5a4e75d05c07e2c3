import { randomUUID } from "node:crypto";

import * as amqp from "amqplib";

import {
  LtmBacklogFullError,
  LtmClientError,
  LtmClosedError,
  LtmEventTooLargeError,
  LtmGuildBusyError,
  LtmIdentityError,
  LtmPublishRefusedError,
  LtmTimeoutError,
  LtmUnroutableError,
} from "./errors.js";
import type { EventContext, Notification, ToolCallEvent, ToolResult } from "./generated/index.js";
import { consoleLogger, type Logger } from "./logger.js";
import {
  NOTIFICATIONS_EXCHANGE,
  TOOL_CALLS_EXCHANGE,
  TOOL_RESULTS_EXCHANGE,
  WORK_QUEUE,
  shardQueue,
  shardRoutingKey,
  shardToolRoutingKey,
  shardWorkQueue,
  toolRoutingKey,
} from "./names.js";
import { SeenSet } from "./seen.js";
import { tlsConnectOptions, type LtmTlsOptions } from "./tls.js";
import type { ResultStatus, ToolName } from "./types.js";

/** Exchange and queue names of CONTRACT.md (fixed; generated in names.ts from contracts/names.py). */
export { NOTIFICATIONS_EXCHANGE, TOOL_CALLS_EXCHANGE, TOOL_RESULTS_EXCHANGE, WORK_QUEUE, shardWorkQueue };

/** The shard's own durable queues (deploy/README.md; the shard's user `shard-<id>` may declare only these). */
export function shardQueues(shardId: number): { results: string; notifications: string; routingKey: string } {
  return {
    results: shardQueue(shardId, "results"),
    notifications: shardQueue(shardId, "notifications"),
    routingKey: shardRoutingKey(shardId),
  };
}

/**
 * The routing keys of a tool's events: `tool.<name>` (version 1, bound to the common work queue) and the
 * shard's own `tool.<name>.shard.<id>` (bound to `ltm.create_memory.shard.<id>` once the workers have seen the
 * shard). See README.md "Routing keys".
 */
export function toolRoutingKeys(toolName: string, shardId: number): { common: string; perShard: string } {
  const common = toolRoutingKey(toolName);
  return { common, perShard: shardToolRoutingKey(common, shardId) };
}

/** How long the client uses `tool.<name>` after a per-shard publish came back unroutable (`perShardRetryMs`). */
export const PER_SHARD_RETRY_MS = 30_000;

/**
 * Default time a call waits for its result. The worker retries a transient fault 5 times with delays of
 * 1 + 2 + 4 + 8 s = 15 s (LTM_RETRY_* defaults) before it answers `memory_save_failed_db_error`; the attempts
 * themselves take a few seconds more, so 30 s covers the whole retry budget with room to spare.
 */
export const DEFAULT_TIMEOUT_MS = 30_000;

/** How long `close()` waits for `onNotice` / `onLateResult` callbacks still running before it closes. */
export const CLOSE_DRAIN_MS = 5_000;

/** CONTRACT.md: a body over 256 KiB is dead-lettered unparsed, and no result is sent for it. */
export const MAX_EVENT_BYTES = 256 * 1024;

/** How many calls of one guild may wait for their results at once (`guildInFlightMax`'s default). */
export const GUILD_IN_FLIGHT_MAX = 64;

/**
 * Whom the worker shares a shard's turns among (CONTRACT.md section 2, "Fair shares"): the guild, or for a
 * direct message its channel, `dm:<channel_disc_id>`.
 */
export function tenantOf(context: EventContext): string {
  return context.guild_disc_id ?? `dm:${context.channel_disc_id}`;
}

/** Why a result was handed to `onLateResult` instead of a call. */
export type LateResultReason =
  /** the call had already failed with LtmTimeoutError */
  | "timed_out"
  /** no call of this client waits for it (the shard restarted, or the call was closed) */
  | "unknown"
  /** a second result with another status for an event already answered (a replayed dead letter) */
  | "different_status";

export interface LateResultInfo {
  reason: LateResultReason;
  /** the status this client saw first for the event, for `different_status` */
  previousStatus?: ResultStatus;
}

export interface LtmClientOptions {
  /** AMQP URL with the vhost, e.g. `amqp://shard-3:secret@rabbitmq:5672/` (the shard's own user);
   * `amqps://...:5671/` for TLS. */
  url: string;
  /**
   * TLS settings of an `amqps://` URL: the CA to verify the broker with, a client certificate and key (see
   * LtmTlsOptions and README.md "TLS"). The URL's `?cafile=` and the like are not read. Verification is on
   * unless `rejectUnauthorized: false` (development only).
   */
  tls?: LtmTlsOptions;
  /** This shard's id (integer >= 0): results and notices come back with routing key `shard.<id>`. */
  shardId: number;
  /** How long `createMemory` waits for the result, unless the call says otherwise. Default 30 s. */
  timeoutMs?: number;
  /** A notice to show after a save; once per event id, also when the call is no longer waiting. */
  onNotice?: (notification: Notification) => void | Promise<void>;
  /** A result no call receives (see LateResultReason). Default: a warning through `logger`. */
  onLateResult?: (result: ToolResult, info: LateResultInfo) => void | Promise<void>;
  logger?: Logger;
  /** How many event ids the duplicate filters remember (default 100,000) and for how long (default 24 h,
   * CONTRACT.md section 9: "at least a day"); the oldest go first when the cap is reached. */
  dedupe?: { capacity?: number; ttlMs?: number };
  /** Reconnect backoff: first delay (default 200 ms), cap (default 10 s), retries before the first
   * connection succeeds (default 5: a wrong URL fails `connect`; after that the client retries forever). */
  reconnect?: { initialDelayMs?: number; maxDelayMs?: number; startupRetries?: number };
  /** Unacked results and notices the broker may push ahead (default 32). */
  prefetch?: number;
  /**
   * RabbitMQ blocks the connection (a memory or disk alarm on a node: `reason` is the broker's text). Events
   * published meanwhile wait in the kit and the socket, and the worker's results wait too; calls keep
   * waiting (their timeouts run on). See README.md "Blocked broker". Default: a warning through `logger`.
   */
  onBlocked?: (reason: string) => void;
  /** The block is over (or the connection it was on is gone): events flow again. Default: a warning. */
  onUnblocked?: () => void;
  /**
   * The AMQP `user_id` every event carries, so the worker knows which RabbitMQ user sent it (the broker refuses
   * any other value than the connection's own user). Default: the user of `url`, percent-decoded (`guest` when
   * the URL names none, as amqplib then logs in). A string names another user (a broker that authenticates
   * the connection under another name than the URL's); `false` sends none, which a worker with
   * `LTM_SHARD_IDENTITY=required` refuses. See README.md "Who sent an event".
   */
  userId?: string | false;
  /**
   * Publish with the shard's own routing key `tool.<name>.shard.<id>`, falling back to `tool.<name>` while no
   * queue takes it (default true; README.md "Routing keys"). `false`: always `tool.<name>`.
   */
  perShardRouting?: boolean;
  /** After a per-shard publish came back unroutable, how long to use `tool.<name>` before trying again (30 s). */
  perShardRetryMs?: number;
  /**
   * How many calls of one guild (a direct message: of its channel) may wait for their results at once
   * (default 64); one more rejects at once with LtmGuildBusyError, unpublished, so one guild's runaway loop
   * cannot fill its shard's queue ahead of the shard's other guilds. `null`: no cap.
   */
  guildInFlightMax?: number | null;
}

export interface CreateMemoryRequest {
  /** The model's tool-call id, echoed back in the result. */
  toolCallId: string;
  /** The model's arguments, verbatim (the worker validates them). */
  arguments: unknown;
  context: EventContext;
  /** Default `create_long_term_memory`; `remember_this_fact` is the alias. */
  toolName?: ToolName;
  /** W3C trace context, carried through to everything the worker emits. */
  traceparent?: string;
  /** This call's timeout, overriding the client's. */
  timeoutMs?: number;
  /** The idempotency key; a fresh UUID unless given (give the same one to retry a timed-out call). */
  eventId?: string;
  /** When the model issued the call; default now. */
  issuedAt?: Date;
}

interface PendingCall {
  eventId: string;
  toolCallId: string;
  toolName: string;
  /** the key of the latest publish */
  routingKey: string;
  /** which publish is the latest (a confirm or return of an earlier one is ignored) */
  publication: number;
  body: Buffer;
  headers: Record<string, string>;
  /** the broker confirmed the publish: a reconnect needs no republish */
  confirmed: boolean;
  /** whose turn it waits in (`tenantOf`): its guild, or a direct message's channel */
  guild: string;
  timer: NodeJS.Timeout;
  resolve: (result: ToolResult) => void;
  reject: (error: Error) => void;
}

/** Publishes `create_long_term_memory` events and hands back their results; see README.md. */
export class LtmClient {
  private readonly logger: Logger;
  private readonly timeoutMs: number;
  private readonly pending = new Map<string, PendingCall>();
  /** calls waiting for their results, by guild (`guildInFlightMax`) */
  private readonly byGuild = new Map<string, number>();
  private readonly guildInFlightMax: number | null;
  /** status of the result seen per event id (duplicates with the same status are dropped) */
  private readonly results: SeenSet<ResultStatus>;
  private readonly notices: SeenSet<true>;
  private readonly timedOut: SeenSet<true>;
  private connection: amqp.RecoveringChannelModel | null = null;
  private publisher: amqp.ConfirmChannel | null = null;
  private consumer: amqp.Channel | null = null;
  /** results and notices being handled: each settles once its callback ran and its ack was written */
  private readonly handling = new Set<Promise<void>>();
  private closed = false;
  private blockedSince: { reason: string; at: number } | null = null;
  /** the AMQP user_id of every event, null for none */
  private readonly userId: string | null;
  private readonly perShardRouting: boolean;
  private readonly perShardRetryMs: number;
  /** until when (epoch ms) events go with `tool.<name>`: a per-shard publish came back unroutable */
  private commonKeyUntil = 0;
  /** RabbitMQ refused the per-shard key (a topic permission older than it): `tool.<name>` from then on */
  private perShardRefused = false;
  /** RabbitMQ refused the user_id (its text): every call fails at once */
  private identityRefused: string | null = null;
  private publications = 0;

  private constructor(readonly options: LtmClientOptions) {
    if (!Number.isSafeInteger(options.shardId) || options.shardId < 0) {
      throw new RangeError(`shardId must be an integer >= 0, got ${String(options.shardId)}`);
    }
    this.logger = options.logger ?? consoleLogger;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const capacity = options.dedupe?.capacity ?? 100_000;
    const ttlMs = options.dedupe?.ttlMs ?? 86_400_000;
    this.results = new SeenSet(capacity, ttlMs);
    this.notices = new SeenSet(capacity, ttlMs);
    this.timedOut = new SeenSet(capacity, ttlMs);
    this.userId = options.userId === false ? null : (options.userId ?? userOfUrl(options.url));
    this.perShardRouting = options.perShardRouting ?? true;
    this.perShardRetryMs = options.perShardRetryMs ?? PER_SHARD_RETRY_MS;
    const cap = options.guildInFlightMax === undefined ? GUILD_IN_FLIGHT_MAX : options.guildInFlightMax;
    if (cap !== null && (!Number.isSafeInteger(cap) || cap < 1)) {
      throw new RangeError(`guildInFlightMax must be an integer >= 1 or null, got ${String(cap)}`);
    }
    this.guildInFlightMax = cap;
  }

  /**
   * Connect, check the exchanges, declare and bind this shard's queues and start consuming them.
   * Rejects when the first connection fails `reconnect.startupRetries` times in a row.
   */
  static async connect(options: LtmClientOptions): Promise<LtmClient> {
    const client = new LtmClient(options);
    const reconnect = options.reconnect ?? {};
    const tls = tlsConnectOptions("RabbitMQ", options.url, options.tls, client.logger);
    const connection = await amqp.connect(options.url, {
      // amqplib hands its socket options to tls.connect for amqps://
      ...tls,
      // Nagle's algorithm off: amqplib leaves it on unless told (and so does Node), which holds each small
      // publish and ack back until the previous segment is acknowledged; ~12 ms of every round trip
      noDelay: true,
      recovery: {
        initialDelay: reconnect.initialDelayMs ?? 200,
        maxDelay: reconnect.maxDelayMs ?? 10_000,
        factor: 2,
        jitter: 0.5,
        maxRetries: Infinity,
        initialMaxRetries: reconnect.startupRetries ?? 5,
        waitForConnect: false,
        setup: (model: amqp.ChannelModel) => client.setup(model),
      },
    });
    client.connection = connection;
    connection.on("blocked", (reason: unknown) => client.blockedBy(String(reason ?? "")));
    connection.on("unblocked", () => client.unblocked("unblocked"));
    connection.on("disconnect", (error: Error) => {
      client.publisher = null;
      // a new connection starts unblocked
      client.unblocked("connection lost");
      client.logger.warn("RabbitMQ connection lost; reconnecting", { error: error.message });
    });
    // a refused login or vhost at start-up will not fix itself by retrying: fail at once, in plain words
    let starting = true;
    let refuse: (error: Error) => void = () => {};
    const refused = new Promise<never>((_, reject) => {
      refuse = reject;
    });
    refused.catch(() => {});
    connection.on("connect-failed", (error: Error) => {
      const plain = starting ? refusalOf(error, options.url) : null;
      if (plain !== null) refuse(new LtmClientError(plain));
      else client.logger.warn("RabbitMQ connection attempt failed", { error: error.message });
    });
    connection.on("error", (error: Error) => client.logger.debug("RabbitMQ error", { error: error.message }));
    try {
      await Promise.race([connection.waitForConnect(), refused]);
      starting = false;
    } catch (error) {
      client.closed = true;
      await connection.close().catch(() => {});
      throw error;
    }
    return client;
  }

  /** Events published and not answered yet. */
  get inFlight(): number {
    return this.pending.size;
  }

  /** Of those, the events the broker has not confirmed yet (republished after a reconnect). */
  get unconfirmed(): number {
    let n = 0;
    for (const call of this.pending.values()) if (!call.confirmed) n += 1;
    return n;
  }

  /** Why RabbitMQ blocks the connection (a memory or disk alarm), or null when it does not. */
  get blocked(): string | null {
    return this.blockedSince?.reason ?? null;
  }

  /** True while a connection is up and set up (exchanges checked, queues consumed). */
  get connected(): boolean {
    return this.publisher !== null;
  }

  /** The AMQP `user_id` the events carry (null: none); see the `userId` option. */
  get publishingAs(): string | null {
    return this.userId;
  }

  /** The routing key the next event of `toolName` goes with (README.md "Routing keys"). */
  routingKeyFor(toolName: ToolName | string = "create_long_term_memory"): string {
    const keys = toolRoutingKeys(toolName, this.options.shardId);
    const perShard = this.perShardRouting && !this.perShardRefused && Date.now() >= this.commonKeyUntil;
    return perShard ? keys.perShard : keys.common;
  }

  /**
   * Publish one tool-call event and resolve with its result. Rejects with LtmTimeoutError when no result
   * arrives in time (the memory may still be saved), LtmUnroutableError when nothing is bound to the
   * routing key, LtmBacklogFullError when the queue is at its bound (a broker nack), LtmIdentityError or
   * LtmPublishRefusedError when RabbitMQ refuses the user_id or the routing key, LtmClosedError on `close()`,
   * and at once with LtmEventTooLargeError for a body over 256 KiB or LtmGuildBusyError when the context's
   * guild already has `guildInFlightMax` calls waiting.
   *
   * The notice (`onNotice`) and the invalidation may arrive before this promise resolves: they come on other
   * queues and connections. Pass your own `eventId` to know it before the result.
   */
  createMemory(request: CreateMemoryRequest): Promise<ToolResult> {
    if (this.closed) return Promise.reject(new LtmClosedError(null));
    const eventId = request.eventId ?? randomUUID();
    if (this.identityRefused !== null) {
      return Promise.reject(new LtmIdentityError(eventId, this.userId ?? "", this.identityRefused));
    }
    if (this.pending.has(eventId)) {
      return Promise.reject(new RangeError(`event ${eventId} is already waiting for its result`));
    }
    const toolName = request.toolName ?? "create_long_term_memory";
    const event: ToolCallEvent = {
      schema_version: 1,
      event_id: eventId,
      tool_call_id: request.toolCallId,
      tool_name: toolName,
      issued_at: (request.issuedAt ?? new Date()).toISOString(),
      shard_id: this.options.shardId,
      arguments: request.arguments as ToolCallEvent["arguments"],
      context: request.context,
    };
    const timeoutMs = request.timeoutMs ?? this.timeoutMs;
    const body = Buffer.from(JSON.stringify(event));
    if (body.length > MAX_EVENT_BYTES) return Promise.reject(new LtmEventTooLargeError(eventId, body.length));
    const guild = tenantOf(request.context);
    const waiting = this.byGuild.get(guild) ?? 0;
    if (this.guildInFlightMax !== null && waiting >= this.guildInFlightMax) {
      return Promise.reject(new LtmGuildBusyError(eventId, guild, waiting));
    }
    this.byGuild.set(guild, waiting + 1);
    return new Promise<ToolResult>((resolve, reject) => {
      const call: PendingCall = {
        eventId,
        toolCallId: request.toolCallId,
        toolName,
        routingKey: this.routingKeyFor(toolName),
        publication: 0,
        body,
        headers: request.traceparent === undefined ? {} : { traceparent: request.traceparent },
        confirmed: false,
        guild,
        timer: setTimeout(() => this.expire(eventId, timeoutMs), timeoutMs),
        resolve,
        reject,
      };
      this.pending.set(eventId, call);
      // while disconnected the call waits: the next connection's setup publishes it
      if (this.publisher !== null) this.publish(this.publisher, call);
    });
  }

  /**
   * Stop consuming and close the connection; calls still waiting reject with LtmClosedError. Every result
   * or notice already handed to the shard is acked first (its callback is awaited, up to `CLOSE_DRAIN_MS`),
   * so the next process is not handed it again as a late result.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const call of this.pending.values()) this.settle(call, new LtmClosedError(call.eventId));
    this.publisher = null;
    if (this.handling.size > 0) {
      let timer: NodeJS.Timeout | undefined;
      const bound = new Promise<void>((done) => {
        timer = setTimeout(done, CLOSE_DRAIN_MS);
      });
      await Promise.race([Promise.allSettled([...this.handling]), bound]);
      clearTimeout(timer);
      if (this.handling.size > 0) {
        this.logger.warn("closing with callbacks still running; their messages come again", {
          running: this.handling.size,
        });
      }
    }
    // closing the consumer channel first puts its close behind the acks on the same channel: the broker
    // has taken every ack when it answers (a connection close alone can overtake them)
    // (not while the broker blocks the connection: it reads nothing, the channel's close would never be
    // answered; amqplib then drops the connection at once and the broker requeues what was not acked)
    const consumer = this.consumer;
    this.consumer = null;
    if (consumer !== null && this.blockedSince === null) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        consumer.close().catch(() => {}),
        new Promise<void>((done) => {
          timer = setTimeout(done, CLOSE_DRAIN_MS);
        }),
      ]);
      clearTimeout(timer);
    }
    await this.connection?.close();
  }

  private blockedBy(reason: string): void {
    if (this.blockedSince !== null) return;
    this.blockedSince = { reason, at: Date.now() };
    this.logger.warn("RabbitMQ blocked the connection; events and results wait until it unblocks", {
      reason,
      inFlight: this.pending.size,
    });
    this.callback("onBlocked", () => this.options.onBlocked?.(reason));
  }

  private unblocked(how: "unblocked" | "connection lost"): void {
    const since = this.blockedSince;
    if (since === null) return;
    this.blockedSince = null;
    this.logger.warn("RabbitMQ unblocked the connection", {
      reason: since.reason,
      blockedMs: Date.now() - since.at,
      ended: how,
    });
    this.callback("onUnblocked", () => this.options.onUnblocked?.());
  }

  /** A shard callback run from a connection event: what it throws is logged, never thrown into amqplib. */
  private callback(name: string, run: () => void): void {
    try {
      run();
    } catch (error) {
      this.logger.error(`the ${name} callback failed`, { error: error instanceof Error ? error.message : String(error) });
    }
  }

  /** Run after every (re)connection, before the client counts as connected. */
  private async setup(model: amqp.ChannelModel): Promise<void> {
    const { results, notifications, routingKey } = shardQueues(this.options.shardId);
    const consumer = await model.createChannel();
    this.watch(model, consumer, "consumer");
    this.consumer = consumer;
    // passive checks only: a shard's user may not declare the exchanges (they come from the definitions)
    for (const exchange of [TOOL_CALLS_EXCHANGE, TOOL_RESULTS_EXCHANGE, NOTIFICATIONS_EXCHANGE]) {
      await consumer.checkExchange(exchange);
    }
    await consumer.assertQueue(results, { durable: true });
    await consumer.assertQueue(notifications, { durable: true });
    await consumer.bindQueue(results, TOOL_RESULTS_EXCHANGE, routingKey);
    await consumer.bindQueue(notifications, NOTIFICATIONS_EXCHANGE, routingKey);
    await consumer.prefetch(this.options.prefetch ?? 32);
    await consumer.consume(results, (message) => this.deliver(model, consumer, message, "result"), {
      noAck: false,
    });
    await consumer.consume(notifications, (message) => this.deliver(model, consumer, message, "notice"), {
      noAck: false,
    });

    const publisher = await model.createConfirmChannel();
    this.watch(model, publisher, "publisher");
    publisher.on("error", (error: Error) => this.publisherRefused(error));
    publisher.on("return", (message: amqp.Message) => this.returned(message));
    this.publisher = publisher;
    // every event the broker has not confirmed goes again, with the same event id: the worker answers
    // an event it already processed from its ledger (`replayed: true`), which the result filter drops
    let republished = 0;
    for (const call of this.pending.values()) {
      if (!call.confirmed) {
        this.publish(publisher, call);
        republished += 1;
      }
    }
    this.logger.info("connected to RabbitMQ", { shardId: this.options.shardId, republished });
  }

  /** A channel the broker closes (an error on it) takes the connection down, so recovery rebuilds all. */
  private watch(model: amqp.ChannelModel, channel: amqp.Channel, name: string): void {
    channel.on("error", (error: Error) => this.logger.warn(`${name} channel error`, { error: error.message }));
    channel.on("close", () => {
      if (channel === this.publisher) this.publisher = null;
      if (channel === this.consumer) this.consumer = null;
      if (!this.closed) model.close().catch(() => {});
    });
  }

  /** Publish `call` (again) with `routingKey`, by default the key its tool's events go with now. */
  private publish(channel: amqp.ConfirmChannel, call: PendingCall, routingKey = this.routingKeyFor(call.toolName)): void {
    this.publications += 1;
    const publication = this.publications;
    call.publication = publication;
    call.routingKey = routingKey;
    call.confirmed = false;
    const options: amqp.Options.Publish = {
      mandatory: true,
      persistent: true,
      contentType: "application/json",
      messageId: call.eventId,
      correlationId: call.toolCallId,
      type: "tool_call.v1",
      headers: call.headers,
      ...(this.userId === null ? {} : { userId: this.userId }),
    };
    try {
      channel.publish(TOOL_CALLS_EXCHANGE, routingKey, call.body, options, (error: unknown) => {
        // answered, returned, refused, timed out or closed; or published again since (a fallback)
        if (this.pending.get(call.eventId) !== call || call.publication !== publication) return;
        if (error === null || error === undefined) {
          call.confirmed = true;
        } else if (error instanceof Error && error.message === "channel closed") {
          // no verdict: the next connection republishes it
        } else {
          // basic.nack: the queue it was routed to is at its bound (x-overflow reject-publish)
          const perShard = this.isPerShardKey(routingKey);
          const queue = perShard ? shardWorkQueue(this.options.shardId) : WORK_QUEUE;
          this.settle(call, new LtmBacklogFullError(call.eventId, this.options.shardId, routingKey, queue, perShard));
        }
      });
    } catch (error) {
      // the channel closed under us; the next connection republishes the call
      this.logger.debug("publish deferred to the next connection", {
        eventId: call.eventId,
        error: error instanceof Error ? error.message : String(error),
      });
    }
  }

  /**
   * basic.return: a mandatory publish that no queue took (it precedes the confirm). With the shard's own key
   * that means the workers have not bound its queue yet: the same message goes again with `tool.<name>` (safe:
   * a returned message was enqueued nowhere), and so do the next events for `perShardRetryMs`.
   */
  private returned(message: amqp.Message): void {
    const eventId = String(message.properties.messageId ?? "");
    const call = this.pending.get(eventId);
    if (call === undefined) return;
    const fields = message.fields as { routingKey?: string; replyText?: string };
    const routingKey = fields.routingKey ?? call.routingKey;
    if (routingKey !== call.routingKey) return; // an earlier publish of the call, already dealt with
    const common = toolRoutingKeys(call.toolName, this.options.shardId).common;
    if (!this.isPerShardKey(routingKey)) {
      this.settle(call, new LtmUnroutableError(eventId, routingKey, fields.replyText ?? "NO_ROUTE"));
      return;
    }
    const now = Date.now();
    if (now >= this.commonKeyUntil) {
      this.logger.debug("no queue takes this shard's own routing key yet; events go with tool.<name> for a while", {
        routingKey,
        retryInMs: this.perShardRetryMs,
      });
    }
    this.commonKeyUntil = Math.max(this.commonKeyUntil, now + this.perShardRetryMs);
    const publisher = this.publisher;
    if (publisher !== null) {
      this.publish(publisher, call, common);
    } else {
      // no channel: the next connection publishes it (with tool.<name>, within the window)
      this.publications += 1;
      call.publication = this.publications;
      call.confirmed = false;
    }
  }

  /**
   * The publisher channel was closed by the broker. Two refusals are about the events themselves: a user_id
   * that is not the connection's user (PRECONDITION_FAILED: every call fails, now and later), and a routing
   * key the user's topic permission does not allow (ACCESS_REFUSED): for the per-shard key (a permission
   * written before it existed) the client uses `tool.<name>` from then on, and the calls go again with it
   * on the next connection; for `tool.<name>` the calls with that key fail. Any other close only reconnects.
   */
  private publisherRefused(error: Error): void {
    const text = /with message "(.*)"$/s.exec(error.message)?.[1] ?? error.message;
    if (/PRECONDITION_FAILED - user_id/.test(text)) {
      this.identityRefused = text;
      this.logger.error("RabbitMQ refused the events' user_id: set the userId option to the user it authenticates", {
        userId: this.userId,
        error: text,
      });
      for (const call of [...this.pending.values()]) {
        if (!call.confirmed) this.settle(call, new LtmIdentityError(call.eventId, this.userId ?? "", text));
      }
      return;
    }
    const refused = /ACCESS_REFUSED - (?:write )?access to topic '([^']*)' in exchange '([^']*)'/.exec(text);
    if (refused === null || refused[2] !== TOOL_CALLS_EXCHANGE) return;
    const routingKey = refused[1] ?? "";
    if (this.isPerShardKey(routingKey)) {
      if (!this.perShardRefused) {
        this.perShardRefused = true;
        this.logger.warn(
          "RabbitMQ refused this shard's own routing key (the user's topic permission on tomori.tool_calls predates it; " +
            "deploy/rabbitmq/shard_users.py writes the new one): events go with tool.<name> until the client restarts",
          { routingKey, error: text },
        );
      }
      return;
    }
    for (const call of [...this.pending.values()]) {
      if (!call.confirmed && call.routingKey === routingKey) {
        this.settle(call, new LtmPublishRefusedError(call.eventId, routingKey, text));
      }
    }
  }

  private isPerShardKey(routingKey: string): boolean {
    // `.shard.<id>`: what shardToolRoutingKey adds to a tool's key
    return routingKey.endsWith(shardToolRoutingKey("", this.options.shardId));
  }

  private expire(eventId: string, timeoutMs: number): void {
    const call = this.pending.get(eventId);
    if (call === undefined) return;
    this.timedOut.set(eventId, true);
    this.settle(call, new LtmTimeoutError(eventId, call.toolCallId, timeoutMs));
  }

  /** Remove a call and resolve or reject it. */
  private settle(call: PendingCall, outcome: ToolResult | Error): void {
    clearTimeout(call.timer);
    this.pending.delete(call.eventId);
    const left = (this.byGuild.get(call.guild) ?? 1) - 1;
    if (left > 0) this.byGuild.set(call.guild, left);
    else this.byGuild.delete(call.guild);
    if (outcome instanceof Error) call.reject(outcome);
    else call.resolve(outcome);
  }

  private deliver(
    model: amqp.ChannelModel,
    channel: amqp.Channel,
    message: amqp.ConsumeMessage | null,
    kind: "result" | "notice",
  ): void {
    if (message === null) {
      // the broker cancelled the consumer (queue deleted): rebuild everything
      this.logger.warn(`the ${kind} consumer was cancelled by the broker; reconnecting`);
      model.close().catch(() => {});
      return;
    }
    let body: unknown;
    try {
      body = JSON.parse(message.content.toString("utf8"));
    } catch {
      body = undefined;
    }
    const eventId = typeof body === "object" && body !== null ? (body as { event_id?: unknown }).event_id : undefined;
    const handled =
      typeof eventId !== "string"
        ? (this.logger.warn(`dropped a ${kind} that is not a contract message`, {
            messageId: message.properties.messageId,
          }),
          Promise.resolve())
        : kind === "result"
          ? this.onResult(body as ToolResult)
          : this.onNotice(body as Notification);
    // ack after the callback: a crash inside it gets the message again (the filters drop a copy
    // that was already handled); close() waits for this before the channel goes
    const settled = handled
      .catch((error: unknown) =>
        this.logger.error(`the ${kind} callback failed`, {
          eventId,
          error: error instanceof Error ? error.message : String(error),
        }),
      )
      .finally(() => {
        try {
          channel.ack(message);
        } catch {
          // the channel is gone; the broker redelivers and the filters drop the copy
        }
      });
    this.handling.add(settled);
    void settled.finally(() => this.handling.delete(settled));
  }

  private async onResult(result: ToolResult): Promise<void> {
    const eventId = result.event_id;
    const previous = this.results.get(eventId);
    const call = this.pending.get(eventId);
    if (call !== undefined) {
      // a waiting call takes the first result for its event id, also when the id was seen before (a call
      // retried with the event id of one that timed out gets the stored answer, `replayed: true`)
      this.results.set(eventId, result.status);
      this.settle(call, result);
      return;
    }
    if (previous === result.status) {
      this.logger.debug("duplicate result dropped", { eventId, status: result.status, replayed: result.replayed });
      return;
    }
    this.results.set(eventId, result.status);
    if (previous !== undefined) {
      await this.late(result, { reason: "different_status", previousStatus: previous });
      return;
    }
    await this.late(result, { reason: this.timedOut.has(eventId) ? "timed_out" : "unknown" });
  }

  private async late(result: ToolResult, info: LateResultInfo): Promise<void> {
    if (this.options.onLateResult !== undefined) {
      await this.options.onLateResult(result, info);
      return;
    }
    this.logger.warn("a result no call waits for", {
      eventId: result.event_id,
      toolCallId: result.tool_call_id,
      status: result.status,
      reason: info.reason,
      previousStatus: info.previousStatus,
    });
  }

  private async onNotice(notification: Notification): Promise<void> {
    if (this.notices.has(notification.event_id)) {
      this.logger.debug("duplicate notice dropped", { eventId: notification.event_id });
      return;
    }
    this.notices.set(notification.event_id, true);
    await this.options.onNotice?.(notification);
  }
}

/** The user amqplib logs in as for `url`: the URL's, percent-decoded, or `guest` when it names none. */
export function userOfUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.username === "" && parsed.password === "") return "guest";
    return decodeURIComponent(parsed.username);
  } catch {
    return "guest";
  }
}

/**
 * The plain sentence for a connection RabbitMQ refused during the handshake (a login it does not accept, a
 * vhost that does not exist or that the user has no permission on), or null for any other failure. amqplib
 * reports the first as `Handshake terminated by server: 403 (ACCESS-REFUSED) ...` and the second as
 * `Expected ConnectionOpenOk; got <ConnectionClose ...>`.
 */
export function refusalOf(error: Error, url: string): string | null {
  let user = "?";
  let vhost = "/";
  try {
    const parsed = new URL(url);
    user = decodeURIComponent(parsed.username) || "guest";
    vhost = decodeURIComponent(parsed.pathname.slice(1)) || "/";
  } catch {
    // amqplib read the URL, so this is not reached; keep the defaults
  }
  if (/\b403\b|ACCESS[-_]REFUSED/.test(error.message)) {
    return `RabbitMQ refused the login of user "${user}" (ACCESS_REFUSED): check the user and password in the URL (${error.message})`;
  }
  if (/^Expected ConnectionOpenOk; got <ConnectionClose/.test(error.message)) {
    return (
      `RabbitMQ refused vhost "${vhost}" to user "${user}": the vhost does not exist or the user has no ` +
      `permissions on it (rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions ${user})`
    );
  }
  return null;
}
