// Every TCP socket the kit opens has Nagle's algorithm off. With it on (amqplib's and Node's default), each
// small publish or ack waits for the previous segment's TCP ack: a round trip through the worker took
// about 20 ms instead of 8 (issue 20). The test reads the option on the sockets themselves.
import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidationSubscriber } from "../src/index.js";
import { REDIS_URL, Stack } from "./harness.js";
import { callId, connectClient, noDelayOf, recordingLogger, socketsOpenedBy, worldContext } from "./kit.js";

test("the client's AMQP connection has no-delay on", async () => {
  const stack = await Stack.create();
  try {
    await stack.worker();
    const { value: kit, sockets } = await socketsOpenedBy(() => connectClient(stack.amqpUrl));
    try {
      const port = Number(new URL(stack.amqpUrl).port || 5672);
      assert.ok(sockets.length >= 1, "the client opened no socket");
      for (const socket of sockets) {
        assert.equal(socket.remotePort, port, "a socket to something other than the broker");
        assert.equal(noDelayOf(socket), true, "Nagle's algorithm is on for the client's AMQP socket");
      }
      // and the connection works
      const result = await kit.client.createMemory({
        toolCallId: callId(),
        arguments: { memory_content: "{user} likes fast replies", memory_scope: "server_wide" },
        context: worldContext(stack.personaId),
      });
      assert.equal(result.status, "memory_saved_successfully");
      for (const socket of sockets) assert.equal(noDelayOf(socket), true);
    } finally {
      await kit.client.close();
    }
  } finally {
    await stack.dispose();
  }
});

test("the invalidation subscriber's Redis connection has no-delay on", async () => {
  const { logger } = recordingLogger();
  const { value: subscriber, sockets } = await socketsOpenedBy(() =>
    InvalidationSubscriber.start({ url: REDIS_URL, logger }),
  );
  try {
    assert.ok(sockets.length >= 1, "the subscriber opened no socket");
    for (const socket of sockets) assert.equal(noDelayOf(socket), true, "Nagle's algorithm is on for the Redis socket");
  } finally {
    await subscriber.close();
  }
});
