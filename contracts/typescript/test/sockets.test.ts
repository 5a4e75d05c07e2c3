// Every TCP socket the kit opens has Nagle's algorithm off. With it on (amqplib's and Node's default), each
// small publish or ack waits for the previous segment's TCP ack: a round trip through the worker took
// about 20 ms instead of 8 (issue 20). The test reads the option on the sockets themselves.
import assert from "node:assert/strict";
import net from "node:net";
import { test } from "node:test";

import { InvalidationSubscriber } from "../src/index.js";
import { REDIS_URL, Stack } from "./harness.js";
import { callId, connectClient, recordingLogger, worldContext } from "./kit.js";

/** Node keeps the socket's TCP_NODELAY setting under this symbol (net.js `kSetNoDelay`). */
function noDelayOf(socket: net.Socket): boolean {
  const key = Object.getOwnPropertySymbols(socket).find((s) => s.description === "kSetNoDelay");
  assert.ok(key !== undefined, "this Node keeps no kSetNoDelay on its sockets: the test cannot read the option");
  return (socket as unknown as Record<symbol, unknown>)[key] === true;
}

/** The sockets opened while `body` runs (every net.Socket connect goes through the prototype). */
async function socketsOpenedBy<T>(body: () => Promise<T>): Promise<{ value: T; sockets: net.Socket[] }> {
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
