-- The worker's own table: one row per tool-call event it has answered, keyed by the shard's event_id.
-- Written in the same transaction as the memory row, so "row saved" and "outcome recorded" commit
-- together; a redelivered or replayed event is answered from here (replayed: true) and touches nothing.
CREATE TABLE IF NOT EXISTS public.ltm_processed_events (
    event_id UUID PRIMARY KEY,
    tool_call_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    shard_id INTEGER NOT NULL,
    -- 'processing' exists only inside the claiming transaction and is never committed
    status TEXT NOT NULL,
    memory_scope TEXT,
    memory_id BIGINT,
    result JSONB,
    notice JSONB,
    invalidation JSONB,
    attempts INTEGER NOT NULL DEFAULT 1,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    processed_at TIMESTAMPTZ
);

CREATE INDEX IF NOT EXISTS ltm_processed_events_processed_at ON public.ltm_processed_events (processed_at);
