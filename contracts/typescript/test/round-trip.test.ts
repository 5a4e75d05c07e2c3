// Cases 1-3: saves, a bad-argument failure, and a re-emitted result after a worker restart, against the
// real worker, RabbitMQ, Postgres and Redis.
import assert from "node:assert/strict";
import { test } from "node:test";

import * as amqp from "amqplib";

import {
  InvalidationSubscriber,
  invalidationIdOf,
  noticeToEmbed,
  type ServerStateInvalidation,
  type UserInvalidation,
} from "../src/index.js";
import { GUILD, Inbox, REDIS_URL, SPARROW, Stack } from "./harness.js";
import { callId, connectClient, worldContext, type Harnessed } from "./kit.js";

const TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

test("a server-wide and a personal save: typed results, one notice each, invalidations of the right kind", async () => {
  const stack = await Stack.create();
  const states = new Inbox<ServerStateInvalidation>();
  const users = new Inbox<UserInvalidation>();
  const invalidations = await InvalidationSubscriber.start({ url: REDIS_URL, onServerState: states.push, onUser: users.push });
  let spy: amqp.ChannelModel | null = null;
  let kit: Harnessed | undefined;
  try {
    await stack.worker();
    kit = await connectClient(stack.amqpUrl);
    // a second queue on the events' exchange shows what the kit puts on the wire (bound with the keys the worker
    // binds: a wildcard would take the shard's own key, routed to no worker here, and nothing would come back)
    spy = await amqp.connect(stack.amqpUrl);
    const spyChannel = await spy.createChannel();
    const { queue } = await spyChannel.assertQueue("", { exclusive: true });
    for (const tool of ["create_long_term_memory", "remember_this_fact"]) {
      await spyChannel.bindQueue(queue, "tomori.tool_calls", `tool.${tool}`);
    }
    const published = new Inbox<amqp.ConsumeMessage>();
    await spyChannel.consume(queue, (m) => m && published.push(m), { noAck: true });

    const serverCall = callId();
    const server = await kit.client.createMemory({
      toolCallId: serverCall,
      arguments: { memory_content: "{user} likes dogs", memory_scope: "server_wide" },
      context: worldContext(stack.personaId),
      traceparent: TRACEPARENT,
    });
    const personal = await kit.client.createMemory({
      toolCallId: callId(),
      toolName: "remember_this_fact",
      arguments: { memory_content: "{user} likes cats", memory_scope: "target_user", target_user: "Sparrow" },
      context: worldContext(stack.personaId),
    });

    assert.equal(server.success, true);
    assert.equal(server.status, "memory_saved_successfully");
    assert.equal(server.tool_call_id, serverCall);
    assert.equal(server.tool_name, "create_long_term_memory");
    assert.equal(server.replayed, false);
    assert.equal(server.data.scope, "server_wide");
    const row = await stack.db.query("SELECT content FROM server_memories WHERE server_memory_id = $1", [server.data.memory_id]);
    assert.deepEqual(row.rows, [{ content: "{user} likes dogs" }]);

    assert.equal(personal.status, "memory_saved_successfully");
    assert.equal(personal.tool_name, "remember_this_fact");
    // the target is named by the matching participant's display label
    assert.ok("target_user" in personal.data, "a personal save's data names its target");
    assert.equal(personal.data.target_user, "Sparrow");

    // the event as published: every property of the contract
    const wire = await published.waitFor("the server event on the wire", (m) => m.properties.messageId === server.event_id);
    assert.equal(wire.fields.routingKey, "tool.create_long_term_memory");
    assert.equal(wire.properties.contentType, "application/json");
    assert.equal(wire.properties.deliveryMode, 2);
    assert.equal(wire.properties.correlationId, serverCall);
    assert.equal(wire.properties.type, "tool_call.v1");
    assert.equal(wire.properties.userId, "guest"); // the URL's user
    assert.equal(wire.properties.headers?.traceparent, TRACEPARENT);
    const body = JSON.parse(wire.content.toString()) as Record<string, unknown>;
    assert.equal(body.event_id, server.event_id);
    assert.equal(body.shard_id, 3);
    const personalWire = await published.waitFor("the personal event", (m) => m.properties.messageId === personal.event_id);
    assert.equal(personalWire.fields.routingKey, "tool.remember_this_fact");

    const serverNotice = await kit.notices.waitFor("server notice", (n) => n.event_id === server.event_id);
    const personalNotice = await kit.notices.waitFor("personal notice", (n) => n.event_id === personal.event_id);
    assert.equal(serverNotice.notice.kind, "server_memory");
    assert.equal(personalNotice.notice.kind, "personal_memory");
    const embed = noticeToEmbed(serverNotice);
    assert.equal(embed.embed.title, serverNotice.notice.title);
    assert.equal(embed.embed.color, Number.parseInt(serverNotice.notice.accent_color.slice(1), 16));
    assert.equal(embed.fullContent, serverNotice.notice.full_content);

    const state = await states.waitFor("tomori_state invalidation", (m) => m.invalidation_id === invalidationIdOf(server.event_id));
    assert.equal(state.server_disc_id, GUILD);
    const user = await users.waitFor("user invalidation", (m) => m.invalidation_id === invalidationIdOf(personal.event_id));
    assert.equal(user.user_disc_id, SPARROW);
    // each save invalidates one kind only, and each notice reached the callback once
    assert.equal(users.items.filter((m) => m.invalidation_id === invalidationIdOf(server.event_id)).length, 0);
    assert.equal(states.items.filter((m) => m.invalidation_id === invalidationIdOf(personal.event_id)).length, 0);
    assert.equal(kit.notices.items.length, 2);
    assert.equal(kit.late.items.length, 0);
  } finally {
    await spy?.close().catch(() => {});
    await kit?.client.close();
    await invalidations.close();
    await stack.dispose();
  }
});

test("bad arguments: memory_save_failed_invalid_args, no notice", async () => {
  const stack = await Stack.create();
  let kit: Harnessed | undefined;
  try {
    await stack.worker();
    kit = await connectClient(stack.amqpUrl);
    const notAnObject = await kit.client.createMemory({
      toolCallId: callId(),
      arguments: "remember that",
      context: worldContext(stack.personaId),
    });
    assert.equal(notAnObject.success, false);
    assert.equal(notAnObject.status, "memory_save_failed_invalid_args");
    assert.equal(notAnObject.error, "Invalid parameters: arguments must be an object");
    assert.equal(notAnObject.message, null);

    const noContent = await kit.client.createMemory({
      toolCallId: callId(),
      arguments: { memory_scope: "server_wide" },
      context: worldContext(stack.personaId),
    });
    assert.equal(noContent.status, "memory_save_failed_invalid_args");
    assert.match(String(noContent.error), /memory_content/);
    const count = await stack.db.query("SELECT count(*)::int AS n FROM server_memories");
    assert.equal(count.rows[0].n, 0);
    assert.equal(kit.late.items.length, 0);
  } finally {
    await kit?.client.close();
    await stack.dispose();
  }
});

test("a result and notice re-emitted after a worker restart (replayed: true) are dropped: one result, one notice", async () => {
  const stack = await Stack.create();
  let kit: Harnessed | undefined;
  try {
    const first = await stack.worker();
    kit = await connectClient(stack.amqpUrl);
    const request = {
      toolCallId: callId(),
      arguments: { memory_content: "{user} likes tea", memory_scope: "server_wide" },
      context: worldContext(stack.personaId),
    };
    const result = await kit.client.createMemory(request);
    assert.equal(result.status, "memory_saved_successfully");
    assert.equal(result.replayed, false);
    await kit.notices.waitFor("the notice", (n) => n.event_id === result.event_id);

    // a crash, a new worker, and the same event again (as a redelivery would bring it)
    first.kill();
    await stack.worker();
    const raw = await amqp.connect(stack.amqpUrl);
    try {
      const channel = await raw.createConfirmChannel();
      const event = {
        schema_version: 1,
        event_id: result.event_id,
        tool_call_id: request.toolCallId,
        tool_name: "create_long_term_memory",
        issued_at: new Date().toISOString(),
        shard_id: 3,
        arguments: request.arguments,
        context: request.context,
      };
      channel.publish("tomori.tool_calls", "tool.create_long_term_memory", Buffer.from(JSON.stringify(event)), {
        persistent: true,
        contentType: "application/json",
        messageId: result.event_id,
        correlationId: request.toolCallId,
        type: "tool_call.v1",
      });
      await channel.waitForConfirms();
    } finally {
      await raw.close();
    }

    const dropped = await kit.log.waitFor(
      "the re-emitted result to be dropped",
      (line) => line.message === "duplicate result dropped" && line.fields.eventId === result.event_id,
    );
    assert.equal(dropped.fields.replayed, true);
    assert.equal(dropped.fields.status, "memory_saved_successfully");
    // the re-emit carries the notice again: shown once all the same
    await kit.log.waitFor(
      "the re-emitted notice to be dropped",
      (line) => line.message === "duplicate notice dropped" && line.fields.eventId === result.event_id,
    );
    assert.equal(kit.late.items.length, 0, "a same-status copy must not reach onLateResult");
    assert.equal(kit.notices.items.filter((n) => n.event_id === result.event_id).length, 1);
    const count = await stack.db.query("SELECT count(*)::int AS n FROM server_memories");
    assert.equal(count.rows[0].n, 1);
  } finally {
    await kit?.client.close();
    await stack.dispose();
  }
});
