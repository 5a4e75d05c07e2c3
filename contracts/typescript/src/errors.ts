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

/** The broker refused the event (a nack: e.g. the work queue is full and rejects publishes). */
export class LtmPublishRejectedError extends LtmClientError {
  override name = "LtmPublishRejectedError";
  constructor(readonly eventId: string) {
    super(`the broker refused event ${eventId} (nack); nothing was saved, the call may be retried`);
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
