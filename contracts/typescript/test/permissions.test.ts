// Case 8: the client runs as a user with exactly the `bot` permissions of deploy/rabbitmq/definitions.json,
// and that user cannot declare an exchange: the kit needs nothing more than the shipped definitions give.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import * as amqp from "amqplib";

import { REPO_ROOT, Stack, hex, rabbitmqctl } from "./harness.js";
import { callId, connectClient, worldContext } from "./kit.js";

interface Definitions {
  permissions: Array<{ user: string; configure: string; write: string; read: string }>;
  topic_permissions: Array<{ user: string; exchange: string; write: string; read: string }>;
}

test("as the `bot` user of the definitions: the client works, assertExchange is refused", async () => {
  const definitions = JSON.parse(readFileSync(join(REPO_ROOT, "deploy/rabbitmq/definitions.json"), "utf8")) as Definitions;
  const bot = definitions.permissions.find((p) => p.user === "bot");
  assert.ok(bot, "definitions.json has a bot user");
  const topics = definitions.topic_permissions.filter((p) => p.user === "bot");
  assert.ok(topics.length > 0);

  const stack = await Stack.create();
  const user = `ltm-ts-bot-${hex()}`;
  const password = hex() + hex();
  try {
    await stack.worker(); // declares the topology as an admin would, with the definitions
    const vhost = stack.vhost ?? "/";
    await rabbitmqctl(["add_user", user, password]);
    await rabbitmqctl(["set_permissions", "-p", vhost, user, bot.configure, bot.write, bot.read]);
    for (const t of topics) {
      await rabbitmqctl(["set_topic_permissions", "-p", vhost, user, t.exchange, t.write, t.read]);
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

    // what the kit deliberately does not do needs more than `bot` has
    const raw = await amqp.connect(url.toString());
    try {
      const channel = await raw.createChannel();
      channel.on("error", () => {});
      await assert.rejects(channel.assertExchange("tomori.tool_calls", "topic", { durable: true }), /ACCESS_REFUSED/);
    } finally {
      await raw.close().catch(() => {});
    }
  } finally {
    await rabbitmqctl(["delete_user", user]).catch(() => {});
    await stack.dispose();
  }
});
