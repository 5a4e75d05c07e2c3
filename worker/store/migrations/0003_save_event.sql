-- Everything an event writes, in one statement (one implicit transaction, one round trip).
--
-- The event's state is read by the statement before (under READ COMMITTED a read inside the writing
-- transaction would take its own snapshot all the same); what must be atomic is here: the claim of the event
-- id, the count under the scope lock, the memory row and the recorded outcome commit together or not at all.

-- Returns one row: (duplicate, memory_id, current_count).
--   duplicate: the event id was already recorded (by a concurrent or earlier delivery): nothing written;
--   memory_id NULL and not duplicate: the scope was full (current_count rows): nothing written, the caller
--   records the limit outcome itself (repository.record_outcome);
--   else the memory was saved with that id and the outcome recorded (data.memory_id filled in).
CREATE OR REPLACE FUNCTION public.ltm_save_event(
    p_event_id UUID,
    p_tool_call_id TEXT,
    p_tool_name TEXT,
    p_shard_id INTEGER,
    p_scope TEXT,             -- 'server_wide' (owner = servers.server_id) or 'target_user' (owner = users.user_id)
    p_owner_id INTEGER,
    p_lineage_id BIGINT,
    p_persona_id INTEGER,     -- server-wide only: attribution
    p_author_id INTEGER,      -- server-wide only: the triggering user
    p_content TEXT,
    p_max_allowed BIGINT,
    p_result JSONB,           -- the success result; data.memory_id is filled in here
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
    -- the lock serialises every writer of one limit scope until this statement's transaction ends; each
    -- statement of a VOLATILE function takes a new snapshot, so the count sees what the previous holder
    -- committed
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
        -- lineage 0 holds the global personal memories, which count toward every persona's limit
        SELECT count(*) INTO n FROM public.personal_memories
        WHERE user_id = p_owner_id AND (persona_lineage_id = p_lineage_id OR persona_lineage_id = 0);
    END IF;
    IF n >= p_max_allowed THEN
        RETURN QUERY SELECT false, NULL::BIGINT, n;
        RETURN;
    END IF;

    -- the claim: a concurrent delivery of the same event waits here until this one commits
    INSERT INTO public.ltm_processed_events (event_id, tool_call_id, tool_name, shard_id, status)
    VALUES (p_event_id, p_tool_call_id, p_tool_name, p_shard_id, 'processing')
    ON CONFLICT (event_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, NULL::BIGINT, NULL::BIGINT;
        RETURN;
    END IF;

    IF p_scope = 'server_wide' THEN
        INSERT INTO public.server_memories (server_id, persona_id, persona_lineage_id, user_id, content, tags)
        VALUES (p_owner_id, p_persona_id, p_lineage_id, p_author_id, p_content, '{}'::text[])
        RETURNING server_memory_id INTO new_id;
    ELSE
        INSERT INTO public.personal_memories (user_id, persona_lineage_id, content, tags)
        VALUES (p_owner_id, p_lineage_id, p_content, '{}'::text[])
        RETURNING personal_memory_id INTO new_id;
    END IF;

    UPDATE public.ltm_processed_events
    SET status = 'memory_saved_successfully',
        memory_scope = p_scope,
        memory_id = new_id,
        result = jsonb_set(p_result, '{data,memory_id}', to_jsonb(new_id)),
        notice = p_notice,
        invalidation = p_invalidation,
        attempts = p_attempts,
        processed_at = p_processed_at
    WHERE event_id = p_event_id;

    RETURN QUERY SELECT false, new_id, n;
END;
$$;
