-- A replay or purge as an operation others can watch and stop (docs/dead-letters.md "A replay as an
-- operation"): the rate it was asked for, how far it got, a heartbeat the running command writes every couple
-- of seconds (a 'started' operation whose heartbeat is older than the lease stopped without closing its record:
-- killed, or cut off from Postgres), and a cancellation another terminal asked for (`worker dlq cancel`).
ALTER TABLE public.ltm_dlq_operations
    -- letters per second asked for (`--rate`); NULL: as fast as the broker confirms
    ADD COLUMN IF NOT EXISTS rate DOUBLE PRECISION,
    -- dead letters selected so far, and how many of them were replayed or deleted
    ADD COLUMN IF NOT EXISTS selected INTEGER,
    ADD COLUMN IF NOT EXISTS moved INTEGER,
    -- the last time the running command said it was alive (NULL: written before this column existed)
    ADD COLUMN IF NOT EXISTS heartbeat_at TIMESTAMPTZ,
    -- the machine and process that run it: a replay started on the same machine after that process died
    -- need not wait out the heartbeat's lease
    ADD COLUMN IF NOT EXISTS host TEXT,
    ADD COLUMN IF NOT EXISTS pid INTEGER,
    ADD COLUMN IF NOT EXISTS cancel_requested_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS cancelled_by TEXT;

-- 'cancelled': stopped by `worker dlq cancel`, what was in flight settled first
ALTER TABLE public.ltm_dlq_operations DROP CONSTRAINT IF EXISTS ltm_dlq_operations_state_check;
ALTER TABLE public.ltm_dlq_operations ADD CONSTRAINT ltm_dlq_operations_state_check
    CHECK (state IN ('started', 'done', 'refused', 'failed', 'interrupted', 'cancelled'));

-- 'replayed_before': a letter an earlier replay had already sent (its copy confirmed, or answered by the worker,
-- or back in the DLQ) whose original that replay was stopped before removing; removed now, not sent again
ALTER TABLE public.ltm_dlq_operation_letters DROP CONSTRAINT IF EXISTS ltm_dlq_operation_letters_outcome_check;
ALTER TABLE public.ltm_dlq_operation_letters ADD CONSTRAINT ltm_dlq_operation_letters_outcome_check
    CHECK (outcome IN ('pending', 'replayed', 'not_replayed', 'deleted', 'kept', 'replayed_before'));

-- what `worker dlq operations` and the one-replay-per-DLQ rule look for
CREATE INDEX IF NOT EXISTS ltm_dlq_operations_started ON public.ltm_dlq_operations (vhost, queue)
    WHERE state = 'started';
