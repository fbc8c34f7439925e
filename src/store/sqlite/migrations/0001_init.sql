-- Waystone schema v1. Enum columns hold the frozen numeric values of src/model/states.h.

CREATE TABLE definitions (
  hash        TEXT PRIMARY KEY,
  workflow    TEXT NOT NULL,
  source      TEXT NOT NULL,
  body        TEXT NOT NULL,
  created_at  INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE instances (
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant            TEXT NOT NULL,
  business_key      TEXT NOT NULL,
  workflow          TEXT NOT NULL,
  definition_hash   TEXT NOT NULL REFERENCES definitions(hash),
  input_json        TEXT NOT NULL,
  input_hash        TEXT NOT NULL,
  state             INTEGER NOT NULL,
  status_reason     TEXT NOT NULL DEFAULT '',
  next_run_at       INTEGER NOT NULL,
  lease_owner       TEXT NOT NULL DEFAULT '',
  lease_expires_at  INTEGER NOT NULL DEFAULT 0,
  lease_epoch       INTEGER NOT NULL DEFAULT 0,
  trace_id          TEXT NOT NULL,
  source_event      TEXT NOT NULL DEFAULT '',
  created_at        INTEGER NOT NULL,
  updated_at        INTEGER NOT NULL,
  UNIQUE (tenant, business_key)
);
-- Runnable = running (1) or compensating (3).
CREATE INDEX instances_due ON instances (next_run_at) WHERE state IN (1, 3);
CREATE INDEX instances_state ON instances (tenant, state, updated_at);

CREATE TABLE steps (
  instance_id            INTEGER NOT NULL REFERENCES instances(id),
  step_index             INTEGER NOT NULL,
  name                   TEXT NOT NULL,
  state                  INTEGER NOT NULL,
  attempts               INTEGER NOT NULL DEFAULT 0,
  error_class            INTEGER NOT NULL DEFAULT 0,
  error_message          TEXT NOT NULL DEFAULT '',
  external_id            TEXT NOT NULL DEFAULT '',
  response_json          TEXT NOT NULL DEFAULT '',
  idempotency_key        TEXT NOT NULL DEFAULT '',
  request_hash           TEXT NOT NULL DEFAULT '',
  resolution             INTEGER NOT NULL DEFAULT 0,
  unknowns               INTEGER NOT NULL DEFAULT 0,
  lookups                INTEGER NOT NULL DEFAULT 0,
  compensation_attempts  INTEGER NOT NULL DEFAULT 0,
  next_attempt_at        INTEGER NOT NULL DEFAULT 0,
  started_at             INTEGER NOT NULL DEFAULT 0,
  finished_at            INTEGER NOT NULL DEFAULT 0,
  span_id                TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (instance_id, step_index)
) WITHOUT ROWID;

CREATE TABLE idempotency_keys (
  tenant        TEXT NOT NULL,
  key           TEXT NOT NULL,
  request_hash  TEXT NOT NULL,
  instance_id   INTEGER NOT NULL,
  step_name     TEXT NOT NULL,
  created_at    INTEGER NOT NULL,
  expires_at    INTEGER NOT NULL,
  PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

CREATE TABLE outbox (
  seq           INTEGER PRIMARY KEY AUTOINCREMENT,
  event_id      TEXT NOT NULL UNIQUE,
  instance_id   INTEGER NOT NULL,
  tenant        TEXT NOT NULL,
  type          TEXT NOT NULL,
  payload       TEXT NOT NULL,
  created_at    INTEGER NOT NULL,
  delivered_at  INTEGER
);
CREATE INDEX outbox_undelivered ON outbox (seq) WHERE delivered_at IS NULL;

CREATE TABLE inbox (
  source       TEXT NOT NULL,
  event_id     TEXT NOT NULL,
  received_at  INTEGER NOT NULL,
  instance_id  INTEGER,
  PRIMARY KEY (source, event_id)
) WITHOUT ROWID;

CREATE TABLE audit_log (
  seq          INTEGER PRIMARY KEY AUTOINCREMENT,
  at           INTEGER NOT NULL,
  actor        TEXT NOT NULL,
  tenant       TEXT NOT NULL,
  instance_id  INTEGER NOT NULL,
  action       TEXT NOT NULL,
  reason       TEXT NOT NULL,
  detail       TEXT NOT NULL DEFAULT '{}'
);
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;

CREATE TABLE alerts (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  instance_id  INTEGER NOT NULL,
  tenant       TEXT NOT NULL,
  step_name    TEXT NOT NULL,
  kind         INTEGER NOT NULL,
  state        INTEGER NOT NULL,
  message      TEXT NOT NULL,
  created_at   INTEGER NOT NULL,
  updated_at   INTEGER NOT NULL
);
CREATE INDEX alerts_open ON alerts (state, created_at);
