-- Who is loud inside a shard (docs/fair-shares.md): each row of ltm_shard_activity carries its shard's loudest
-- guilds of the interval, as a JSON list of {"guild", "received", "held", "moved"} (at most five, loudest
-- first; a direct message's tenant is "dm:<channel id>"). No metric label per guild: Prometheus keeps the shard;
-- `worker shards` reads these to name the guild.
ALTER TABLE public.ltm_shard_activity ADD COLUMN IF NOT EXISTS guilds JSONB;
