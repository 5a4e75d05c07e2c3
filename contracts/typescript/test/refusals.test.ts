// A login or vhost RabbitMQ refuses fails `connect` at once, in plain words, without the start-up retries a
// broker that is down gets (newcomer review 3, row 16). No worker needed.
import assert from "node:assert/strict";
import { test } from "node:test";

import { LtmClient, LtmClientError } from "../src/index.js";
import { RABBITMQ_URL, hex } from "./harness.js";
import { recordingLogger } from "./kit.js";

function withCredentials(url: string, password: string, vhost?: string): string {
  const parsed = new URL(url);
  parsed.password = password;
  if (vhost !== undefined) parsed.pathname = `/${encodeURIComponent(vhost)}`;
  return parsed.toString();
}

// startupRetries 5 with a long first delay: a refusal that were retried would log attempts and take minutes
const reconnect = { startupRetries: 5, initialDelayMs: 20_000, maxDelayMs: 20_000 };

test("a password RabbitMQ refuses fails connect at once with ACCESS_REFUSED named", async () => {
  const { logger, lines } = recordingLogger();
  const user = decodeURIComponent(new URL(RABBITMQ_URL).username || "guest");

  await assert.rejects(
    LtmClient.connect({ url: withCredentials(RABBITMQ_URL, `wrong-${hex()}`), shardId: 1, logger, reconnect }),
    (error: unknown) => {
      assert.ok(error instanceof LtmClientError);
      assert.match(error.message, new RegExp(`^RabbitMQ refused the login of user "${user}" \\(ACCESS_REFUSED\\)`));
      return true;
    },
  );
  assert.deepEqual(lines.items.filter((l) => l.message === "RabbitMQ connection attempt failed"), []);
});

test("a vhost that does not exist fails connect at once, naming the vhost", async () => {
  const { logger, lines } = recordingLogger();
  const vhost = `ltm-ts-missing-${hex()}`;
  const password = decodeURIComponent(new URL(RABBITMQ_URL).password || "guest");

  await assert.rejects(
    LtmClient.connect({ url: withCredentials(RABBITMQ_URL, password, vhost), shardId: 1, logger, reconnect }),
    (error: unknown) => {
      assert.ok(error instanceof LtmClientError);
      assert.match(error.message, new RegExp(`^RabbitMQ refused vhost "${vhost}" to user "\\w+": the vhost does not exist`));
      return true;
    },
  );
  assert.deepEqual(lines.items.filter((l) => l.message === "RabbitMQ connection attempt failed"), []);
});
