/** Base class of every error the kit raises. */
export class LtmClientError extends Error {
  override name = "LtmClientError";
}

/**
 * No result arrived within the call's timeout. The event was published (or is waiting for the broker),
 * so the worker may still process it: the memory may already be saved or be saved later. A result that
 * arrives afterwards goes to `onLateResult`, never to this call.
 */
export class LtmTimeoutError extends LtmClientError {
  override name = "LtmTimeoutError";
  constructor(
    readonly eventId: string,
    readonly toolCallId: string,
    readonly timeoutMs: number,
  ) {
    super(
      `no result for event ${eventId} (tool call ${toolCallId}) within ${timeoutMs} ms; ` +
        "the memory may still have been saved, a late result goes to onLateResult",
    );
  }
}

/** The broker returned the event: nothing is bound to `tomori.tool_calls` for its routing key. */
export class LtmUnroutableError extends LtmClientError {
  override name = "LtmUnroutableError";
  constructor(
    readonly eventId: string,
    readonly routingKey: string,
    replyText: string,
  ) {
    super(
      `event ${eventId} could not be routed from tomori.tool_calls with ${routingKey} (${replyText}): ` +
        "is the worker's topology declared (worker run, or deploy/rabbitmq/definitions.json)?",
    );
  }
}

/** The broker refused the event (a nack); the kit raises the subclass LtmBacklogFullError for it. */
export class LtmPublishRejectedError extends LtmClientError {
  override name = "LtmPublishRejectedError";
  constructor(
    readonly eventId: string,
    message = `the broker refused event ${eventId} (nack); nothing was saved, the call may be retried`,
  ) {
    super(message);
  }
}

/**
 * The broker refused the event (basic.nack) because the queue it was routed to is at its bound
 * (`x-overflow: reject-publish`): nothing was enqueued, nothing saved. With the per-shard key that queue is
 * the shard's own, `ltm.create_memory.shard.<id>` (this shard has its share waiting: it sends faster than the
 * workers answer, or no worker runs); with `tool.<name>` it is the common `ltm.create_memory`. Retry later with
 * the same `eventId`, more slowly.
 */
export class LtmBacklogFullError extends LtmPublishRejectedError {
  override name = "LtmBacklogFullError";
  readonly code = "backlog_full";
  constructor(
    eventId: string,
    readonly shardId: number,
    readonly routingKey: string,
    /** the queue whose bound was hit (the default names: the worker's LTM_* topology settings may rename them) */
    readonly queue: string,
    readonly perShard: boolean,
  ) {
    super(
      eventId,
      (perShard
        ? `RabbitMQ refused event ${eventId} (nack): shard ${shardId}'s own queue ${queue} is at its bound, so this ` +
          "shard has as many events waiting as it may (it sends faster than the workers answer, or no worker runs). "
        : `RabbitMQ refused event ${eventId} (nack): the common work queue ${queue} is at its bound (every shard's ` +
          "events wait there: the workers are behind, or none runs). ") +
        "Nothing was saved. Slow down and retry later with the same eventId; check that workers run " +
        `(worker check; the consumers of ${queue}) and the queue's depth against its bound ` +
        "(rabbitmqctl list_queues name messages consumers; its x-max-length or policy).",
    );
  }
}

/**
 * RabbitMQ refused the event's AMQP `user_id`: it must be the user the connection logged in as (channel closed
 * with PRECONDITION_FAILED). The kit sets it to the URL's user unless the `userId` option says otherwise, so this
 * means that option names another user, or the broker authenticated the connection under another name.
 * Nothing was enqueued; every later call of this client fails the same way, at once.
 */
export class LtmIdentityError extends LtmClientError {
  override name = "LtmIdentityError";
  readonly code = "identity_refused";
  constructor(
    readonly eventId: string,
    readonly userId: string,
    brokerText: string,
  ) {
    super(
      `RabbitMQ refused event ${eventId}: its user_id "${userId}" is not the user this connection logged in as ` +
        `(${brokerText}). Set the client's userId option to the user the broker authenticates (or false to send ` +
        "none, which a worker with LTM_SHARD_IDENTITY=required refuses); nothing was published",
    );
  }
}

/** RabbitMQ refused this shard's user the event's routing key (its topic permission on tomori.tool_calls). */
export class LtmPublishRefusedError extends LtmClientError {
  override name = "LtmPublishRefusedError";
  readonly code = "publish_refused";
  constructor(
    readonly eventId: string,
    readonly routingKey: string,
    brokerText: string,
  ) {
    super(
      `RabbitMQ refused event ${eventId} with routing key ${routingKey} (${brokerText}): the shard's user may not ` +
        "publish it to tomori.tool_calls. Give it the topic permission deploy/rabbitmq/shard_users.py writes; " +
        "nothing was published",
    );
  }
}

/** The event's body is over the worker's 256 KiB limit: it would be dead-lettered without an answer. */
export class LtmEventTooLargeError extends LtmClientError {
  override name = "LtmEventTooLargeError";
  constructor(
    readonly eventId: string,
    readonly bytes: number,
  ) {
    super(`event ${eventId} is ${bytes} bytes, over the contract's 256 KiB: not published (the worker answers no such event)`);
  }
}

/**
 * One guild (a direct message: its channel) already has `guildInFlightMax` calls of this client waiting for
 * their results: this one was not published, nothing was saved. The usual cause is a loop in the bot calling
 * the memory tool over and over in that guild; the shard's other guilds are not held up by it. Tell the model
 * the tool is busy and to try again later; retry with the same eventId.
 */
export class LtmGuildBusyError extends LtmClientError {
  override name = "LtmGuildBusyError";
  readonly code = "guild_busy";
  constructor(
    readonly eventId: string,
    readonly guild: string,
    readonly waiting: number,
  ) {
    super(
      `event ${eventId} was not published: guild ${guild} already has ${waiting} calls waiting for their results ` +
        "(guildInFlightMax), so one guild cannot fill its shard's queue ahead of the others. Nothing was saved; " +
        "retry later with the same eventId",
    );
  }
}

/** The client was closed while the call waited for its result. */
export class LtmClosedError extends LtmClientError {
  override name = "LtmClosedError";
  constructor(readonly eventId: string | null) {
    super(
      eventId === null
        ? "the LTM client is closed"
        : `the LTM client was closed while event ${eventId} waited for its result; the memory may still be saved`,
    );
  }
}

/** `buildContext` was given something CONTRACT.md does not allow (a malformed Discord id, ...). */
export class InvalidContextError extends LtmClientError {
  override name = "InvalidContextError";
}
