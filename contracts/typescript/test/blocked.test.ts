// RabbitMQ blocks the connection (a memory alarm, raised on a private node: the machine's broker is never
// alarmed): the shard hears it (onBlocked with the reason, a warning), a call made meanwhile waits and is
// answered once after the alarm clears (onUnblocked, a warning).
import assert from "node:assert/strict";
import { test } from "node:test";

import { PrivateRabbit, Stack, rabbitmqctl, sleep, waitFor } from "./harness.js";
import { callId, connectClient, worldContext } from "./kit.js";

const SET_ALARM = "rabbit_alarm:set_alarm({{resource_limit, memory, node()}, []}).";
const CLEAR_ALARM = "rabbit_alarm:clear_alarm({resource_limit, memory, node()}).";

test("a memory alarm: onBlocked and a warning, the call waits, onUnblocked, answered once", async () => {
  const rabbit = await PrivateRabbit.start();
  try {
    const stack = await Stack.create({ rabbitmqUrl: rabbit.url });
    try {
      await stack.worker();
      const blocked: string[] = [];
      let unblocked = 0;
      const kit = await connectClient(stack.amqpUrl, {
        onBlocked: (reason) => blocked.push(reason),
        onUnblocked: () => {
          unblocked += 1;
        },
      });
      try {
        const save = (content: string) =>
          kit.client.createMemory({
            toolCallId: callId(),
            arguments: { memory_content: content, memory_scope: "server_wide" },
            context: worldContext(stack.personaId),
            timeoutMs: 120_000,
          });
        assert.equal((await save("{user} likes calm brokers")).status, "memory_saved_successfully");
        assert.equal(kit.client.blocked, null);

        await rabbitmqctl(["eval", SET_ALARM], rabbit.node);
        try {
          // the broker blocks a connection when it publishes: this call's event is held
          const held = save("{user} likes patient brokers");
          await waitFor("onBlocked", () => blocked.length > 0, 60_000);
          assert.match(blocked[0] ?? "", /memory/i);
          assert.match(kit.client.blocked ?? "", /memory/i);
          const warning = kit.log.items.find((line) => line.message.startsWith("RabbitMQ blocked the connection"));
          assert.equal(warning?.level, "warn");
          // held while blocked: no answer yet, the call still waits
          await sleep(1_000);
          assert.equal(kit.client.inFlight, 1);
          assert.equal(unblocked, 0);

          // a client closed while blocked does not hang (the broker reads nothing, so nothing is waited for)
          const other = await connectClient(stack.amqpUrl, { shardId: 4 });
          const stuck = other.client.createMemory({
            toolCallId: callId(),
            arguments: { memory_content: "{user} likes leaving early", memory_scope: "server_wide" },
            context: worldContext(stack.personaId),
            timeoutMs: 120_000,
          });
          await waitFor("the second client to be blocked", () => other.client.blocked !== null, 60_000);
          const closing = Date.now();
          await other.client.close();
          assert.ok(Date.now() - closing < 20_000, `close() took ${Date.now() - closing} ms while blocked`);
          await assert.rejects(stuck, /closed/i);

          await rabbitmqctl(["eval", CLEAR_ALARM], rabbit.node);
          await waitFor("onUnblocked", () => unblocked > 0, 60_000);
          assert.equal(kit.client.blocked, null);
          const end = kit.log.items.find((line) => line.message === "RabbitMQ unblocked the connection");
          assert.equal(end?.level, "warn");
          assert.equal(end?.fields.ended, "unblocked");
          const result = await held;
          assert.equal(result.status, "memory_saved_successfully");
          assert.equal(result.replayed, false);
        } finally {
          await rabbitmqctl(["eval", CLEAR_ALARM], rabbit.node).catch(() => {});
        }
        assert.deepEqual(kit.late.items, [], "a result came twice");
        assert.equal(blocked.length, 1);
        assert.equal(unblocked, 1);
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
