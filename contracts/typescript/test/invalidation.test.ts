// Case 7: the invalidation subscriber across a Redis restart, on a private redis-server (the machine's
// Redis on 6379 is never restarted).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Redis } from "ioredis";

import { INVALIDATION_CHANNEL, InvalidationSubscriber, invalidationIdOf, type ServerStateInvalidation, type UserInvalidation } from "../src/index.js";
import { Inbox, PrivateRedis, waitFor } from "./harness.js";
import { recordingLogger } from "./kit.js";

async function publish(url: string, message: object): Promise<number> {
  const redis = new Redis(url);
  try {
    return await redis.publish(INVALIDATION_CHANNEL, JSON.stringify(message));
  } finally {
    redis.disconnect();
  }
}

test("invalidations by kind; after a Redis restart the subscriber resubscribes and says so", async () => {
  const server = await PrivateRedis.start();
  const states = new Inbox<ServerStateInvalidation>();
  const users = new Inbox<UserInvalidation>();
  let resubscribed = 0;
  const { logger, lines } = recordingLogger();
  const subscriber = await InvalidationSubscriber.start({
    url: server.url,
    onServerState: states.push,
    onUser: users.push,
    onResubscribed: () => {
      resubscribed += 1;
    },
    logger,
    maxReconnectDelayMs: 500,
  });
  try {
    const user = { schema_version: 1, invalidation_id: invalidationIdOf("0b4f5a3e-8d1f-4d6c-9a1e-1f2d3c4b5a60"), kind: "user", user_disc_id: "1150000000000000201" };
    assert.equal(await publish(server.url, user), 1, "one subscriber");
    assert.deepEqual(await users.waitFor("the user invalidation", () => true), user);
    // a message of another kind (a future version) is logged and dropped, not dispatched
    await publish(server.url, { schema_version: 2, invalidation_id: "x", kind: "persona" });
    await lines.waitFor("the unknown kind to be dropped", (l) => l.message === "dropped an invalidation of an unknown kind");
    assert.equal(states.items.length + users.items.length, 1);
    assert.equal(resubscribed, 0);

    await server.restart();
    await waitFor("onResubscribed after the restart", () => resubscribed === 1);
    assert.equal(subscriber.subscriptionCount, 2);
    const state = { schema_version: 1, invalidation_id: invalidationIdOf("5d7e0c1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"), kind: "tomori_state", server_disc_id: "1150000000000000001" };
    assert.equal(await publish(server.url, state), 1, "subscribed again");
    assert.deepEqual(await states.waitFor("the state invalidation after the restart", () => true), state);
  } finally {
    await subscriber.close();
    await server.stop();
  }
});

