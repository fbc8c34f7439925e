-- Requests made with an HTTP Idempotency-Key, with their stored responses.
CREATE TABLE api_requests (
  tenant        TEXT NOT NULL,
  key           TEXT NOT NULL,
  request_hash  TEXT NOT NULL,
  done          INTEGER NOT NULL DEFAULT 0,
  status        INTEGER NOT NULL DEFAULT 0,
  content_type  TEXT NOT NULL DEFAULT '',
  body          TEXT NOT NULL DEFAULT '',
  created_at    INTEGER NOT NULL,
  expires_at    INTEGER NOT NULL,
  owner         TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX api_requests_expiry ON api_requests (expires_at);

-- Counters kept with the data, so every process adds to the same series.
CREATE TABLE counters (
  name   TEXT PRIMARY KEY,
  value  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO counters VALUES ('lease_takeovers', 0), ('inbox_duplicates', 0);

CREATE INDEX instances_created ON instances (tenant, created_at);
CREATE INDEX alerts_instance ON alerts (instance_id, state);
