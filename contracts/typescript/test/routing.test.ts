// Fair shares, the kit's side (issue 29): who sent an event (the AMQP user_id), the shard's own routing key with
// its fallback to `tool.<name>`, and the typed refusals (a full queue's nack, a refused user_id or routing key).
// The worker of this repository binds no per-shard queue yet, so a save through it is also the fallback's test;
// the per-shard path itself runs against a queue the test binds as the workers will.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import * as amqp from "amqplib";

import {
  LtmBacklogFullError,
  LtmClosedError,
  LtmGuildBusyError,
  LtmIdentityError,
  LtmPublishRefusedError,
  LtmPublishRejectedError,
  type ToolResult,
} from "../src/index.js";
import { Stack, broker, createVhost, hex, waitFor } from "./harness.js";
import { callId, connectClient, worldContext, type Harnessed } from "./kit.js";

/** The shard id of connectClient (test/kit.ts). */
const SHARD = 3;
const OWN_QUEUE = `ltm.create_memory.shard.${SHARD}`;
const TOOLS = ["create_long_term_memory", "remember_this_fact"] as const;

/** The arguments the worker declares its work queue with (worker/broker/topology.py), and a bound if asked. */
function workQueueArguments(maxLength?: number): Record<string, unknown> {
  return {
    "x-queue-type": "quorum",
    "x-delivery-limit": 20,
    "x-dead-letter-exchange": "tomori.dead_letter",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
    ...(maxLength === undefined ? {} : { "x-max-length": maxLength }),
  };
}

/** The contract's exchanges in a bare vhost (what the definitions file or a worker's start-up declares). */
async function declareExchanges(url: string, body?: (channel: amqp.Channel) => Promise<void>): Promise<void> {
  const raw = await amqp.connect(url);
  try {
    const channel = await raw.createChannel();
    for (const exchange of ["tomori.tool_calls", "tomori.tool_results", "tomori.notifications", "tomori.dead_letter"]) {
      await channel.assertExchange(exchange, "topic", { durable: true });
    }
    await body?.(channel);
  } finally {
    await raw.close();
  }
}

/** The shard's own queue as the workers declare it, bound with its keys. */
async function ownQueue(channel: amqp.Channel): Promise<void> {
  await channel.assertQueue(OWN_QUEUE, { durable: true, arguments: workQueueArguments() });
  for (const tool of TOOLS) await channel.bindQueue(OWN_QUEUE, "tomori.tool_calls", `tool.${tool}.shard.${SHARD}`);
}

/** A call whose outcome is taken at once (so a rejection is handled when it happens). */
function outcome(kit: Harnessed, request: Partial<Parameters<Harnessed["client"]["createMemory"]>[0]> = {}): Promise<ToolResult | Error> {
  return kit.client
    .createMemory({ toolCallId: callId(), arguments: { memory_content: "x" }, context: worldContext(7), ...request })
    .then(
      (result) => result,
      (error: unknown) => (error instanceof Error ? error : new Error(String(error))),
    );
}

interface Traced {
  routingKey: string;
  eventId: string;
  userId: string | undefined;
}

/** RabbitMQ's firehose for one vhost: every publish to tomori.tool_calls as the broker received it. */
async function traceToolCalls(url: string, vhost: string): Promise<{ seen: Traced[]; stop: () => Promise<void> }> {
  await (await broker()).tracing(vhost, true);
  const connection = await amqp.connect(url);
  const channel = await connection.createChannel();
  const { queue } = await channel.assertQueue("", { exclusive: true });
  await channel.bindQueue(queue, "amq.rabbitmq.trace", "publish.tomori.tool_calls");
  const seen: Traced[] = [];
  await channel.consume(
    queue,
    (message) => {
      if (message === null) return;
      const headers = message.properties.headers ?? {};
      const keys = headers.routing_keys as unknown[];
      const properties = (headers.properties ?? {}) as Record<string, unknown>;
      seen.push({
        routingKey: String(keys[0]),
        eventId: String(properties.message_id),
        userId: properties.user_id === undefined ? undefined : String(properties.user_id),
      });
    },
    { noAck: true },
  );
  return {
    seen,
    stop: async () => {
      await (await broker()).tracing(vhost, false).catch(() => {});
      await connection.close().catch(() => {});
    },
  };
}

test("through a worker that binds no per-shard queue: the shard's key comes back, the event goes again with tool.<name>, and so do the next ones for a while", async () => {
  const stack = await Stack.create();
  let trace: Awaited<ReturnType<typeof traceToolCalls>> | undefined;
  let kit: Harnessed | undefined;
  let eager: Harnessed | undefined;
  try {
    await stack.worker();
    trace = await traceToolCalls(stack.amqpUrl, stack.vhost ?? "/");
    kit = await connectClient(stack.amqpUrl, { perShardRetryMs: 600_000 });
    assert.equal(kit.client.routingKeyFor(), `tool.create_long_term_memory.shard.${SHARD}`);
    assert.equal(kit.client.publishingAs, "guest");

    const first = await kit.client.createMemory({
      toolCallId: callId(),
      arguments: { memory_content: "{user} likes dogs", memory_scope: "server_wide" },
      context: worldContext(stack.personaId),
    });
    assert.equal(first.status, "memory_saved_successfully");
    // within the window the next event goes with tool.<name> at once, for both tool names
    assert.equal(kit.client.routingKeyFor(), "tool.create_long_term_memory");
    assert.equal(kit.client.routingKeyFor("remember_this_fact"), "tool.remember_this_fact");
    const second = await kit.client.createMemory({
      toolCallId: callId(),
      toolName: "remember_this_fact",
      arguments: { memory_content: "{user} likes cats", memory_scope: "server_wide" },
      context: worldContext(stack.personaId),
    });
    assert.equal(second.status, "memory_saved_successfully");

    // with a window of 1 ms every event tries the shard's key first
    eager = await connectClient(stack.amqpUrl, { shardId: SHARD + 1, perShardRetryMs: 1 });
    const third = await eager.client.createMemory({
      toolCallId: callId(),
      arguments: { memory_content: "{user} likes owls", memory_scope: "server_wide" },
      context: worldContext(stack.personaId),
    });
    assert.equal(third.status, "memory_saved_successfully");

    const wire = trace.seen;
    await waitFor("the traced publishes", () => wire.length >= 5);
    const keysOf = (eventId: string) => wire.filter((t) => t.eventId === eventId).map((t) => t.routingKey);
    assert.deepEqual(keysOf(first.event_id), [`tool.create_long_term_memory.shard.${SHARD}`, "tool.create_long_term_memory"]);
    assert.deepEqual(keysOf(second.event_id), ["tool.remember_this_fact"]);
    assert.deepEqual(keysOf(third.event_id), [`tool.create_long_term_memory.shard.${SHARD + 1}`, "tool.create_long_term_memory"]);
    // every publish carries the user of the URL as user_id
    assert.deepEqual([...new Set(wire.map((t) => t.userId))], ["guest"]);
    // one memory each: the returned copy was enqueued nowhere
    const rows = await stack.db.query<{ n: string }>("SELECT count(*) AS n FROM server_memories");
    assert.equal(Number(rows.rows[0]?.n), 3);
  } finally {
    await kit?.client.close();
    await eager?.client.close();
    await trace?.stop();
    await stack.dispose();
  }
});

test("with the shard's own queue bound (as the workers bind it): the event lands there by the shard's key, with user_id and every property", async () => {
  const vhost = await createVhost();
  let kit: Harnessed | undefined;
  try {
    await declareExchanges(vhost.url, ownQueue);
    kit = await connectClient(vhost.url);
    const calls = [outcome(kit), outcome(kit, { toolName: "remember_this_fact", eventId: randomUUID() })];
    await waitFor("the broker's confirms", () => kit?.client.unconfirmed === 0 && kit.client.inFlight === 2);
    const raw = await amqp.connect(vhost.url);
    try {
      const channel = await raw.createChannel();
      const taken: amqp.GetMessage[] = [];
      for (let i = 0; i < 2; i += 1) {
        const message = await channel.get(OWN_QUEUE, { noAck: true });
        assert.ok(message !== false, "an event in the shard's own queue");
        taken.push(message);
      }
      assert.deepEqual(
        taken.map((m) => m.fields.routingKey).sort(),
        TOOLS.map((tool) => `tool.${tool}.shard.${SHARD}`).sort(),
      );
      for (const message of taken) {
        assert.equal(message.properties.userId, "guest");
        assert.equal(message.properties.contentType, "application/json");
        assert.equal(message.properties.deliveryMode, 2);
        assert.equal(message.properties.type, "tool_call.v1");
        const body = JSON.parse(message.content.toString()) as { event_id: string; tool_call_id: string; shard_id: number };
        assert.equal(message.properties.messageId, body.event_id);
        assert.equal(message.properties.correlationId, body.tool_call_id);
        assert.equal(body.shard_id, SHARD);
      }
      // the routing stays on the shard's key: nothing came back
      assert.equal(kit.client.routingKeyFor(), `tool.create_long_term_memory.shard.${SHARD}`);
    } finally {
      await raw.close();
    }
    await kit.client.close();
    for (const error of await Promise.all(calls)) assert.ok(error instanceof LtmClosedError, String(error));
  } finally {
    await kit?.client.close();
    await vhost.delete();
  }
});

test("one guild cannot fill its shard's queue ahead of the others: past guildInFlightMax calls waiting, LtmGuildBusyError at once, unpublished; the shard's other guild and a direct message still publish", async () => {
  const vhost = await createVhost();
  let kit: Harnessed | undefined;
  try {
    await declareExchanges(vhost.url, ownQueue);
    kit = await connectClient(vhost.url, { guildInFlightMax: 3 });
    const loud = worldContext(7);
    const calls = [outcome(kit, { context: loud }), outcome(kit, { context: loud }), outcome(kit, { context: loud })];
    await waitFor("the guild's three confirmed", () => kit?.client.unconfirmed === 0 && kit.client.inFlight === 3);
    const busy = await outcome(kit, { context: loud });
    assert.ok(busy instanceof LtmGuildBusyError, String(busy));
    assert.equal(busy.guild, loud.guild_disc_id);
    assert.equal(busy.waiting, 3);
    assert.equal(busy.code, "guild_busy");
    assert.equal(kit.client.inFlight, 3);
    calls.push(
      outcome(kit, { context: worldContext(7, { guildId: "1150000000000000999" }) }),
      outcome(kit, { context: worldContext(7, { guildId: null }) }),
    );
    await waitFor("the other guild and the direct message confirmed", () => kit?.client.unconfirmed === 0 && kit.client.inFlight === 5);
    const raw = await amqp.connect(vhost.url);
    try {
      const channel = await raw.createChannel();
      const { messageCount } = await channel.checkQueue(OWN_QUEUE);
      assert.equal(messageCount, 5); // the refused one was never published
    } finally {
      await raw.close();
    }
    await kit.client.close();
    for (const error of await Promise.all(calls)) assert.ok(error instanceof LtmClosedError, String(error));
  } finally {
    await kit?.client.close();
    await vhost.delete();
  }
});

test("a queue at its bound nacks: LtmBacklogFullError names the shard's own queue, or the common one for tool.<name>", async () => {
  const vhost = await createVhost();
  const kits: Harnessed[] = [];
  try {
    await declareExchanges(vhost.url, async (channel) => {
      await channel.assertQueue(OWN_QUEUE, { durable: true, arguments: workQueueArguments(1) });
      await channel.bindQueue(OWN_QUEUE, "tomori.tool_calls", `tool.create_long_term_memory.shard.${SHARD}`);
      await channel.assertQueue("ltm.create_memory", { durable: true, arguments: workQueueArguments(1) });
      await channel.bindQueue("ltm.create_memory", "tomori.tool_calls", "tool.create_long_term_memory");
    });
    for (const perShardRouting of [true, false]) {
      const kit = await connectClient(vhost.url, { perShardRouting });
      kits.push(kit);
      // events go in until the queue is over its bound (a quorum queue takes one past x-max-length)
      const waiting: Array<Promise<ToolResult | Error>> = [];
      let refused: ToolResult | Error | undefined;
      while (refused === undefined && waiting.length < 5) {
        const call = outcome(kit);
        const inFlight = kit.client.inFlight;
        const settled = await Promise.race([call, waitFor("the confirm", () => kit.client.unconfirmed === 0 && kit.client.inFlight === inFlight)]);
        if (settled === true) waiting.push(call);
        else refused = settled;
      }
      assert.ok(refused instanceof LtmBacklogFullError, String(refused));
      assert.ok(refused instanceof LtmPublishRejectedError, "a subclass of the nack's error");
      assert.equal(refused.code, "backlog_full");
      assert.equal(refused.shardId, SHARD);
      assert.equal(refused.perShard, perShardRouting);
      if (perShardRouting) {
        assert.equal(refused.queue, OWN_QUEUE);
        assert.equal(refused.routingKey, `tool.create_long_term_memory.shard.${SHARD}`);
        assert.match(refused.message, /shard 3's own queue ltm\.create_memory\.shard\.3 is at its bound/);
      } else {
        assert.equal(refused.queue, "ltm.create_memory");
        assert.equal(refused.routingKey, "tool.create_long_term_memory");
        assert.match(refused.message, /the common work queue ltm\.create_memory is at its bound/);
      }
      assert.match(refused.message, /Slow down and retry later with the same eventId; check that workers run/);
      assert.ok(waiting.length >= 1 && waiting.length <= 2, `${waiting.length} events taken before the refusal`);
      assert.equal(kit.client.inFlight, waiting.length, "the refused call is over, the others still wait");
      await kit.client.close();
      for (const call of waiting) assert.ok((await call) instanceof LtmClosedError);
    }
  } finally {
    for (const kit of kits) await kit.client.close();
    await vhost.delete();
  }
});

test("a user_id that is not the connection's user: LtmIdentityError, and at once for every later call; userId false sends none", async () => {
  const vhost = await createVhost();
  const kits: Harnessed[] = [];
  try {
    await declareExchanges(vhost.url, async (channel) => {
      await channel.assertQueue("parked", { durable: true });
      await channel.bindQueue("parked", "tomori.tool_calls", "tool.#");
    });
    const wrong = await connectClient(vhost.url, { userId: "shard-4" });
    kits.push(wrong);
    const refused = await outcome(wrong);
    assert.ok(refused instanceof LtmIdentityError, String(refused));
    assert.equal(refused.code, "identity_refused");
    assert.equal(refused.userId, "shard-4");
    assert.match(refused.message, /user_id "shard-4" is not the user this connection logged in as \(PRECONDITION_FAILED - user_id property set to 'shard-4' but authenticated user was 'guest'\)/);
    assert.ok(wrong.log.items.some((line) => line.level === "error" && /refused the events' user_id/.test(line.message)));
    // every later call fails the same way without a publish
    const again = await outcome(wrong);
    assert.ok(again instanceof LtmIdentityError, String(again));
    assert.equal(wrong.client.inFlight, 0);

    const anonymous = await connectClient(vhost.url, { userId: false });
    kits.push(anonymous);
    assert.equal(anonymous.client.publishingAs, null);
    const pending = outcome(anonymous);
    await waitFor("the confirm", () => anonymous.client.unconfirmed === 0 && anonymous.client.inFlight === 1);
    const raw = await amqp.connect(vhost.url);
    try {
      const channel = await raw.createChannel();
      const message = await channel.get("parked", { noAck: true });
      assert.ok(message !== false);
      assert.equal(message.properties.userId, undefined);
    } finally {
      await raw.close();
    }
    await anonymous.client.close();
    assert.ok((await pending) instanceof LtmClosedError);
  } finally {
    for (const kit of kits) await kit.client.close();
    await vhost.delete();
  }
});

test("a shard user whose topic permission predates the shard's key: the refusal moves the client to tool.<name> for good; a refused tool.<name> fails the call", async () => {
  const stack = await Stack.create();
  const vhost = stack.vhost ?? "/";
  const users = [`ltm-ts-old-${hex()}`, `ltm-ts-narrow-${hex()}`];
  const password = hex() + hex();
  const kits: Harnessed[] = [];
  try {
    await stack.worker();
    // the users of a deployment from before per-shard keys: tool.<name> only; and one allowed remember_this_fact only
    const topics = ["^tool\\.[A-Za-z0-9_]+$", `^tool\\.remember_this_fact(\\.shard\\.${SHARD + 1})?$`];
    for (const [i, user] of users.entries()) {
      const admin = await broker();
      await admin.addUser(user, password);
      await admin.setPermissions(vhost, user, ".*", ".*", ".*");
      await admin.setTopicPermissions(vhost, user, "tomori.tool_calls", topics[i] ?? "^$", "^$");
    }
    const urlOf = (user: string) => {
      const url = new URL(stack.amqpUrl);
      url.username = user;
      url.password = password;
      return url.toString();
    };

    const old = await connectClient(urlOf(users[0] ?? ""));
    kits.push(old);
    assert.equal(old.client.publishingAs, users[0]);
    const saved = await old.client.createMemory({
      toolCallId: callId(),
      arguments: { memory_content: "{user} likes old permissions", memory_scope: "server_wide" },
      context: worldContext(stack.personaId),
    });
    assert.equal(saved.status, "memory_saved_successfully");
    assert.equal(old.client.routingKeyFor(), "tool.create_long_term_memory");
    const warning = old.log.items.find((line) => line.level === "warn" && /refused this shard's own routing key/.test(line.message));
    assert.ok(warning, "a warning names the refusal");
    assert.match(String(warning.fields.error), /ACCESS_REFUSED/);

    const narrow = await connectClient(urlOf(users[1] ?? ""), { shardId: SHARD + 1 }); // a shard id of its own
    kits.push(narrow);
    const refused = await outcome(narrow, { context: worldContext(stack.personaId) });
    assert.ok(refused instanceof LtmPublishRefusedError, String(refused));
    assert.equal(refused.code, "publish_refused");
    assert.equal(refused.routingKey, "tool.create_long_term_memory");
    assert.match(refused.message, /the shard's user may not publish it to tomori\.tool_calls/);
    // the other tool name is allowed (with tool.<name>: the first refusal was of the shard's own key)
    const allowed = await narrow.client.createMemory({
      toolCallId: callId(),
      toolName: "remember_this_fact",
      arguments: { memory_content: "{user} likes narrow permissions", memory_scope: "server_wide" },
      context: worldContext(stack.personaId),
    });
    assert.equal(allowed.status, "memory_saved_successfully");
  } finally {
    for (const kit of kits) await kit.client.close();
    for (const user of users) await (await broker()).deleteUser(user).catch(() => {});
    await stack.dispose();
  }
});
