// RabbitMQ's management API as one user: what the stack (stack.ts) imports the contract's definitions and each
// shard's user through, and what the kit's own tests (test/harness.ts) make their vhosts, users and permissions
// with. HTTP calls of milliseconds, each bounded.

export class ManagementClient {
  private readonly auth: string;

  constructor(
    readonly baseUrl: string,
    user: string,
    password: string,
    /** the bound of each call */
    readonly timeoutMs = 10_000,
  ) {
    this.auth = `Basic ${Buffer.from(`${user}:${password}`).toString("base64")}`;
  }

  /** One call, its response as it came (a caller that expects a refusal reads it). */
  request(method: string, path: string, body?: unknown): Promise<Response> {
    return fetch(`${this.baseUrl.replace(/\/$/, "")}${path}`, {
      method,
      headers: { authorization: this.auth, "content-type": "application/json" },
      body: body === undefined ? null : JSON.stringify(body),
      signal: AbortSignal.timeout(this.timeoutMs),
    });
  }

  /** One call that must succeed (a 404 too, with `allow404`); otherwise an error naming it, the status and the body. */
  async call(method: string, path: string, body?: unknown, allow404 = false): Promise<Response> {
    const response = await this.request(method, path, body);
    if (!response.ok && !(allow404 && response.status === 404)) {
      throw new Error(`${method} ${path}: HTTP ${response.status} ${await response.text()}`);
    }
    return response;
  }

  /** Whether the API answers this user (GET /api/overview). */
  async answers(): Promise<boolean> {
    try {
      return (await this.request("GET", "/api/overview")).ok;
    } catch {
      return false;
    }
  }

  /** POST /api/definitions: exchanges, queues, bindings, policies, users and permissions in one call. */
  async importDefinitions(definitions: unknown): Promise<void> {
    await this.call("POST", "/api/definitions", definitions);
  }

  /** Create the vhost, or change its settings (`{ tracing: true }`). */
  async putVhost(vhost: string, settings: Record<string, unknown> = {}): Promise<void> {
    await this.call("PUT", `/api/vhosts/${encodeURIComponent(vhost)}`, settings);
  }

  /** Delete the vhost; one already gone is no error. */
  async deleteVhost(vhost: string): Promise<void> {
    await this.call("DELETE", `/api/vhosts/${encodeURIComponent(vhost)}`, undefined, true);
  }

  async addUser(user: string, password: string, tags = ""): Promise<void> {
    await this.call("PUT", `/api/users/${encodeURIComponent(user)}`, { password, tags });
  }

  /** Delete the user; one already gone is no error. */
  async deleteUser(user: string): Promise<void> {
    await this.call("DELETE", `/api/users/${encodeURIComponent(user)}`, undefined, true);
  }

  async setPermissions(vhost: string, user: string, configure: string, write: string, read: string): Promise<void> {
    await this.call("PUT", `/api/permissions/${encodeURIComponent(vhost)}/${encodeURIComponent(user)}`, { configure, write, read });
  }

  async setTopicPermissions(vhost: string, user: string, exchange: string, write: string, read: string): Promise<void> {
    const path = `/api/topic-permissions/${encodeURIComponent(vhost)}/${encodeURIComponent(user)}`;
    await this.call("PUT", path, { exchange, write, read });
  }
}
