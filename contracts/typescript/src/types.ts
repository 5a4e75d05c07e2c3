// Names for parts of the generated message types, derived structurally so they survive a change of the
// schemas' per-field titles.
import type { CacheInvalidation, EventContext, Notice, ToolCallEvent, ToolResult } from "./generated/index.js";

/** Deliver the notice through this webhook (an alter persona) instead of the channel. */
export type ReplyVia = NonNullable<EventContext["reply_via"]>;
/** `server_memory` or `personal_memory`. */
export type NoticeKind = Notice["kind"];
/** `tomori_state` or `user`. */
export type InvalidationKind = CacheInvalidation["kind"];
/** One of the ten result statuses of CONTRACT.md. */
export type ResultStatus = ToolResult["status"];
/** `create_long_term_memory` or its alias `remember_this_fact`. */
export type ToolName = ToolCallEvent["tool_name"];
