// Unit tests (no services): buildContext, noticeToEmbed, the duplicate filter.
import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidContextError, MAX_GUILD_MEMBERS, SeenSet, buildContext, noticeToEmbed, parseColor, type Notification, type ToolResult } from "../src/index.js";

const base = {
  guildId: "1150000000000000001",
  channelId: "1150000000000000100",
  userId: "1150000000000000200",
  botUserId: "1150000000000000999",
  personaId: 7,
};

function snowflake(n: number): string {
  return String(1150000000000100000n + BigInt(n));
}

test("buildContext maps plain data to the contract's context", () => {
  const context = buildContext({
    ...base,
    threadId: "1150000000000000101",
    replyVia: { webhookId: "1150000000000000300", username: "Alter" },
    participants: [{ targetId: "@alice:matrix.org", displayLabel: "Alice", aliases: ["Alice"], isBridge: true }],
    members: [{ userId: "1150000000000000201", username: "sparrow_ow", globalName: "Sparrow" }],
  });
  assert.deepEqual(context, {
    guild_disc_id: "1150000000000000001",
    channel_disc_id: "1150000000000000100",
    thread_id: "1150000000000000101",
    triggering_user_disc_id: "1150000000000000200",
    bot_user_disc_id: "1150000000000000999",
    persona_id: 7,
    reply_via: { webhook_disc_id: "1150000000000000300", username: "Alter", avatar_url: null },
    participants: [{ target_id: "@alice:matrix.org", display_label: "Alice", aliases: ["Alice"], is_bridge: true }],
    guild_members: [
      { user_disc_id: "1150000000000000201", username: "sparrow_ow", global_name: "Sparrow", nickname: null, is_bot: false },
    ],
  });
  const dm = buildContext({ ...base, guildId: null, userId: null });
  assert.equal(dm.guild_disc_id, null);
  assert.equal(dm.triggering_user_disc_id, null);
  assert.deepEqual(dm.guild_members, []);
});

test("buildContext refuses ids that are not Discord snowflakes, naming the field", () => {
  for (const [field, value] of [
    ["guildId", "123"],
    ["channelId", "1150000000000000100x"],
    ["botUserId", "115000000000000000000001"],
    ["userId", ""],
  ] as const) {
    assert.throws(() => buildContext({ ...base, [field]: value }), (e: unknown) => e instanceof InvalidContextError && e.message.startsWith(field));
  }
  assert.throws(() => buildContext({ ...base, members: [{ userId: "alice", username: "a" }] }), /members\[0\]\.userId/);
  assert.throws(() => buildContext({ ...base, personaId: 1.5 }), InvalidContextError);
});

test("buildContext keeps 1,000 members: participants first, then the triggering user, then the given order", () => {
  const members = Array.from({ length: 1500 }, (_, i) => ({ userId: snowflake(i), username: `user${i}` }));
  members.push({ userId: base.userId, username: "trigger" });
  const context = buildContext({
    ...base,
    participants: [{ targetId: snowflake(1400), displayLabel: "late speaker" }],
    members: [...members, { userId: snowflake(3), username: "duplicate" }],
  });
  const ids = (context.guild_members ?? []).map((m) => m.user_disc_id);
  assert.equal(ids.length, MAX_GUILD_MEMBERS);
  assert.equal(ids[0], snowflake(1400));
  assert.equal(ids[1], base.userId);
  assert.equal(ids[2], snowflake(0));
  assert.equal(new Set(ids).size, ids.length);
  assert.equal(ids.at(-1), snowflake(997));
  assert.equal(context.guild_members?.find((m) => m.user_disc_id === snowflake(3))?.username, "user3");
});

const notification: Notification = {
  schema_version: 1,
  event_id: "6f1c1a9e-3b0e-4a53-9a55-6a4f0f0b9a11",
  guild_disc_id: "1150000000000000001",
  channel_disc_id: "1150000000000000100",
  thread_id: null,
  reply_via: null,
  notice: {
    kind: "personal_memory",
    title: "🧠 Tomori Learned Something New!",
    description: "A memory has been saved:\n```\npreview\n```",
    footer: "footer",
    accent_color: "#2ECC71",
    full_content: "the whole memory",
    expandable: true,
  },
};

test("noticeToEmbed gives embed fields, the colour as a number and the full content", () => {
  const rendered = noticeToEmbed(notification);
  assert.deepEqual(rendered, {
    embed: {
      title: "🧠 Tomori Learned Something New!",
      description: "A memory has been saved:\n```\npreview\n```",
      footer: { text: "footer" },
      color: 0x2ecc71,
    },
    fullContent: "the whole memory",
    expandable: true,
    kind: "personal_memory",
  });
  assert.deepEqual(noticeToEmbed(notification.notice), rendered);
  const odd = noticeToEmbed({ ...notification.notice, accent_color: "green", title: "x".repeat(300) });
  assert.equal(odd.embed.color, undefined);
  assert.equal(Array.from(odd.embed.title).length, 256);
  assert.equal(parseColor("3498db"), 0x3498db);
  assert.equal(parseColor("#34980"), undefined);
});

test("SeenSet forgets after its TTL and keeps at most its capacity, oldest out first", () => {
  let now = 0;
  const seen = new SeenSet<string>(3, 1000, () => now);
  seen.set("a", "1");
  seen.set("b", "2");
  seen.set("c", "3");
  seen.set("d", "4");
  assert.equal(seen.size, 3);
  assert.equal(seen.get("a"), undefined);
  assert.equal(seen.get("b"), "2");
  now = 999;
  assert.equal(seen.has("d"), true);
  now = 1000;
  assert.equal(seen.has("d"), false);
  seen.set("e", "5");
  assert.equal(seen.size, 1, "expired entries are evicted on insert");
});

/** What a shard writes to read a result: `status` narrows `data` (this file does not compile otherwise). */
function describe(result: ToolResult): string {
  switch (result.status) {
    case "memory_saved_successfully":
      return result.data.scope === "target_user"
        ? `memory ${result.data.memory_id} about ${result.data.target_user}`
        : `memory ${result.data.memory_id}`;
    case "memory_save_failed_limit_exceeded":
      return `limit ${result.data.current_count}/${result.data.max_allowed}: ${result.error}`;
    default:
      return result.error;
  }
}

test("the generated ToolResult narrows by status", () => {
  const saved = {
    schema_version: 1,
    event_id: "6f1c1a9e-3b0e-4a53-9a55-6a4f0f0b9a11",
    tool_call_id: "call_1",
    tool_name: "create_long_term_memory",
    success: true,
    status: "memory_saved_successfully",
    message: "Memory saved successfully",
    error: null,
    data: { status: "memory_saved_successfully", scope: "server_wide", memory_id: 123, content_saved: "x" },
    processed_at: "2026-12-02T08:00:00.120Z",
    replayed: false,
  } as const satisfies ToolResult;
  assert.equal(describe(saved), "memory 123");
});
