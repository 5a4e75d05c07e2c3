-- `worker dlq replay` and `purge` record each letter's x-ltm-replay-count as they take it (README "Dead letters
-- for the people on call"). A replayed copy carries one more, so a letter taken later (by any operation) or
-- found in the DLQ with the same event id and that next count is the replayed one, come back: the replay
-- failed again. `worker dlq history` and the page say so. NULL: a row written before this column existed.
ALTER TABLE public.ltm_dlq_operation_letters ADD COLUMN IF NOT EXISTS replay_count INTEGER;
