-- Attempts, tenant-scoped inbox with data hashes, tombstones of collected instances.

-- One row per request the engine sent for a step (call, lookup, compensation).
CREATE TABLE attempts (
  instance_id  BIGINT NOT NULL,
  step_index   INTEGER NOT NULL,
  seq          INTEGER NOT NULL,
  phase        SMALLINT NOT NULL,           -- AttemptPhase: 1 call, 2 lookup, 3 compensate
  sent         BOOLEAN NOT NULL,
  connection   SMALLINT NOT NULL,           -- ConnectionUsed: 0 none, 1 new, 2 reused
  status       INTEGER NOT NULL,            -- HTTP status, 0 when no complete response
  error_class  SMALLINT NOT NULL,           -- ErrorClass of the outcome, 0 success
  detail       TEXT NOT NULL,
  started_at   BIGINT NOT NULL,
  finished_at  BIGINT NOT NULL,
  PRIMARY KEY (instance_id, step_index, seq)
);

-- The inbox is per tenant and keeps a hash of each event's data. Claims outlive
-- their instance (gc removes them only past the protection window).
ALTER TABLE inbox ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
ALTER TABLE inbox ADD COLUMN data_hash TEXT NOT NULL DEFAULT '';
UPDATE inbox SET tenant = i.tenant FROM instances i WHERE i.id = inbox.instance_id;
ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE inbox ADD PRIMARY KEY (tenant, source, event_id);
CREATE INDEX inbox_received ON inbox (received_at);

-- What is left of an instance gc removed; a start for its key finds it here.
CREATE TABLE tombstones (
  tenant        TEXT NOT NULL,
  business_key  TEXT NOT NULL,
  workflow      TEXT NOT NULL,
  input_hash    TEXT NOT NULL,
  final_state   SMALLINT NOT NULL,          -- InstanceState
  external_ids  TEXT NOT NULL,              -- JSON object: step name -> external id
  instance_id   BIGINT NOT NULL,
  finished_at   BIGINT NOT NULL,
  collected_at  BIGINT NOT NULL,
  PRIMARY KEY (tenant, business_key)
);
CREATE INDEX tombstones_collected ON tombstones (collected_at);
CREATE INDEX tombstones_instance ON tombstones (instance_id);
