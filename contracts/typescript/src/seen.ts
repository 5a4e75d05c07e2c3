/**
 * A bounded memory of keys seen recently: at most `capacity` entries, each forgotten `ttlMs` after it was
 * stored (the oldest go first when full). Used to drop second copies of results and notices.
 */
export class SeenSet<V> {
  private readonly entries = new Map<string, { value: V; at: number }>();

  constructor(
    readonly capacity: number,
    readonly ttlMs: number,
    private readonly now: () => number = Date.now,
  ) {
    if (!(capacity > 0) || !(ttlMs > 0)) throw new RangeError("capacity and ttlMs must be > 0");
  }

  get size(): number {
    return this.entries.size;
  }

  /** The value stored for `key`, or undefined when it was never stored or has expired. */
  get(key: string): V | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (this.now() - entry.at >= this.ttlMs) {
      this.entries.delete(key);
      return undefined;
    }
    return entry.value;
  }

  has(key: string): boolean {
    return this.get(key) !== undefined;
  }

  /** Store `value` for `key` (moving it to the young end), then evict expired and excess entries. */
  set(key: string, value: V): void {
    const now = this.now();
    this.entries.delete(key);
    this.entries.set(key, { value, at: now });
    // Map iterates in insertion order, so the oldest entries come first.
    for (const [oldest, entry] of this.entries) {
      if (this.entries.size <= this.capacity && now - entry.at < this.ttlMs) break;
      this.entries.delete(oldest);
    }
  }
}
