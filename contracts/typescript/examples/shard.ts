// A shard's whole LTM integration (type-checked by `npm test`; see README.md).
import {
  InvalidationSubscriber,
  LtmClient,
  LtmGuildBusyError,
  LtmTimeoutError,
  buildContext,
  noticeToEmbed,
  type ToolResult,
} from "@tomoribot/ltm-client";

// What the shard already has: its id, caches, and a way to post into Discord.
declare const shardId: number;
declare const caches: { dropServer(id: string): void; dropUser(id: string): void; dropAll(): void };
declare function postEmbed(channelId: string, webhookId: string | null, embed: object, fullContent: string | null): Promise<void>;

const ltm = await LtmClient.connect({
  // the shard's own RabbitMQ user (deploy/README.md): shard-<shardId>, confined to this shard's queues
  url: process.env.LTM_RABBITMQ_URL ?? `amqp://shard-${shardId}:shard-${shardId}-dev-password@127.0.0.1:5672/`,
  shardId,
  onNotice: async (notification) => {
    const { embed, fullContent, expandable } = noticeToEmbed(notification);
    const channel = notification.thread_id ?? notification.channel_disc_id;
    await postEmbed(channel, notification.reply_via?.webhook_disc_id ?? null, embed, expandable ? fullContent : null);
  },
  onLateResult: (result, { reason }) => console.warn(`LTM result ${result.status} for ${result.tool_call_id} came ${reason}`),
});

const invalidations = await InvalidationSubscriber.start({
  // the shards' Redis user (deploy/redis/users.acl): it may subscribe to the invalidations, nothing else
  url: process.env.LTM_REDIS_URL ?? "redis://shard:shard-dev-password@127.0.0.1:6379/0",
  onServerState: (m) => caches.dropServer(m.server_disc_id),
  onUser: (m) => caches.dropUser(m.user_disc_id),
  onResubscribed: () => caches.dropAll(), // messages sent while Redis was away are gone
});

/** The tool handler the model's `create_long_term_memory` call runs: returns what the model is shown. */
export async function createLongTermMemory(toolCallId: string, args: unknown, message: {
  guildId: string | null; channelId: string; authorId: string; botId: string; personaId: number;
  members: Array<{ userId: string; username: string; globalName: string | null; nickname: string | null }>;
}): Promise<ToolResult | { success: false; error: string }> {
  const context = buildContext({
    guildId: message.guildId,
    channelId: message.channelId,
    userId: message.authorId,
    botUserId: message.botId,
    personaId: message.personaId,
    members: message.members, // with the author in it: the notice names people from here
  });
  try {
    return await ltm.createMemory({ toolCallId, arguments: args, context });
  } catch (error) {
    if (error instanceof LtmTimeoutError) {
      return { success: false, error: "The memory service is slow; the memory may still be saved." };
    }
    if (error instanceof LtmGuildBusyError) {
      // this guild already has 64 saves waiting: a loop calling the tool, most likely
      return { success: false, error: "The memory service is busy in this server; nothing was saved, try later." };
    }
    throw error;
  }
}

process.once("SIGTERM", async () => {
  await ltm.close();
  await invalidations.close();
});
