-- The lease reaper asks every second which owners hold live leases, and reads only
-- the rows that can hold one: instances a worker drives (instances_due) and those
-- that need attention, where a worker keeps its lease while a branch beside the
-- failed step still has a call out. This index holds only the latter: few rows,
-- written only when an instance waits for an operator.
CREATE INDEX instances_attention ON instances (id) WHERE state = 6;
