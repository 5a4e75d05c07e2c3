-- The audit trail of `worker dlq replay` and `purge` (README "Dead letters: groups, audit, the page"): one
-- row per operation, written (state 'started') before anything is taken off the queue, and one row per dead
-- letter it selected, written before that letter is republished or deleted (outcome 'pending') and settled
-- once the broker confirmed it ('replayed', 'not_replayed', 'deleted', or 'kept' when a purge was declined).
-- An operation the tool could not finish (killed, the machine lost) stays 'started': its 'pending' letters are
-- the ones in doubt (at worst a replayed letter is in both queues, or a deleted one still in the DLQ).
CREATE TABLE IF NOT EXISTS public.ltm_dlq_operations (
    operation_id UUID PRIMARY KEY,
    action TEXT NOT NULL CHECK (action IN ('replay', 'purge')),
    -- --by, else the OS user and host (user@host)
    actor TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ,
    -- started: running or never finished; done; refused (declined, or no one to confirm); failed (the broker
    -- or the audit itself failed mid-way: detail says why); interrupted (Ctrl-C)
    state TEXT NOT NULL DEFAULT 'started'
        CHECK (state IN ('started', 'done', 'refused', 'failed', 'interrupted')),
    detail TEXT,
    -- the filters as given: kind, event_id, older_than_seconds, group, limit
    filters JSONB NOT NULL DEFAULT '{}'::jsonb,
    vhost TEXT NOT NULL,
    queue TEXT NOT NULL,
    -- messages in the DLQ when the pass started, and how many it looked at
    expected INTEGER,
    scanned INTEGER
);

CREATE INDEX IF NOT EXISTS ltm_dlq_operations_started_at ON public.ltm_dlq_operations (started_at DESC);

CREATE TABLE IF NOT EXISTS public.ltm_dlq_operation_letters (
    operation_id UUID NOT NULL REFERENCES public.ltm_dlq_operations (operation_id) ON DELETE CASCADE,
    -- the letter's place in the operation (1, 2, ...): the same event id may be in the DLQ twice
    position INTEGER NOT NULL,
    event_id TEXT,
    kind TEXT NOT NULL,
    outcome TEXT NOT NULL DEFAULT 'pending'
        CHECK (outcome IN ('pending', 'replayed', 'not_replayed', 'deleted', 'kept')),
    detail TEXT,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (operation_id, position)
);

CREATE INDEX IF NOT EXISTS ltm_dlq_operation_letters_event_id ON public.ltm_dlq_operation_letters (event_id);
