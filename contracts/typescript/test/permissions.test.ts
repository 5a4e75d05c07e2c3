// Case 8: the client runs as a shard's own user, made by deploy/rabbitmq/shard_users.py exactly as an operator
// makes one (deploy/README.md; the Python suite checks the shipped `shard-0`/`shard-1` are the script's too). The
// kit needs nothing more; what it deliberately does not do, and another shard's queues and keys, are refused.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";

import * as amqp from "amqplib";

import { REPO_ROOT, Stack, broker, hex } from "./harness.js";
import { callId, connectClient, worldContext } from "./kit.js";

/** The shard id of connectClient (test/kit.ts). */
const SHARD_ID = 3;
const OTHER_SHARD = 4;

interface ShardDefinitions {
  permissions: Array<{ user: string; configure: string; write: string; read: string }>;
  topic_permissions: Array<{ user: string; exchange: string; write: string; read: string }>;
}

function shardDefinitions(shardId: number, vhost: string, password: string): ShardDefinitions {
  const script = join(REPO_ROOT, "deploy/rabbitmq/shard_users.py");
  const output = execFileSync(
    process.env.PYTHON ?? "python3",
    [script, "definitions", String(shardId), "--vhost", vhost, "--passwords", "-"],
    { input: `${password}\n`, encoding: "utf8" },
  );
  return JSON.parse(output) as ShardDefinitions;
}

async function refused(url: string, what: (channel: amqp.Channel) => Promise<unknown>): Promise<void> {
  const raw = await amqp.connect(url);
  try {
    const channel = await raw.createChannel();
    channel.on("error", () => {});
    await assert.rejects(what(channel), /ACCESS_REFUSED/);
  } finally {
    await raw.close().catch(() => {});
  }
}

test("as its shard's own user: the client works; assertExchange and another shard's queues and keys are refused", async () => {
  const stack = await Stack.create();
  const user = `ltm-ts-shard-${SHARD_ID}-${hex()}`;
  const password = hex() + hex();
  try {
    await stack.worker(); // declares the topology as an admin would, with the definitions
    const vhost = stack.vhost ?? "/";
    const shard = shardDefinitions(SHARD_ID, vhost, password);
    const [grant] = shard.permissions;
    assert.ok(grant);
    assert.equal(shard.topic_permissions.length, 3);
    const admin = await broker();
    await admin.addUser(user, password);
    await admin.setPermissions(vhost, user, grant.configure, grant.write, grant.read);
    for (const t of shard.topic_permissions) {
      await admin.setTopicPermissions(vhost, user, t.exchange, t.write, t.read);
    }
    const url = new URL(stack.amqpUrl);
    url.username = user;
    url.password = password;

    const kit = await connectClient(url.toString());
    try {
      const result = await kit.client.createMemory({
        toolCallId: callId(),
        arguments: { memory_content: "{user} likes least privilege", memory_scope: "server_wide" },
        context: worldContext(stack.personaId),
      });
      assert.equal(result.status, "memory_saved_successfully");
      await kit.notices.waitFor("the notice", (n) => n.event_id === result.event_id);
    } finally {
      await kit.client.close();
    }

    // a client told another shard id than its user's: connect fails (it may not declare shard 4's queues)
    await assert.rejects(
      connectClient(url.toString(), { shardId: OTHER_SHARD, reconnect: { initialDelayMs: 50, maxDelayMs: 100, startupRetries: 1 } }),
      /ACCESS_REFUSED/,
    );

    // what the kit deliberately does not do needs more than a shard's user has
    await refused(url.toString(), (ch) => ch.assertExchange("tomori.tool_calls", "topic", { durable: true }));
    // another shard's queues and keys
    await refused(url.toString(), (ch) => ch.assertQueue(`tomori.shard.${OTHER_SHARD}.results`, { durable: true }));
    await refused(url.toString(), (ch) =>
      ch.bindQueue(`tomori.shard.${SHARD_ID}.results`, "tomori.tool_results", `shard.${OTHER_SHARD}`),
    );
    await refused(url.toString(), (ch) =>
      ch.bindQueue(`tomori.shard.${SHARD_ID}.notifications`, "tomori.notifications", "#"),
    );
  } finally {
    await (await broker()).deleteUser(user).catch(() => {});
    await stack.dispose();
  }
});
