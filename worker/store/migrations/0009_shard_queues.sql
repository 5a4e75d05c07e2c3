-- Fair shares between shards (README "Fair shares").
--
-- The shards that have a queue of their own, ltm.create_memory.shard.<N>: a worker declares it the first
-- time it sees the shard and records it here, and every worker consumes every queue recorded here (each
-- reads this table every few seconds), so a queue filled by one worker is drained by the others if it dies.
CREATE TABLE IF NOT EXISTS public.ltm_shard_queues (
    shard_id INTEGER PRIMARY KEY CHECK (shard_id >= 0),
    declared_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- What each worker saw of each shard, one row per worker, shard and sample (every 15 s), kept for an hour:
-- `worker shards` sums them (events in, answered, held, the wait's histogram) without Prometheus.
CREATE TABLE IF NOT EXISTS public.ltm_shard_activity (
    sampled_at TIMESTAMPTZ NOT NULL,
    worker TEXT NOT NULL,
    shard_id INTEGER NOT NULL,
    received INTEGER NOT NULL,
    answered INTEGER NOT NULL,
    held INTEGER NOT NULL,
    -- events whose wait (from issued_at to the start of processing) fell in each bucket of
    -- worker/observability/metrics.py's SHARD_WAIT_BUCKETS, the last one for longer waits
    wait_counts INTEGER[] NOT NULL,
    PRIMARY KEY (sampled_at, worker, shard_id)
);
