import { InvalidContextError } from "./errors.js";
import type { EventContext, GuildMember, Notice, Notification, Participant } from "./generated/index.js";
import type { ReplyVia } from "./types.js";

/** CONTRACT.md: a shard sends at most this many `guild_members`. */
export const MAX_GUILD_MEMBERS = 1000;

const SNOWFLAKE = /^[0-9]{17,20}$/;

/** A guild member as the shard knows it (from discord.js: `member.user.id`, `.username`, ...). */
export interface MemberInput {
  userId: string;
  username: string;
  globalName?: string | null;
  nickname?: string | null;
  isBot?: boolean;
}

/** One of the conversation's tool-target references. */
export interface ParticipantInput {
  /** a Discord id, or a bridge user's id (e.g. `@alice:matrix.org`) */
  targetId: string;
  displayLabel: string;
  aliases?: string[];
  /** true for a bridged (non-Discord) user */
  isBridge?: boolean;
}

export interface ContextInput {
  /** null in a DM */
  guildId: string | null;
  channelId: string;
  /** set when the turn is inside a thread */
  threadId?: string | null;
  /** the message author; null only if unknown */
  userId: string | null;
  botUserId: string;
  /** personas.persona_id of the responding persona */
  personaId: number;
  /** deliver the notice through this webhook (an alter persona) */
  replyVia?: { webhookId: string; username: string; avatarUrl?: string | null } | null;
  participants?: ParticipantInput[];
  /**
   * Members the shard knows, most relevant first (e.g. recent speakers). More than 1,000 are cut: members
   * who are participants come first, then the triggering user, then the rest in the order given.
   */
  members?: MemberInput[];
}

function snowflake(field: string, value: string): string {
  if (typeof value !== "string" || !SNOWFLAKE.test(value)) {
    throw new InvalidContextError(`${field} must be a Discord id (17 to 20 digits), got ${JSON.stringify(value)}`);
  }
  return value;
}

function optionalSnowflake(field: string, value: string | null | undefined): string | null {
  return value === null || value === undefined ? null : snowflake(field, value);
}

/** The event's `context` from plain data, validated and with `guild_members` capped at 1,000. */
export function buildContext(input: ContextInput): EventContext {
  if (!Number.isSafeInteger(input.personaId) || input.personaId < 0) {
    throw new InvalidContextError(`personaId must be an integer >= 0, got ${String(input.personaId)}`);
  }
  const participants: Participant[] = (input.participants ?? []).map((p, i) => {
    if (typeof p.targetId !== "string" || p.targetId === "") {
      throw new InvalidContextError(`participants[${i}].targetId must be a non-empty string`);
    }
    return {
      target_id: p.targetId,
      display_label: p.displayLabel,
      aliases: [...(p.aliases ?? [])],
      is_bridge: p.isBridge ?? false,
    };
  });
  const userId = optionalSnowflake("userId", input.userId);
  const members = selectMembers(input.members ?? [], participants, userId);
  let replyVia: ReplyVia | null = null;
  if (input.replyVia) {
    replyVia = {
      webhook_disc_id: snowflake("replyVia.webhookId", input.replyVia.webhookId),
      username: input.replyVia.username,
      avatar_url: input.replyVia.avatarUrl ?? null,
    };
  }
  return {
    guild_disc_id: optionalSnowflake("guildId", input.guildId),
    channel_disc_id: snowflake("channelId", input.channelId),
    thread_id: optionalSnowflake("threadId", input.threadId),
    triggering_user_disc_id: userId,
    bot_user_disc_id: snowflake("botUserId", input.botUserId),
    persona_id: input.personaId,
    reply_via: replyVia,
    participants,
    guild_members: members,
  };
}

/** Participants' members first, then the triggering user, then the rest in order; no duplicates. */
function selectMembers(input: MemberInput[], participants: Participant[], userId: string | null): GuildMember[] {
  const byId = new Map<string, GuildMember>();
  input.forEach((m, i) => {
    const id = snowflake(`members[${i}].userId`, m.userId);
    if (typeof m.username !== "string") throw new InvalidContextError(`members[${i}].username must be a string`);
    if (!byId.has(id)) {
      byId.set(id, {
        user_disc_id: id,
        username: m.username,
        global_name: m.globalName ?? null,
        nickname: m.nickname ?? null,
        is_bot: m.isBot ?? false,
      });
    }
  });
  const chosen = new Map<string, GuildMember>();
  const take = (id: string | null): void => {
    const member = id === null ? undefined : byId.get(id);
    if (member !== undefined && chosen.size < MAX_GUILD_MEMBERS) chosen.set(member.user_disc_id, member);
  };
  for (const p of participants) take(p.target_id);
  take(userId);
  for (const id of byId.keys()) {
    if (chosen.size >= MAX_GUILD_MEMBERS) break;
    take(id);
  }
  return [...chosen.values()];
}

/** Discord's embed limits (title, description, footer text). */
const LIMITS = { title: 256, description: 4096, footer: 2048 };

/** Plain embed fields, shaped like discord.js's APIEmbed (pass to `new EmbedBuilder(embed)`). */
export interface NoticeEmbed {
  title: string;
  description: string;
  footer: { text: string };
  /** `accent_color` as a number (0x2ECC71); absent when the notice's colour is not `#RRGGBB` */
  color?: number;
}

export interface RenderedNotice {
  embed: NoticeEmbed;
  /** the whole memory, for a "Show Full Memory" button (store it: it does not fit a custom_id) */
  fullContent: string;
  /** true when the embed shows a preview only: offer the button */
  expandable: boolean;
  kind: Notice["kind"];
}

function clip(text: string, limit: number): string {
  const chars = Array.from(text);
  return chars.length <= limit ? text : `${chars.slice(0, limit - 1).join("")}…`;
}

/** `#RRGGBB` (or `RRGGBB`) to a number; undefined for anything else. */
export function parseColor(hex: string): number | undefined {
  const match = /^#?([0-9a-fA-F]{6})$/.exec(hex);
  return match?.[1] === undefined ? undefined : Number.parseInt(match[1], 16);
}

/** A notification (or its `notice`) as embed fields, without depending on discord.js. */
export function noticeToEmbed(notice: Notification | Notice): RenderedNotice {
  const n: Notice = "notice" in notice ? notice.notice : notice;
  const embed: NoticeEmbed = {
    title: clip(n.title, LIMITS.title),
    description: clip(n.description, LIMITS.description),
    footer: { text: clip(n.footer, LIMITS.footer) },
  };
  const color = parseColor(n.accent_color);
  if (color !== undefined) embed.color = color;
  return { embed, fullContent: n.full_content, expandable: n.expandable, kind: n.kind };
}
