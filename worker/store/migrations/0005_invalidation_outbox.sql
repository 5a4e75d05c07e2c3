-- The invalidation outbox: a saved memory's cache invalidation must reach Redis at least once after the
-- commit, but an event must not wait for (or be retried because of) a Redis outage. The ledger row already
-- holds the invalidation; this column marks the ones a worker could not publish. A worker acks such an
-- event only once the mark is committed, and every worker's outbox publishes the marked rows as soon as
-- Redis answers, then clears the mark. NULL (the normal case) costs nothing.
ALTER TABLE public.ltm_processed_events ADD COLUMN IF NOT EXISTS invalidation_pending_since TIMESTAMPTZ;

CREATE INDEX IF NOT EXISTS ltm_processed_events_invalidation_pending
    ON public.ltm_processed_events (invalidation_pending_since)
    WHERE invalidation_pending_since IS NOT NULL;
