// Cases 5 and 6: a call that times out and the result that comes afterwards; a second, different result
// after a dead letter is replayed. Neither may reach a call: both go to onLateResult.
import assert from "node:assert/strict";
import { test } from "node:test";

import { LtmTimeoutError } from "../src/index.js";
import { Stack } from "./harness.js";
import { callId, connectClient, worldContext } from "./kit.js";

test("no worker: the call times out; the result that comes later goes to onLateResult", async () => {
  const stack = await Stack.create();
  try {
    // the worker declares the topology, then stops: the event waits in ltm.create_memory
    const worker = await stack.worker();
    assert.equal(await worker.stop(), 0);
    const kit = await connectClient(stack.amqpUrl);
    try {
      const toolCallId = callId();
      const call = kit.client.createMemory({
        toolCallId,
        arguments: { memory_content: "{user} likes rain", memory_scope: "server_wide" },
        context: worldContext(stack.personaId),
        timeoutMs: 1_500,
      });
      const error = await call.then(
        () => assert.fail("the call resolved without a worker"),
        (e: unknown) => e,
      );
      assert.ok(error instanceof LtmTimeoutError, String(error));
      assert.equal(error.toolCallId, toolCallId);
      assert.equal(error.timeoutMs, 1_500);
      assert.match(error.message, /may still have been saved/);
      assert.equal(kit.client.inFlight, 0);

      await stack.worker();
      const late = await kit.late.waitFor("the late result", ({ result }) => result.event_id === error.eventId);
      assert.equal(late.info.reason, "timed_out");
      assert.equal(late.result.status, "memory_saved_successfully");
      assert.equal(late.result.tool_call_id, toolCallId);
      // the notice is still delivered once: the memory was saved
      await kit.notices.waitFor("the late notice", (n) => n.event_id === error.eventId);
      assert.equal(kit.late.items.length, 1);

      // retrying with the same event id is safe: the worker answers from its ledger, nothing is saved twice
      const retried = await kit.client.createMemory({
        toolCallId,
        eventId: error.eventId,
        arguments: { memory_content: "{user} likes rain", memory_scope: "server_wide" },
        context: worldContext(stack.personaId),
      });
      assert.equal(retried.status, "memory_saved_successfully");
      assert.equal(retried.replayed, true);
      assert.equal(retried.data.memory_id, late.result.data.memory_id);
      const count = await stack.db.query("SELECT count(*)::int AS n FROM server_memories");
      assert.equal(count.rows[0].n, 1);
    } finally {
      await kit.client.close();
    }
  } finally {
    await stack.dispose();
  }
});

test("a dead letter replayed after a failure: the success result goes to onLateResult, the notice to onNotice", async () => {
  const stack = await Stack.create();
  try {
    // a failure the worker does not expect (SQLSTATE P0001) for one content only
    await stack.db.query(`
      CREATE FUNCTION forced_failure() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN RAISE EXCEPTION 'forced failure for %', NEW.content; END $$;
      CREATE TRIGGER forced_failure BEFORE INSERT ON server_memories
          FOR EACH ROW WHEN (NEW.content = 'boom') EXECUTE FUNCTION forced_failure();
    `);
    await stack.worker();
    const kit = await connectClient(stack.amqpUrl);
    try {
      const failed = await kit.client.createMemory({
        toolCallId: callId(),
        arguments: { memory_content: "boom", memory_scope: "server_wide" },
        context: worldContext(stack.personaId),
      });
      assert.equal(failed.success, false);
      assert.equal(failed.status, "memory_save_failed_internal_error");

      await stack.db.query("DROP TRIGGER forced_failure ON server_memories");
      const replay = await stack.runWorker(["dlq", "replay"]);
      assert.match(replay, /moved 1, kept 0/);

      const late = await kit.late.waitFor("the replayed result", ({ result }) => result.event_id === failed.event_id);
      assert.equal(late.info.reason, "different_status");
      assert.equal(late.info.previousStatus, "memory_save_failed_internal_error");
      assert.equal(late.result.status, "memory_saved_successfully");
      assert.equal(late.result.success, true);
      const notice = await kit.notices.waitFor("the replay's notice", (n) => n.event_id === failed.event_id);
      assert.equal(notice.notice.full_content, "boom");
      const rows = await stack.db.query("SELECT content FROM server_memories");
      assert.deepEqual(rows.rows, [{ content: "boom" }]);
    } finally {
      await kit.client.close();
    }
  } finally {
    await stack.dispose();
  }
});
