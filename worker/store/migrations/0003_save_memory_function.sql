-- Count-and-insert under the scope lock in one round trip.
--
-- The advisory lock serialises every writer of one limit scope until the calling transaction ends;
-- in READ COMMITTED each statement of a VOLATILE function takes a new snapshot, so the count below sees
-- every row committed by the previous holder of the lock. When there is room, the memory is inserted and
-- the event's outcome recorded (its result gets the new memory id); when the scope is full nothing is
-- written and the caller records the limit outcome itself.
CREATE OR REPLACE FUNCTION public.ltm_save_memory(
    p_event_id UUID,
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
) RETURNS TABLE (memory_id BIGINT, current_count BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n BIGINT;
    new_id BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'ltm:' || p_scope || ':' || p_owner_id::text || ':' || p_lineage_id::text, 0));
    IF p_scope = 'server_wide' THEN
        SELECT count(*) INTO n FROM public.server_memories
        WHERE server_id = p_owner_id AND persona_lineage_id = p_lineage_id;
    ELSE
        -- lineage 0 holds the global personal memories, which count toward every persona's limit
        SELECT count(*) INTO n FROM public.personal_memories
        WHERE user_id = p_owner_id AND (persona_lineage_id = p_lineage_id OR persona_lineage_id = 0);
    END IF;

    IF n >= p_max_allowed THEN
        RETURN QUERY SELECT NULL::BIGINT, n;
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

    RETURN QUERY SELECT new_id, n;
END;
$$;
