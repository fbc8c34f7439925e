-- Attempt history: the lease each request was sent under, and an index that reads
-- an instance's attempts of every step newest first, a page at a time.
ALTER TABLE attempts ADD COLUMN worker TEXT NOT NULL DEFAULT '';   -- the lease owner
ALTER TABLE attempts ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
CREATE INDEX attempts_newest ON attempts (instance_id, started_at, step_index, seq);
