-- The bot's tables that the worker reads and writes (reference section 5), created only where they
-- are missing: a development database, a test database, a new install. An existing bot table is never
-- altered, re-indexed or dropped, and no row of one is changed: every statement below runs only for a
-- table this migration creates itself.

DO $$
BEGIN
    IF to_regproc('public.update_timestamp') IS NULL THEN
        CREATE FUNCTION public.update_timestamp() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            NEW.updated_at = CURRENT_TIMESTAMP;
            RETURN NEW;
        END;
        $fn$;
    END IF;

    IF to_regclass('public.persona_lineage_id_seq') IS NULL THEN
        CREATE SEQUENCE public.persona_lineage_id_seq MINVALUE 10000 START 10000;
    END IF;

    IF to_regclass('public.servers') IS NULL THEN
        CREATE TABLE public.servers (
            server_id SERIAL PRIMARY KEY,
            server_disc_id TEXT UNIQUE NOT NULL,
            is_dm_channel BOOLEAN DEFAULT false,
            registration_locale TEXT,
            created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
        );
        CREATE INDEX idx_servers_server_disc_id ON public.servers (server_disc_id);
        CREATE INDEX idx_servers_is_dm_channel ON public.servers (is_dm_channel);
        CREATE TRIGGER update_servers_timestamp BEFORE UPDATE ON public.servers
            FOR EACH ROW EXECUTE FUNCTION public.update_timestamp();
    END IF;

    IF to_regclass('public.users') IS NULL THEN
        CREATE TABLE public.users (
            user_id SERIAL PRIMARY KEY,
            user_disc_id TEXT UNIQUE NOT NULL,
            language_pref TEXT DEFAULT 'en-US',
            registration_locale TEXT,
            privacy_level INTEGER NOT NULL DEFAULT 0 CHECK (privacy_level IN (0, 1, 2)),
            created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
        );
        CREATE TRIGGER update_users_timestamp BEFORE UPDATE ON public.users
            FOR EACH ROW EXECUTE FUNCTION public.update_timestamp();
    END IF;

    IF to_regclass('public.user_personalization_configs') IS NULL THEN
        CREATE TABLE public.user_personalization_configs (
            user_id INT PRIMARY KEY REFERENCES public.users (user_id) ON DELETE CASCADE,
            user_nickname TEXT,
            prefix_override TEXT,
            suffix_override TEXT,
            addressing_style TEXT CHECK (
                addressing_style IS NULL OR addressing_style IN ('masculine', 'feminine', 'neutral')
            ),
            gender_identity TEXT,
            pronouns TEXT,
            timezone_offset SMALLINT CHECK (timezone_offset BETWEEN -12 AND 14),
            created_at TIMESTAMPTZ DEFAULT NOW(),
            updated_at TIMESTAMPTZ DEFAULT NOW()
        );
    END IF;

    IF to_regclass('public.user_persona_naming_preferences') IS NULL THEN
        CREATE TABLE public.user_persona_naming_preferences (
            user_id INT NOT NULL REFERENCES public.users (user_id) ON DELETE CASCADE,
            persona_lineage_id BIGINT NOT NULL,
            nickname_override TEXT,
            prefix_override TEXT,
            suffix_override TEXT,
            created_at TIMESTAMPTZ DEFAULT NOW(),
            updated_at TIMESTAMPTZ DEFAULT NOW(),
            PRIMARY KEY (user_id, persona_lineage_id)
        );
    END IF;

    IF to_regclass('public.personas') IS NULL THEN
        CREATE TABLE public.personas (
            persona_id SERIAL PRIMARY KEY,
            server_id INT NOT NULL REFERENCES public.servers (server_id) ON DELETE CASCADE,
            persona_nickname TEXT NOT NULL,
            is_alter BOOLEAN DEFAULT false,
            webhook_avatar_url TEXT,
            persona_lineage_id BIGINT NOT NULL DEFAULT nextval('public.persona_lineage_id_seq'),
            is_pointer BOOLEAN NOT NULL DEFAULT false,
            created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
        );
        CREATE UNIQUE INDEX personas_one_main_per_server ON public.personas (server_id) WHERE is_alter = false;
        CREATE UNIQUE INDEX personas_server_nickname_unique
            ON public.personas (server_id, lower(btrim(persona_nickname)));
        CREATE INDEX idx_personas_persona_lineage_id ON public.personas (persona_lineage_id);
        CREATE TRIGGER update_personas_timestamp BEFORE UPDATE ON public.personas
            FOR EACH ROW EXECUTE FUNCTION public.update_timestamp();
    END IF;

    IF to_regclass('public.persona_naming_configs') IS NULL THEN
        CREATE TABLE public.persona_naming_configs (
            persona_id INT PRIMARY KEY REFERENCES public.personas (persona_id) ON DELETE CASCADE,
            prefixes JSONB NOT NULL DEFAULT '{}',
            suffixes JSONB NOT NULL DEFAULT '{}',
            address_terms JSONB NOT NULL DEFAULT '{}',
            created_at TIMESTAMPTZ DEFAULT NOW(),
            updated_at TIMESTAMPTZ DEFAULT NOW()
        );
    END IF;

    IF to_regclass('public.server_member_permissions_configs') IS NULL THEN
        CREATE TABLE public.server_member_permissions_configs (
            server_id INT PRIMARY KEY REFERENCES public.servers (server_id) ON DELETE CASCADE,
            self_teaching_enabled BOOLEAN NOT NULL DEFAULT true,
            personal_memories_enabled BOOLEAN NOT NULL DEFAULT true,
            server_memteaching_enabled BOOLEAN NOT NULL DEFAULT false,
            created_at TIMESTAMPTZ DEFAULT NOW(),
            updated_at TIMESTAMPTZ DEFAULT NOW()
        );
    END IF;

    IF to_regclass('public.personalization_blacklist') IS NULL THEN
        CREATE TABLE public.personalization_blacklist (
            server_id INT NOT NULL REFERENCES public.servers (server_id) ON DELETE CASCADE,
            user_disc_id TEXT NOT NULL,
            created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            PRIMARY KEY (server_id, user_disc_id)
        );
    END IF;

    IF to_regclass('public.server_memories') IS NULL THEN
        CREATE TABLE public.server_memories (
            server_memory_id SERIAL PRIMARY KEY,
            server_id INT NOT NULL REFERENCES public.servers (server_id) ON DELETE CASCADE,
            persona_id INT,
            persona_lineage_id BIGINT NOT NULL,
            user_id INT REFERENCES public.users (user_id) ON DELETE SET NULL,
            content TEXT NOT NULL,
            tags TEXT[] DEFAULT '{}',
            created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            CONSTRAINT server_memories_persona_id_fkey FOREIGN KEY (persona_id)
                REFERENCES public.personas (persona_id) ON DELETE SET NULL
        );
        CREATE INDEX idx_server_memories_persona_id ON public.server_memories (persona_id);
        CREATE INDEX idx_server_memories_persona_created
            ON public.server_memories (persona_id, created_at DESC);
        CREATE INDEX idx_server_memories_lineage ON public.server_memories (persona_lineage_id);
        CREATE INDEX idx_server_memories_server_lineage_created
            ON public.server_memories (server_id, persona_lineage_id, created_at DESC);
    END IF;

    IF to_regclass('public.personal_memories') IS NULL THEN
        CREATE TABLE public.personal_memories (
            personal_memory_id SERIAL PRIMARY KEY,
            user_id INT NOT NULL REFERENCES public.users (user_id) ON DELETE CASCADE,
            persona_lineage_id BIGINT NOT NULL,
            content TEXT NOT NULL,
            tags TEXT[] DEFAULT '{}',
            created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
        );
        CREATE INDEX idx_personal_memories_user_lineage_created
            ON public.personal_memories (user_id, persona_lineage_id, created_at DESC);
        CREATE TRIGGER update_personal_memories_timestamp BEFORE UPDATE ON public.personal_memories
            FOR EACH ROW EXECUTE FUNCTION public.update_timestamp();
    END IF;
END
$$;
