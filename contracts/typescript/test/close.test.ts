// A clean close: `close()` right after the last `createMemory` acks that result before the connection
// goes, so the next process of the shard is not handed it again as "a result no call waits for"
// (newcomer review 3, row 6: 7 of 7 runs without a delay before close()).
import assert from "node:assert/strict";
import { test } from "node:test";

import * as amqp from "amqplib";

import { shardQueues } from "../src/index.js";
import { Stack } from "./harness.js";
import { callId, connectClient, worldContext } from "./kit.js";

test("save, close at once, reconnect: no late result, nothing left in the shard's queues", async () => {
  const stack = await Stack.create();
  try {
    await stack.worker();
    const rounds = 5;
    for (let round = 0; round < rounds; round += 1) {
      const kit = await connectClient(stack.amqpUrl);
      let closed = false;
      try {
        // the next process sees what the previous one left: a result it did not ack comes first
        // (a requeued message keeps its place), before this round's own result
        const result = await kit.client.createMemory({
          toolCallId: callId(),
          arguments: { memory_content: `{user} likes round ${round}`, memory_scope: "server_wide" },
          context: worldContext(stack.personaId),
        });
        assert.equal(result.status, "memory_saved_successfully");
        await kit.client.close(); // at once: no delay after the result
        closed = true;
        assert.deepEqual(
          kit.late.items.map(({ result: r, info }) => `${r.event_id} ${info.reason}`),
          [],
          `round ${round}: a result already delivered came back as late`,
        );
        const stray = kit.log.items.filter((line) => line.message === "a result no call waits for");
        assert.deepEqual(stray, [], `round ${round}: the kit logged a result no call waits for`);
      } finally {
        if (!closed) await kit.client.close();
      }
    }

    // no result is left unacked once the last client is gone (a notice may be: it can arrive after the
    // close, and the next process shows it)
    const { results } = shardQueues(3);
    const connection = await amqp.connect(stack.amqpUrl);
    try {
      const channel = await connection.createChannel();
      assert.equal((await channel.checkQueue(results)).messageCount, 0, "a result was left in the shard's queue");
    } finally {
      await connection.close();
    }
  } finally {
    await stack.dispose();
  }
});
