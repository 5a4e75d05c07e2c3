// Case 4: RabbitMQ restarts while calls wait. Runs on a private RabbitMQ node (own name, ports and data
// directory) so the machine's broker, which other suites use, is never stopped.
import assert from "node:assert/strict";
import { test } from "node:test";

import { PrivateRabbit, Stack, waitFor } from "./harness.js";
import { callId, connectClient, worldContext } from "./kit.js";

test("a broker restart mid-call: the unconfirmed event is republished, every call is answered once", async () => {
  const rabbit = await PrivateRabbit.start();
  try {
    const stack = await Stack.create({ rabbitmqUrl: rabbit.url });
    try {
      const worker = await stack.worker();
      const kit = await connectClient(stack.amqpUrl);
      try {
        const save = (content: string, toolCallId = callId()) =>
          kit.client.createMemory({
            toolCallId,
            arguments: { memory_content: content, memory_scope: "server_wide" },
            context: worldContext(stack.personaId),
            timeoutMs: 30_000,
          });
        assert.equal((await save("before")).status, "memory_saved_successfully");

        // a call confirmed by the broker and waiting for its result when the broker goes down
        assert.equal(await worker.stop(), 0);
        const waiting = save("waiting");
        await waitFor("the broker's confirm", () => kit.client.unconfirmed === 0 && kit.client.inFlight === 1);

        await rabbit.stopApp();
        await waitFor("the client to see the broker go", () => !kit.client.connected);
        // a call made while the broker is down: not confirmed, so published again on the next connection
        const during = save("during");
        assert.equal(kit.client.unconfirmed, 1);

        await rabbit.startApp();
        await waitFor("the client to reconnect", () => kit.client.connected);
        await stack.worker();
        const [w, d] = await Promise.all([waiting, during]);
        assert.equal(w.status, "memory_saved_successfully");
        assert.equal(d.status, "memory_saved_successfully");
        const reconnect = await kit.log.waitFor("the reconnect's setup", (l) => l.message === "connected to RabbitMQ" && l.fields.republished === 1);
        assert.ok(reconnect);

        const rows = await stack.db.query("SELECT content, count(*)::int AS n FROM server_memories GROUP BY content ORDER BY content");
        assert.deepEqual(rows.rows, [
          { content: "before", n: 1 },
          { content: "during", n: 1 },
          { content: "waiting", n: 1 },
        ]);
        assert.equal(kit.late.items.length, 0);
        assert.equal(kit.client.inFlight, 0);
      } finally {
        await kit.client.close();
      }
    } finally {
      await stack.dispose();
    }
  } finally {
    await rabbit.stop();
  }
});
