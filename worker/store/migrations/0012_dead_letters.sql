-- Every dead letter, kept where it can be read without taking it from the DLQ (docs/dead-letters.md "Kept
-- letters"). The broker routes each dead letter to two queues bound to tomori.dead_letter with '#': the DLQ,
-- which RabbitMQ's own tools and a replay read, and ltm.create_memory.dlq.copies, which every worker drains into
-- this table (worker/runtime/keeper.py). A copy delivered twice is one row: letter_key is a digest of what the
-- broker gave both queues alike (body, headers but the broker's delivery counts, message id).
CREATE TABLE IF NOT EXISTS public.ltm_dead_letters (
    letter_key TEXT PRIMARY KEY,
    -- the order the letters were kept in: the copies queue's, which is the DLQ's
    kept_seq BIGINT GENERATED ALWAYS AS IDENTITY,
    -- the body's event_id (else the message_id); NULL when neither can be read
    event_id TEXT,
    -- malformed, schema, transient_exhausted, ..., or the broker's reason (delivery_limit)
    kind TEXT NOT NULL,
    error TEXT NOT NULL,
    first_error TEXT NOT NULL DEFAULT '',
    attempts INTEGER,
    -- when it failed (x-ltm-failed-at, else x-death's time); NULL when neither says
    failed_at TIMESTAMPTZ,
    -- the body's shard_id and context.guild_disc_id (NULL: unreadable, or a direct message's guild)
    shard_id BIGINT,
    guild_id TEXT,
    -- the key a replay sends it with (the shard's, before any retry); the exchange and routing key the DLQ got it
    -- with, from which (with the headers and the user_id property) who published it is read
    routing_key TEXT NOT NULL,
    exchange TEXT NOT NULL DEFAULT '',
    delivery_routing_key TEXT NOT NULL DEFAULT '',
    message_id TEXT,
    replay_count INTEGER NOT NULL DEFAULT 0,
    -- the headers as JSON (times as RFC 3339, bytes as text), the AMQP properties set, the body (at most the
    -- contract's 256 KiB; a longer one is cut and body_size says how long it was)
    headers JSONB NOT NULL DEFAULT '{}'::jsonb,
    properties JSONB NOT NULL DEFAULT '{}'::jsonb,
    body BYTEA NOT NULL,
    body_size INTEGER NOT NULL,
    -- when a worker (or `worker dlq repair`) wrote the row
    kept_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- waiting: in the DLQ; replayed: a replay sent it back (answered or came back is read from the ledger and
    -- from the letter its replay became); came_back: its replay failed again and is a letter of its own; purged:
    -- deleted from the DLQ (`worker dlq purge`, or found gone by `worker dlq repair`); expired: removed by the
    -- retention (LTM_DLQ_RETENTION)
    state TEXT NOT NULL DEFAULT 'waiting'
        CHECK (state IN ('waiting', 'replayed', 'came_back', 'purged', 'expired')),
    state_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- the operation (ltm_dlq_operations) that last changed the state, and a line saying how
    operation_id UUID,
    state_detail TEXT
);

-- what `worker dlq list` reads: the waiting letters, in the DLQ's order
CREATE INDEX IF NOT EXISTS ltm_dead_letters_waiting ON public.ltm_dead_letters (kept_seq)
    WHERE state = 'waiting';
CREATE INDEX IF NOT EXISTS ltm_dead_letters_event_id ON public.ltm_dead_letters (event_id, replay_count);
-- what the retention removes
CREATE INDEX IF NOT EXISTS ltm_dead_letters_kept_at ON public.ltm_dead_letters (kept_at);

-- each letter an operation took, by the same key: the operation's outcome is the letter's new state (also
-- for a letter whose copy is kept after the operation took it: the keeper looks it up)
ALTER TABLE public.ltm_dlq_operation_letters ADD COLUMN IF NOT EXISTS letter_key TEXT;
CREATE INDEX IF NOT EXISTS ltm_dlq_operation_letters_letter_key ON public.ltm_dlq_operation_letters (letter_key)
    WHERE letter_key IS NOT NULL;

-- 'expire': the retention's own sweep, its letters' outcome 'expired'
ALTER TABLE public.ltm_dlq_operations DROP CONSTRAINT IF EXISTS ltm_dlq_operations_action_check;
ALTER TABLE public.ltm_dlq_operations ADD CONSTRAINT ltm_dlq_operations_action_check
    CHECK (action IN ('replay', 'purge', 'expire', 'repair'));
ALTER TABLE public.ltm_dlq_operation_letters DROP CONSTRAINT IF EXISTS ltm_dlq_operation_letters_outcome_check;
ALTER TABLE public.ltm_dlq_operation_letters ADD CONSTRAINT ltm_dlq_operation_letters_outcome_check
    CHECK (outcome IN ('pending', 'replayed', 'not_replayed', 'deleted', 'kept', 'replayed_before', 'expired'));
