-- The ledger answers only its own event: each outcome is stored with a digest of the event it answers
-- (SHA-256 of a canonical form of the tool call, shard, scope and arguments: worker/service/digest.py), and
-- a repeated event_id is answered from the stored outcome only when the digests match. Another shard that
-- learnt an event_id and sends its own event under it gets a refusal instead of the stored result and
-- notice (security review 3, section 4; CONTRACT.md section 4).
--
-- Rows written before this migration (and by a worker of an earlier version still running during a rolling
-- upgrade) have no digest (NULL): their events' arguments were never stored, so none can be computed. The
-- worker matches such a legacy row on the columns every row has (tool_call_id, tool_name, shard_id) and,
-- for a save, its notice's guild, channel and thread (README "Decisions").
ALTER TABLE public.ltm_processed_events ADD COLUMN IF NOT EXISTS event_digest BYTEA;

-- ltm_save_event of migration 0004 with the digest as a 17th argument (NULL when omitted: a legacy row);
-- otherwise the same arguments and answers. The old signature goes, so a call can never pick the old body.
DROP FUNCTION IF EXISTS public.ltm_save_event(
    UUID, TEXT, TEXT, INTEGER, TEXT, INTEGER, BIGINT, INTEGER, INTEGER, TEXT, BIGINT, JSONB, JSONB, JSONB,
    INTEGER, TIMESTAMPTZ);

CREATE FUNCTION public.ltm_save_event(
    p_event_id UUID,
    p_tool_call_id TEXT,
    p_tool_name TEXT,
    p_shard_id INTEGER,
    p_scope TEXT,
    p_owner_id INTEGER,
    p_lineage_id BIGINT,
    p_persona_id INTEGER,
    p_author_id INTEGER,
    p_content TEXT,
    p_max_allowed BIGINT,
    p_result JSONB,
    p_notice JSONB,
    p_invalidation JSONB,
    p_attempts INTEGER,
    p_processed_at TIMESTAMPTZ,
    p_event_digest BYTEA DEFAULT NULL
) RETURNS TABLE (duplicate BOOLEAN, memory_id BIGINT, current_count BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n BIGINT;
    new_id BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'ltm:' || p_scope || ':' || p_owner_id::text || ':' || p_lineage_id::text, 0));
    IF EXISTS (SELECT 1 FROM public.ltm_processed_events WHERE event_id = p_event_id) THEN
        RETURN QUERY SELECT true, NULL::BIGINT, NULL::BIGINT;
        RETURN;
    END IF;
    IF p_scope = 'server_wide' THEN
        SELECT count(*) INTO n FROM public.server_memories
        WHERE server_id = p_owner_id AND persona_lineage_id = p_lineage_id;
    ELSE
        SELECT count(*) INTO n FROM public.personal_memories
        WHERE user_id = p_owner_id AND (persona_lineage_id = p_lineage_id OR persona_lineage_id = 0);
    END IF;
    IF n >= p_max_allowed THEN
        RETURN QUERY SELECT false, NULL::BIGINT, n;
        RETURN;
    END IF;

    IF p_scope = 'server_wide' THEN
        new_id := nextval(pg_get_serial_sequence('public.server_memories', 'server_memory_id'));
    ELSE
        new_id := nextval(pg_get_serial_sequence('public.personal_memories', 'personal_memory_id'));
    END IF;

    -- the claim: a concurrent delivery of the same event id waits here until this one commits (and is then
    -- told "duplicate": the worker compares the digests before it answers from the stored outcome)
    INSERT INTO public.ltm_processed_events
        (event_id, tool_call_id, tool_name, shard_id, status, memory_scope, memory_id, result, notice,
         invalidation, attempts, processed_at, event_digest)
    VALUES (p_event_id, p_tool_call_id, p_tool_name, p_shard_id, 'memory_saved_successfully', p_scope, new_id,
            jsonb_set(p_result, '{data,memory_id}', to_jsonb(new_id)), p_notice, p_invalidation, p_attempts,
            p_processed_at, p_event_digest)
    ON CONFLICT (event_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, NULL::BIGINT, NULL::BIGINT;
        RETURN;
    END IF;

    IF p_scope = 'server_wide' THEN
        INSERT INTO public.server_memories
            (server_memory_id, server_id, persona_id, persona_lineage_id, user_id, content, tags)
        VALUES (new_id, p_owner_id, p_persona_id, p_lineage_id, p_author_id, p_content, '{}'::text[]);
    ELSE
        INSERT INTO public.personal_memories (personal_memory_id, user_id, persona_lineage_id, content, tags)
        VALUES (new_id, p_owner_id, p_lineage_id, p_content, '{}'::text[]);
    END IF;

    RETURN QUERY SELECT false, new_id, n;
END;
$$;

-- ltm_save_events of migration 0004; each item may carry "digest" (the event's digest, hex), written into
-- the outcome row of a "save" and of a "record" item alike. An item without it (a worker of an earlier
-- version, during a rolling upgrade) writes a legacy row, as before.
CREATE OR REPLACE FUNCTION public.ltm_save_events(p_items JSONB)
RETURNS TABLE (i INTEGER, duplicate BOOLEAN, memory_id BIGINT, current_count BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lock_key BIGINT;
    item JSONB;
    saved RECORD;
    claimed BOOLEAN;
BEGIN
    FOR lock_key IN
        SELECT DISTINCT hashtextextended(
                   'ltm:' || (x->>'scope') || ':' || (x->>'owner_id') || ':' || (x->>'lineage_id'), 0)
        FROM jsonb_array_elements(p_items) AS x
        WHERE x->>'kind' = 'save'
        ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(lock_key);
    END LOOP;

    FOR item IN SELECT x FROM jsonb_array_elements(p_items) AS x LOOP
        IF item->>'kind' = 'save' THEN
            SELECT * INTO saved FROM public.ltm_save_event(
                (item->>'event_id')::uuid,
                item->>'tool_call_id',
                item->>'tool_name',
                (item->>'shard_id')::integer,
                item->>'scope',
                (item->>'owner_id')::integer,
                (item->>'lineage_id')::bigint,
                (item->>'persona_id')::integer,
                (item->>'author_id')::integer,
                item->>'content',
                (item->>'max_allowed')::bigint,
                item->'result',
                item->'notice',
                item->'invalidation',
                (item->>'attempts')::integer,
                (item->>'processed_at')::timestamptz,
                decode(item->>'digest', 'hex'));
            RETURN QUERY SELECT (item->>'i')::integer, saved.duplicate, saved.memory_id, saved.current_count;
        ELSIF item->>'kind' = 'record' THEN
            INSERT INTO public.ltm_processed_events
                (event_id, tool_call_id, tool_name, shard_id, status, memory_scope, result, attempts,
                 processed_at, event_digest)
            VALUES ((item->>'event_id')::uuid, item->>'tool_call_id', item->>'tool_name',
                    (item->>'shard_id')::integer, item->>'status', item->>'scope', item->'result',
                    (item->>'attempts')::integer, (item->>'processed_at')::timestamptz,
                    decode(item->>'digest', 'hex'))
            ON CONFLICT (event_id) DO NOTHING;
            claimed := FOUND;
            RETURN QUERY SELECT (item->>'i')::integer, NOT claimed, NULL::BIGINT, NULL::BIGINT;
        ELSE
            RAISE EXCEPTION 'ltm_save_events: item % has an unknown kind %', item->>'i', item->>'kind';
        END IF;
    END LOOP;
END;
$$;
