import type { Logger } from "./logger.js";

/** PEM text (a string or a Buffer), or several. */
export type PemInput = string | Buffer | Array<string | Buffer>;

/**
 * TLS settings for `amqps://` (LtmClient) and `rediss://` (InvalidationSubscriber) connections: Node's own
 * `tls.connect` options of the same names, passed as they are. Give the file contents
 * (`readFileSync("/etc/ltm/tls/ca.crt")`), not paths. The URL's scheme decides whether TLS is used at all:
 * these settings with an `amqp://` or `redis://` URL are refused. See README.md "TLS".
 */
export interface LtmTlsOptions {
  /**
   * The CA certificate(s) the server's certificate must chain to (PEM). Given, it replaces Node's default list
   * of public CAs for this connection (as Node's `ca` does); not given, the public CAs and
   * `NODE_EXTRA_CA_CERTS` are trusted.
   */
  ca?: PemInput;
  /** This client's certificate (PEM, chain after it), for a server that asks for one (mutual TLS). */
  cert?: PemInput;
  /** The private key of `cert` (PEM). */
  key?: PemInput;
  /** The passphrase of an encrypted `key`. */
  passphrase?: string;
  /**
   * The name the server's certificate must carry, and the SNI sent. Default: the URL's host (an IP address in
   * the URL is checked against the certificate's IP address entries).
   */
  servername?: string;
  /**
   * Default true: the server's certificate must chain to a trusted CA and name the host. `false` turns every
   * check off (anyone who can intercept the connection can pose as the server and read the traffic and the
   * password): for development only; the kit logs a warning when it connects with it.
   */
  rejectUnauthorized?: boolean;
}

/** What is passed on to `tls.connect` (nothing else of the object). */
const TLS_FIELDS = ["ca", "cert", "key", "passphrase", "servername", "rejectUnauthorized"] as const;

/** Query parameters that carry TLS files in the worker's URLs (aio-pika, redis-py), which the kit's libraries ignore. */
const URL_TLS_PARAMETERS = ["cafile", "certfile", "keyfile", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"];

function checkPem(name: string, value: PemInput | undefined): void {
  if (value === undefined) return;
  for (const item of Array.isArray(value) ? value : [value]) {
    if (typeof item === "string" && !item.includes("-----BEGIN")) {
      throw new TypeError(
        `tls.${name} is not PEM text (no "-----BEGIN"): give the file's contents, e.g. readFileSync(path), not its path`,
      );
    }
  }
}

/**
 * The `tls.connect` options for a connection to `url`, or undefined when the URL is plaintext and no settings
 * are given. Throws when settings are given for a plaintext URL, or a PEM field holds something else.
 */
export function tlsConnectOptions(
  what: "RabbitMQ" | "Redis",
  url: string,
  tls: LtmTlsOptions | undefined,
  logger: Logger,
): Record<string, unknown> | undefined {
  const secure = what === "RabbitMQ" ? "amqps:" : "rediss:";
  let parsed: URL | null = null;
  try {
    parsed = new URL(url);
  } catch {
    // the library reports a malformed URL itself
  }
  const encrypted = parsed?.protocol === secure;
  if (parsed !== null && encrypted && tls?.ca === undefined) {
    const ignored = URL_TLS_PARAMETERS.filter((name) => parsed?.searchParams.has(name));
    if (ignored.length > 0) {
      logger.warn(`the ${what} URL's ${ignored.join(", ")} are not read by the kit; pass the files' contents as the tls option`, {
        ignored,
      });
    }
  }
  if (tls === undefined) return undefined;
  if (!encrypted) {
    throw new RangeError(
      `tls settings were given for ${what}, but its URL is not ${secure}//: the connection would not use TLS`,
    );
  }
  checkPem("ca", tls.ca);
  checkPem("cert", tls.cert);
  checkPem("key", tls.key);
  if ((tls.cert === undefined) !== (tls.key === undefined)) {
    throw new TypeError("tls.cert and tls.key go together: give both or neither");
  }
  if (tls.rejectUnauthorized === false) {
    logger.warn(`TLS certificate verification is OFF for ${what} (tls.rejectUnauthorized: false): for development only`);
  }
  const options: Record<string, unknown> = {};
  for (const name of TLS_FIELDS) {
    if (tls[name] !== undefined) options[name] = tls[name];
  }
  return options;
}
