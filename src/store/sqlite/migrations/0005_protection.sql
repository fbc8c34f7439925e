-- Attempts, tenant-scoped inbox with data hashes, tombstones of collected instances.

-- One row per request the engine sent for a step (call, lookup, compensation).
CREATE TABLE attempts (
  instance_id  INTEGER NOT NULL,
  step_index   INTEGER NOT NULL,
  seq          INTEGER NOT NULL,
  phase        INTEGER NOT NULL,            -- AttemptPhase: 1 call, 2 lookup, 3 compensate
  sent         INTEGER NOT NULL,            -- 1 when the request (partly) left
  connection   INTEGER NOT NULL,            -- ConnectionUsed: 0 none, 1 new, 2 reused
  status       INTEGER NOT NULL,            -- HTTP status, 0 when no complete response
  error_class  INTEGER NOT NULL,            -- ErrorClass of the outcome, 0 success
  detail       TEXT NOT NULL,
  started_at   INTEGER NOT NULL,
  finished_at  INTEGER NOT NULL,
  PRIMARY KEY (instance_id, step_index, seq)
) WITHOUT ROWID;

-- The inbox is per tenant and keeps a hash of each event's data. Claims outlive
-- their instance (gc removes them only past the protection window).
CREATE TABLE inbox_v2 (
  tenant       TEXT NOT NULL,
  source       TEXT NOT NULL,
  event_id     TEXT NOT NULL,
  data_hash    TEXT NOT NULL,
  received_at  INTEGER NOT NULL,
  instance_id  INTEGER,
  PRIMARY KEY (tenant, source, event_id)
) WITHOUT ROWID;
INSERT INTO inbox_v2
  SELECT COALESCE((SELECT tenant FROM instances i WHERE i.id = inbox.instance_id), ''),
         source, event_id, '', received_at, instance_id
  FROM inbox;
DROP TABLE inbox;
ALTER TABLE inbox_v2 RENAME TO inbox;
CREATE INDEX inbox_received ON inbox (received_at);

-- What is left of an instance gc removed; a start for its key finds it here.
CREATE TABLE tombstones (
  tenant        TEXT NOT NULL,
  business_key  TEXT NOT NULL,
  workflow      TEXT NOT NULL,
  input_hash    TEXT NOT NULL,
  final_state   INTEGER NOT NULL,           -- InstanceState
  external_ids  TEXT NOT NULL,              -- JSON object: step name -> external id
  instance_id   INTEGER NOT NULL,
  finished_at   INTEGER NOT NULL,
  collected_at  INTEGER NOT NULL,
  PRIMARY KEY (tenant, business_key)
) WITHOUT ROWID;
CREATE INDEX tombstones_collected ON tombstones (collected_at);
CREATE INDEX tombstones_instance ON tombstones (instance_id);
