-- The Postgres roles of the LTM worker on the bot's database, with only what each command needs
-- (deploy/README.md "Postgres roles and grants"; tests/e2e/test_postgres_grants.py runs this file).
--
--   ltm_migrate  `worker migrate`: creates the worker's own tables and functions (it owns them), and the bot
--                tables only where they are missing (a new install). Nothing of the bot's is altered.
--   ltm_run      `worker run`, `worker check`: reads the bot's tables, inserts memories, reads and writes the
--                worker's own tables. No DDL, no UPDATE or DELETE on a bot table.
--
-- Run it once, BEFORE the first `worker migrate`, as a superuser (or a role with CREATEROLE that is a member
-- of ltm_migrate), connected to the bot's database:
--
--   psql "postgresql://postgres@db.example:5432/tomoribot" -v ON_ERROR_STOP=1 -f deploy/postgres/grants.sql
--
-- then give the roles their passwords (ALTER ROLE ltm_migrate LOGIN PASSWORD '...'; the same for ltm_run).
-- Other role names: -v migrate_role=... -v run_role=... . Running it again changes nothing.
--
-- Tables a later migration adds are covered: the default privileges below give ltm_run what it needs on
-- every table, sequence and function ltm_migrate creates. Before the first migrate the bot tables that do
-- not exist yet are skipped: migrate then creates them as ltm_migrate, and the default privileges apply.

\if :{?migrate_role}
\else
\set migrate_role ltm_migrate
\endif
\if :{?run_role}
\else
\set run_role ltm_run
\endif

SET ltm.migrate_role = :'migrate_role';
SET ltm.run_role = :'run_role';

DO $$
DECLARE
    migrate_role text := current_setting('ltm.migrate_role');
    run_role text := current_setting('ltm.run_role');
    t text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = migrate_role) THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN', migrate_role);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = run_role) THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN', run_role);
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I, %I', current_database(), migrate_role, run_role);

    -- migrate creates its tables and functions in public; run only uses what is there
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA public TO %I', migrate_role);
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', run_role);

    -- the bot's tables (migration 0001): read the state, insert memories
    FOREACH t IN ARRAY ARRAY[
        'servers', 'users', 'user_personalization_configs', 'user_persona_naming_preferences', 'personas',
        'persona_naming_configs', 'server_member_permissions_configs', 'personalization_blacklist'
    ] LOOP
        IF to_regclass(format('public.%I', t)) IS NOT NULL THEN
            EXECUTE format('GRANT SELECT ON public.%I TO %I', t, run_role);
        END IF;
    END LOOP;
    FOREACH t IN ARRAY ARRAY['server_memories:server_memory_id', 'personal_memories:personal_memory_id'] LOOP
        IF to_regclass(format('public.%I', split_part(t, ':', 1))) IS NOT NULL THEN
            EXECUTE format('GRANT SELECT, INSERT ON public.%I TO %I', split_part(t, ':', 1), run_role);
            -- the serial id's sequence, for the insert's default
            EXECUTE format(
                'GRANT USAGE ON SEQUENCE %s TO %I',
                pg_get_serial_sequence(format('public.%I', split_part(t, ':', 1)), split_part(t, ':', 2)),
                run_role
            );
        END IF;
    END LOOP;

    -- what migrate creates from now on (the worker's tables, sequences and functions, and the bot tables of
    -- a new install): run may use it
    EXECUTE format(
        'ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I',
        migrate_role, run_role
    );
    EXECUTE format(
        'ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO %I',
        migrate_role, run_role
    );
    EXECUTE format(
        'ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public GRANT EXECUTE ON FUNCTIONS TO %I',
        migrate_role, run_role
    );
    -- and what an earlier migrate already created as migrate_role
    FOR t IN SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND pg_get_userbyid(c.relowner) = migrate_role
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I', t, run_role);
    END LOOP;
    FOR t IN SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind = 'S' AND pg_get_userbyid(c.relowner) = migrate_role
    LOOP
        EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %s TO %I', t, run_role);
    END LOOP;
    FOR t IN SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) = migrate_role
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', t, run_role);
    END LOOP;
END
$$;

RESET ltm.migrate_role;
RESET ltm.run_role;
