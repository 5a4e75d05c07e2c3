// The kit over TLS (issue 25): a private RabbitMQ node and a private redis-server that accept nothing but TLS and
// want a client certificate, with a throwaway CA made by the openssl CLI. With the CA and a client certificate in
// the `tls` option, a save goes through a real `worker run` over amqps and its invalidation comes back over rediss;
// without the option, with another CA or without a client certificate, the connection is refused, and a refused
// server certificate is reported as such ("certificate" in the error).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { TLSSocket } from "node:tls";

import { InvalidationSubscriber, LtmClient, invalidationIdOf, type LtmTlsOptions, type ServerStateInvalidation } from "../src/index.js";
import {
  Authority,
  GUILD,
  Inbox,
  PrivateRabbit,
  PrivateRedis,
  Stack,
  onPath,
  skipUnlessCi,
  type CertificatePair,
} from "./harness.js";
import { callId, connectClient, noDelayOf, recordingLogger, socketsOpenedBy, worldContext } from "./kit.js";

/** The worker's URLs name the files in their query (aio-pika's and redis-py's forms, docs/tls.md). */
function fileQuery(names: [string, string, string], ca: string, client: CertificatePair): string {
  const [caName, certName, keyName] = names;
  const q = (path: string) => encodeURIComponent(path);
  return `?${caName}=${q(ca)}&${certName}=${q(client.cert)}&${keyName}=${q(client.key)}`;
}

function tlsOf(ca: string | null, client: CertificatePair | null): LtmTlsOptions {
  return {
    ...(ca === null ? {} : { ca: readFileSync(ca) }),
    ...(client === null ? {} : { cert: readFileSync(client.cert), key: readFileSync(client.key) }),
  };
}

test("TLS-only RabbitMQ and Redis: the tls option's CA and client certificate, refusals otherwise", async (t) => {
  const missing = ["openssl", "rabbitmq-server", "redis-server"].filter((name) => !onPath(name));
  if (missing.length > 0) {
    skipUnlessCi(t, `${missing.join(", ")} not installed: this test makes a CA with openssl and starts private servers`);
    return;
  }
  const dir = mkdtempSync(join(tmpdir(), "ltm-ts-tls-"));
  let rabbit: PrivateRabbit | null = null;
  let redis: PrivateRedis | null = null;
  try {
    const [good, other] = await Promise.all([
      Authority.create(join(dir, "good"), "good"),
      Authority.create(join(dir, "other"), "other"),
    ]);
    const server = await good.issue("server");
    const client = await good.issue("client");
    const serverTls = { ca: good.ca, cert: server.cert, key: server.key, clientCertificates: true };
    // both at once; each is stopped below even when the other fails to start
    const [rabbitStart, redisStart] = await Promise.allSettled([
      PrivateRabbit.start({ tls: serverTls }),
      PrivateRedis.start({ tls: serverTls }),
    ]);
    if (rabbitStart.status === "fulfilled") rabbit = rabbitStart.value;
    if (redisStart.status === "fulfilled") redis = redisStart.value;
    if (rabbitStart.status === "rejected") throw rabbitStart.reason;
    if (redisStart.status === "rejected") throw redisStart.reason;
    assert.ok(rabbit !== null && redis !== null);
    const { url: amqpsUrl, port: amqpsPort } = rabbit;
    const { url: redissUrl, port: redissPort } = redis;

    await t.test("the right CA and a client certificate: a save through the worker over amqps, its invalidation over rediss", async () => {
      const stack = await Stack.create({ rabbitmqUrl: amqpsUrl + fileQuery(["cafile", "certfile", "keyfile"], good.ca, client) });
      try {
        await stack.worker({
          LTM_REDIS_URL: redissUrl + fileQuery(["ssl_ca_certs", "ssl_certfile", "ssl_keyfile"], good.ca, client),
        });
        const states = new Inbox<ServerStateInvalidation>();
        const { logger } = recordingLogger();
        const { value: subscriber, sockets: redisSockets } = await socketsOpenedBy(() =>
          InvalidationSubscriber.start({ url: redissUrl, tls: tlsOf(good.ca, client), onServerState: states.push, logger }),
        );
        try {
          const { value: kit, sockets: amqpSockets } = await socketsOpenedBy(() =>
            connectClient(amqpsUrl, { tls: tlsOf(good.ca, client) }),
          );
          try {
            // TLS sockets, and Nagle's algorithm off on them too (sockets.test.ts)
            for (const [sockets, port] of [[redisSockets, redissPort], [amqpSockets, amqpsPort]] as const) {
              assert.ok(sockets.length >= 1, "no socket opened");
              for (const socket of sockets) {
                assert.equal(socket.remotePort, port);
                assert.ok(socket instanceof TLSSocket && socket.encrypted, "a socket without TLS");
                assert.equal(socket.authorized, true, "the server's certificate was not verified");
                assert.equal(noDelayOf(socket), true, "Nagle's algorithm is on for a TLS socket");
              }
            }
            const eventId = randomUUID();
            const result = await kit.client.createMemory({
              eventId,
              toolCallId: callId(),
              arguments: { memory_content: "{user} likes locked doors", memory_scope: "server_wide" },
              context: worldContext(stack.personaId),
            });
            assert.equal(result.status, "memory_saved_successfully");
            assert.equal(result.event_id, eventId);
            const invalidation = await states.waitFor(
              "the save's invalidation over rediss",
              (message) => message.invalidation_id === invalidationIdOf(eventId),
            );
            assert.equal(invalidation.server_disc_id, GUILD);
          } finally {
            await kit.client.close();
          }
        } finally {
          await subscriber.close();
        }
      } finally {
        await stack.dispose();
      }
    });

    // `startupRetries: 0`: the first refusal fails connect (the default retries it 5 times, with backoff)
    const once = { reconnect: { startupRetries: 0, initialDelayMs: 100, maxDelayMs: 500 } };
    const { logger: quiet } = recordingLogger();

    await t.test("another CA: RabbitMQ's certificate is refused, and the error says so", async () => {
      await assert.rejects(
        LtmClient.connect({ url: amqpsUrl, shardId: 3, logger: quiet, tls: tlsOf(other.ca, client), ...once }),
        /certificate/i,
      );
    });

    await t.test("another CA: Redis's certificate is refused, and the error says so", async () => {
      await assert.rejects(
        InvalidationSubscriber.start({ url: redissUrl, logger: quiet, tls: tlsOf(other.ca, client) }),
        /certificate/i,
      );
    });

    await t.test("no tls option: the private CA is not trusted (Node's CA store), both refused", async () => {
      await assert.rejects(LtmClient.connect({ url: amqpsUrl, shardId: 3, logger: quiet, ...once }), /certificate/i);
      await assert.rejects(InvalidationSubscriber.start({ url: redissUrl, logger: quiet }), /certificate/i);
    });

    await t.test("the right CA but no client certificate: both servers refuse the connection", async () => {
      await assert.rejects(LtmClient.connect({ url: amqpsUrl, shardId: 3, logger: quiet, tls: tlsOf(good.ca, null), ...once }));
      await assert.rejects(InvalidationSubscriber.start({ url: redissUrl, logger: quiet, tls: tlsOf(good.ca, null) }));
    });
  } finally {
    await rabbit?.stop();
    await redis?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("tls settings with a plaintext URL, or a path where PEM text belongs, are refused before connecting", async () => {
  const { logger } = recordingLogger();
  const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  // nothing listens on port 1: a connection attempt would fail differently
  await assert.rejects(
    LtmClient.connect({ url: "amqp://guest:guest@127.0.0.1:1/", shardId: 3, logger, tls: { ca: pem } }),
    /not amqps:\/\/.*would not use TLS/,
  );
  await assert.rejects(
    InvalidationSubscriber.start({ url: "redis://127.0.0.1:1/0", logger, tls: { ca: pem } }),
    /not rediss:\/\/.*would not use TLS/,
  );
  await assert.rejects(
    LtmClient.connect({ url: "amqps://guest:guest@127.0.0.1:1/", shardId: 3, logger, tls: { ca: "/etc/ltm/tls/ca.crt" } }),
    /tls\.ca is not PEM text.*readFileSync/,
  );
  await assert.rejects(
    InvalidationSubscriber.start({ url: "rediss://127.0.0.1:1/0", logger, tls: { ca: pem, cert: pem } }),
    /tls\.cert and tls\.key go together/,
  );
});
