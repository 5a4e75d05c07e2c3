-- The writes of several events in one statement (one transaction, one round trip, one commit).
--
-- Under load the worker hands Postgres the events that are ready together instead of one transaction each:
-- the per-statement and per-commit costs (protocol, transaction start and end, the WAL flush) are paid once
-- per batch. Each item is exactly what one event writes on its own (ltm_save_event, or the outcome of an
-- event that saved nothing), so a batch of one behaves as before; the batch commits or rolls back whole,
-- and the worker then processes its events one by one.
--
-- p_items: a JSON array of objects, in the order the caller wants them applied (the worker sorts them by
-- event id), each with "i" (the caller's index, returned as is) and "kind":
--   "save":   the arguments of ltm_save_event (event_id, tool_call_id, tool_name, shard_id, scope, owner_id,
--             lineage_id, persona_id, author_id, content, max_allowed, result, notice, invalidation,
--             attempts, processed_at);
--   "record": an outcome that saved nothing (event_id, tool_call_id, tool_name, shard_id, status, scope,
--             result, attempts, processed_at).
-- Returns one row per item: (i, duplicate, memory_id, current_count), as ltm_save_event; a "record" item
-- gives duplicate = the event id was already recorded, memory_id and current_count NULL.
--
-- No deadlock between writers: every scope lock the batch needs is taken first, in one global order (by
-- key), before any event id is claimed; the claims follow in the caller's order (by event id), so two
-- batches never wait on each other's claims in a cycle, and a single event (one lock, then one claim) never
-- holds a claim while it waits for a lock.
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
            -- ltm_save_event takes the scope lock again (already held: advisory locks are re-entrant)
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
                (item->>'processed_at')::timestamptz);
            RETURN QUERY SELECT (item->>'i')::integer, saved.duplicate, saved.memory_id, saved.current_count;
        ELSIF item->>'kind' = 'record' THEN
            INSERT INTO public.ltm_processed_events
                (event_id, tool_call_id, tool_name, shard_id, status, memory_scope, result, attempts,
                 processed_at)
            VALUES ((item->>'event_id')::uuid, item->>'tool_call_id', item->>'tool_name',
                    (item->>'shard_id')::integer, item->>'status', item->>'scope', item->'result',
                    (item->>'attempts')::integer, (item->>'processed_at')::timestamptz)
            ON CONFLICT (event_id) DO NOTHING;
            claimed := FOUND;
            RETURN QUERY SELECT (item->>'i')::integer, NOT claimed, NULL::BIGINT, NULL::BIGINT;
        ELSE
            RAISE EXCEPTION 'ltm_save_events: item % has an unknown kind %', item->>'i', item->>'kind';
        END IF;
    END LOOP;
END;
$$;

-- ltm_save_event, same arguments and answers as migration 0003, one write fewer per saved event: the
-- outcome row is inserted once, complete, instead of inserted as 'processing' and updated. The memory's id
-- is drawn from its table's sequence first, so the outcome can name it before the row exists; the claim
-- (the outcome's insert) still comes before the memory's, so a concurrent delivery of the same event
-- waits on it and then finds it, and a claim that loses writes nothing (a drawn id is merely skipped, as
-- any rolled-back insert skips one).
CREATE OR REPLACE FUNCTION public.ltm_save_event(
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
    p_processed_at TIMESTAMPTZ
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

    -- the claim: a concurrent delivery of the same event waits here until this one commits
    INSERT INTO public.ltm_processed_events
        (event_id, tool_call_id, tool_name, shard_id, status, memory_scope, memory_id, result, notice,
         invalidation, attempts, processed_at)
    VALUES (p_event_id, p_tool_call_id, p_tool_name, p_shard_id, 'memory_saved_successfully', p_scope, new_id,
            jsonb_set(p_result, '{data,memory_id}', to_jsonb(new_id)), p_notice, p_invalidation, p_attempts,
            p_processed_at)
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
