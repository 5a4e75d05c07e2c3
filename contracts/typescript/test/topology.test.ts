// What the client does when the topology is not there: no exchanges (connect fails), or exchanges but no
// work queue bound (the publish is returned: LtmUnroutableError). No worker needed.
import assert from "node:assert/strict";
import { test } from "node:test";

import * as amqp from "amqplib";

import { LtmClient, LtmClosedError, LtmEventTooLargeError, LtmUnroutableError } from "../src/index.js";
import { createVhost, waitFor } from "./harness.js";
import { callId, connectClient, recordingLogger, worldContext } from "./kit.js";

test("connect fails when the exchanges do not exist (the client never declares them)", async () => {
  const vhost = await createVhost();
  try {
    const { logger } = recordingLogger();
    await assert.rejects(
      LtmClient.connect({ url: vhost.url, shardId: 1, logger, reconnect: { startupRetries: 0 } }),
      /NOT_FOUND - no exchange 'tomori\.tool_calls'/,
    );
    // and it did not create them behind our back
    const raw = await amqp.connect(vhost.url);
    try {
      const channel = await raw.createChannel();
      channel.on("error", () => {});
      await assert.rejects(channel.checkExchange("tomori.tool_calls"), /NOT_FOUND/);
    } finally {
      await raw.close().catch(() => {});
    }
  } finally {
    await vhost.delete();
  }
});

test("an event nothing is bound to is returned by the broker: the call rejects with LtmUnroutableError", async () => {
  const vhost = await createVhost();
  try {
    const raw = await amqp.connect(vhost.url);
    try {
      const channel = await raw.createChannel();
      for (const exchange of ["tomori.tool_calls", "tomori.tool_results", "tomori.notifications"]) {
        await channel.assertExchange(exchange, "topic", { durable: true });
      }
    } finally {
      await raw.close();
    }
    const kit = await connectClient(vhost.url);
    try {
      const error = await kit.client
        .createMemory({ toolCallId: callId(), arguments: { memory_content: "x" }, context: worldContext(7) })
        .then(
          () => assert.fail("an unroutable event resolved"),
          (e: unknown) => e,
        );
      assert.ok(error instanceof LtmUnroutableError, String(error));
      assert.equal(error.routingKey, "tool.create_long_term_memory");
      assert.match(error.message, /NO_ROUTE/);
      assert.equal(kit.client.inFlight, 0);
      // a body over 256 KiB is refused before it is published (the worker would answer nothing)
      await assert.rejects(
        kit.client.createMemory({ toolCallId: callId(), arguments: { memory_content: "x".repeat(300_000) }, context: worldContext(7) }),
        (e: unknown) => e instanceof LtmEventTooLargeError && e.bytes > 300_000,
      );
      assert.equal(kit.client.inFlight, 0);
      // the shard's own queues were declared and bound by the client
      const check = await amqp.connect(vhost.url);
      try {
        const channel = await check.createChannel();
        const results = await channel.checkQueue("tomori.shard.3.results");
        assert.equal(results.consumerCount, 1);
        const notices = await channel.checkQueue("tomori.shard.3.notifications");
        assert.equal(notices.consumerCount, 1);
      } finally {
        await check.close();
      }
    } finally {
      await kit.client.close();
    }
  } finally {
    await vhost.delete();
  }
});

test("close() ends the calls still waiting with LtmClosedError; later calls fail at once", async () => {
  const vhost = await createVhost();
  try {
    const raw = await amqp.connect(vhost.url);
    try {
      const channel = await raw.createChannel();
      for (const exchange of ["tomori.tool_calls", "tomori.tool_results", "tomori.notifications"]) {
        await channel.assertExchange(exchange, "topic", { durable: true });
      }
      // a queue that takes the events and never answers, like a stopped worker's
      await channel.assertQueue("parked", { durable: true });
      await channel.bindQueue("parked", "tomori.tool_calls", "tool.#");
    } finally {
      await raw.close();
    }
    const kit = await connectClient(vhost.url);
    // the outcome is taken at once, so the rejection close() causes is handled when it happens
    const waiting = kit.client
      .createMemory({ toolCallId: callId(), arguments: {}, context: worldContext(7) })
      .then(() => null, (e: unknown) => e);
    await waitFor("the broker's confirm", () => kit.client.unconfirmed === 0);
    await kit.client.close();
    const error = await waiting;
    assert.ok(error instanceof LtmClosedError, String(error));
    assert.match(error.message, /may still be saved/);
    await assert.rejects(kit.client.createMemory({ toolCallId: callId(), arguments: {}, context: worldContext(7) }), LtmClosedError);
  } finally {
    await vhost.delete();
  }
});
