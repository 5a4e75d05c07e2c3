import { createHash } from "node:crypto";

import { Redis } from "ioredis";

import type { CacheInvalidation } from "./generated/index.js";
import { consoleLogger, type Logger } from "./logger.js";
import { INVALIDATION_CHANNEL } from "./names.js";
import { tlsConnectOptions, type LtmTlsOptions } from "./tls.js";

/** After a server-wide save: `server_disc_id` (the guild, or the user's id in a DM). */
export type ServerStateInvalidation = Extract<CacheInvalidation, { kind: "tomori_state" }>;
/** After a personal save: `user_disc_id`. */
export type UserInvalidation = Extract<CacheInvalidation, { kind: "user" }>;

/** The Redis pub/sub channel of CONTRACT.md (generated in names.ts from contracts/names.py). */
export { INVALIDATION_CHANNEL };

/**
 * The `invalidation_id` the worker puts on the invalidations of your save of `eventId` (CONTRACT.md section 6):
 * hex SHA-256 of `tomori-ltm-invalidation:` and the id in canonical form (lower case, hyphenated). An
 * invalidation never carries the event id itself; this lets the shard that sent the event recognise its own.
 */
export function invalidationIdOf(eventId: string): string {
  const hex = eventId.toLowerCase().replace(/[^0-9a-f]/g, "");
  const canonical =
    hex.length === 32
      ? `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`
      : eventId;
  return createHash("sha256").update(`tomori-ltm-invalidation:${canonical}`).digest("hex");
}

export interface InvalidationSubscriberOptions {
  /** Redis URL, e.g. `redis://redis:6379/0`; `rediss://...` for TLS. */
  url: string;
  /**
   * TLS settings of a `rediss://` URL: the CA to verify Redis with, a client certificate and key (see
   * LtmTlsOptions and README.md "TLS"). Verification is on unless `rejectUnauthorized: false`
   * (development only).
   */
  tls?: LtmTlsOptions;
  /** A server-wide save: drop what you cache for this server (`server_disc_id`). */
  onServerState?: (message: ServerStateInvalidation) => void | Promise<void>;
  /** A personal save: drop what you cache for this user (`user_disc_id`). */
  onUser?: (message: UserInvalidation) => void | Promise<void>;
  /**
   * The subscription is back after a lost connection. Pub/sub keeps no history, so invalidations sent
   * while it was down are gone: drop every cache this subscriber guards.
   */
  onResubscribed?: () => void | Promise<void>;
  logger?: Logger;
  /** Reconnect backoff cap in ms (default 5,000); delays grow 100, 200, ... with jitter. */
  maxReconnectDelayMs?: number;
}

/** Listens to `tomori:cache-invalidation` and dispatches by `kind`; see README.md. */
export class InvalidationSubscriber {
  private readonly logger: Logger;
  private subscriptions = 0;
  private closed = false;

  private constructor(
    private readonly redis: Redis,
    private readonly options: InvalidationSubscriberOptions,
  ) {
    this.logger = options.logger ?? consoleLogger;
  }

  /**
   * Connect and subscribe; resolves once the first subscription is confirmed by Redis. Rejects when the first
   * connection fails (with the connection's own error: a refused certificate, a wrong password), leaving
   * nothing running; after that the subscriber reconnects by itself.
   */
  static async start(options: InvalidationSubscriberOptions): Promise<InvalidationSubscriber> {
    const cap = options.maxReconnectDelayMs ?? 5_000;
    const logger = options.logger ?? consoleLogger;
    const tls = tlsConnectOptions("Redis", options.url, options.tls, logger);
    const redis = new Redis(options.url, {
      lazyConnect: true,
      // ioredis's default, stated: no Nagle delay on the subscription's socket
      noDelay: true,
      // we subscribe ourselves on every "ready", so the resubscription is known to be done when
      // onResubscribed runs
      autoResubscribe: false,
      // no INFO before subscribing: a shard's Redis user may run SUBSCRIBE and PING only (deploy/README.md "Redis
      // users"), and ioredis's ready check would print a warning for the refused INFO on every connection
      enableReadyCheck: false,
      maxRetriesPerRequest: null,
      retryStrategy: (attempt: number) => Math.round(Math.min(cap, 100 * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2)),
      // handed to tls.connect (a rediss:// URL turns TLS on by itself, verified against Node's CA store)
      ...(tls === undefined ? {} : { tls }),
    });
    const subscriber = new InvalidationSubscriber(redis, options);
    let lastError: Error | null = null;
    redis.on("message", (channel: string, text: string) => subscriber.dispatch(channel, text));
    redis.on("error", (error: Error) => {
      lastError = error;
      subscriber.logger.debug("redis error", { error: error.message });
    });
    redis.on("close", () => {
      if (!subscriber.closed) subscriber.logger.warn("redis connection lost; invalidations are missed until it is back");
    });
    const first = new Promise<void>((resolve, reject) => {
      redis.on("ready", () => {
        subscriber.subscribe().then(resolve, (error: unknown) => {
          reject(error);
          // after the first time nobody awaits this: drop the connection so the retry strategy tries again
          if (subscriber.subscriptions > 0 && !subscriber.closed) redis.disconnect(true);
        });
      });
    });
    try {
      await redis.connect();
      await first;
    } catch (error) {
      // ioredis rejects with "Connection is closed." and would go on retrying: stop it, report the cause
      subscriber.closed = true;
      redis.disconnect();
      throw lastError ?? error;
    }
    return subscriber;
  }

  /** How many times the subscription was made (1 + reconnections). */
  get subscriptionCount(): number {
    return this.subscriptions;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.redis.quit().catch(() => this.redis.disconnect());
  }

  private async subscribe(): Promise<void> {
    try {
      await this.redis.subscribe(INVALIDATION_CHANNEL);
    } catch (error) {
      this.logger.warn("subscribing to the invalidation channel failed", {
        error: error instanceof Error ? error.message : String(error),
      });
      throw error;
    }
    this.subscriptions += 1;
    if (this.subscriptions > 1) {
      this.logger.info("resubscribed to the invalidation channel; caches must be dropped");
      await this.guard("onResubscribed", () => this.options.onResubscribed?.());
    }
  }

  private dispatch(channel: string, text: string): void {
    if (channel !== INVALIDATION_CHANNEL) return;
    let message: CacheInvalidation;
    try {
      message = JSON.parse(text) as CacheInvalidation;
    } catch {
      this.logger.warn("dropped an invalidation that is not JSON");
      return;
    }
    switch (message?.kind) {
      case "tomori_state":
        void this.guard("onServerState", () => this.options.onServerState?.(message as ServerStateInvalidation));
        return;
      case "user":
        void this.guard("onUser", () => this.options.onUser?.(message as UserInvalidation));
        return;
      default:
        this.logger.warn("dropped an invalidation of an unknown kind", { kind: (message as { kind?: unknown })?.kind });
    }
  }

  private async guard(name: string, run: () => void | Promise<void>): Promise<void> {
    try {
      await run();
    } catch (error) {
      this.logger.error(`${name} failed`, { error: error instanceof Error ? error.message : String(error) });
    }
  }
}
