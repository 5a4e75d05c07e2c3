// @tomoribot/ltm-client: everything a shard needs to talk to the LTM worker (see README.md).
export * from "./generated/index.js";
export * from "./names.js";
export type { InvalidationKind, NoticeKind, ResultStatus, ToolName } from "./types.js";
export {
  CLOSE_DRAIN_MS,
  DEFAULT_TIMEOUT_MS,
  GUILD_IN_FLIGHT_MAX,
  LtmClient,
  MAX_EVENT_BYTES,
  PER_SHARD_RETRY_MS,
  shardQueues,
  tenantOf,
  toolRoutingKeys,
  userOfUrl,
  type CreateMemoryRequest,
  type LateResultInfo,
  type LateResultReason,
  type LtmClientOptions,
} from "./client.js";
export {
  InvalidationSubscriber,
  invalidationIdOf,
  type InvalidationSubscriberOptions,
} from "./invalidation.js";
export {
  MAX_GUILD_MEMBERS,
  buildContext,
  noticeToEmbed,
  parseColor,
  type ContextInput,
  type MemberInput,
  type NoticeEmbed,
  type ParticipantInput,
  type RenderedNotice,
} from "./builders.js";
export {
  InvalidContextError,
  LtmBacklogFullError,
  LtmClientError,
  LtmClosedError,
  LtmEventTooLargeError,
  LtmGuildBusyError,
  LtmIdentityError,
  LtmPublishRefusedError,
  LtmPublishRejectedError,
  LtmTimeoutError,
  LtmUnroutableError,
} from "./errors.js";
export { consoleLogger, type Logger } from "./logger.js";
export type { LtmTlsOptions, PemInput } from "./tls.js";
export { SeenSet } from "./seen.js";
