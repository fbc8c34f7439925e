-- Waystone schema v1 (PostgreSQL). Enum columns hold the frozen numeric values of
-- src/model/states.h; the same tables as the SQLite schema.

CREATE TABLE definitions (
  hash        TEXT PRIMARY KEY,
  workflow    TEXT NOT NULL,
  source      TEXT NOT NULL,
  body        TEXT NOT NULL,
  created_at  BIGINT NOT NULL
);

CREATE TABLE instances (
  id                BIGSERIAL PRIMARY KEY,
  tenant            TEXT NOT NULL,
  business_key      TEXT NOT NULL,
  workflow          TEXT NOT NULL,
  definition_hash   TEXT NOT NULL REFERENCES definitions(hash),
  input_json        TEXT NOT NULL,
  input_hash        TEXT NOT NULL,
  state             SMALLINT NOT NULL,
  status_reason     TEXT NOT NULL DEFAULT '',
  next_run_at       BIGINT NOT NULL,
  lease_owner       TEXT NOT NULL DEFAULT '',
  lease_expires_at  BIGINT NOT NULL DEFAULT 0,
  lease_epoch       BIGINT NOT NULL DEFAULT 0,
  trace_id          TEXT NOT NULL,
  source_event      TEXT NOT NULL DEFAULT '',
  created_at        BIGINT NOT NULL,
  updated_at        BIGINT NOT NULL,
  UNIQUE (tenant, business_key)
);
CREATE INDEX instances_due ON instances (next_run_at) WHERE state IN (1, 3);
CREATE INDEX instances_state ON instances (tenant, state, updated_at);

CREATE TABLE steps (
  instance_id            BIGINT NOT NULL REFERENCES instances(id),
  step_index             INTEGER NOT NULL,
  name                   TEXT NOT NULL,
  state                  SMALLINT NOT NULL,
  attempts               INTEGER NOT NULL DEFAULT 0,
  error_class            SMALLINT NOT NULL DEFAULT 0,
  error_message          TEXT NOT NULL DEFAULT '',
  external_id            TEXT NOT NULL DEFAULT '',
  response_json          TEXT NOT NULL DEFAULT '',
  idempotency_key        TEXT NOT NULL DEFAULT '',
  request_hash           TEXT NOT NULL DEFAULT '',
  resolution             SMALLINT NOT NULL DEFAULT 0,
  unknowns               INTEGER NOT NULL DEFAULT 0,
  lookups                INTEGER NOT NULL DEFAULT 0,
  compensation_attempts  INTEGER NOT NULL DEFAULT 0,
  next_attempt_at        BIGINT NOT NULL DEFAULT 0,
  started_at             BIGINT NOT NULL DEFAULT 0,
  finished_at            BIGINT NOT NULL DEFAULT 0,
  span_id                TEXT NOT NULL DEFAULT '',
  unknown_since          BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (instance_id, step_index)
);

CREATE TABLE idempotency_keys (
  tenant        TEXT NOT NULL,
  key           TEXT NOT NULL,
  request_hash  TEXT NOT NULL,
  instance_id   BIGINT NOT NULL,
  step_name     TEXT NOT NULL,
  created_at    BIGINT NOT NULL,
  expires_at    BIGINT NOT NULL,
  PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

-- txid orders rows by transaction: a relay expands only rows whose transaction id is
-- below the oldest still running, so a late commit is never skipped.
CREATE TABLE outbox (
  seq           BIGSERIAL PRIMARY KEY,
  txid          XID8 NOT NULL DEFAULT pg_current_xact_id(),
  event_id      TEXT NOT NULL UNIQUE,
  instance_id   BIGINT NOT NULL,
  tenant        TEXT NOT NULL,
  type          TEXT NOT NULL,
  payload       TEXT NOT NULL,
  created_at    BIGINT NOT NULL,
  delivered_at  BIGINT
);
CREATE INDEX outbox_txid ON outbox (txid, seq);
CREATE INDEX outbox_instance ON outbox (instance_id, seq);

CREATE TABLE inbox (
  source       TEXT NOT NULL,
  event_id     TEXT NOT NULL,
  received_at  BIGINT NOT NULL,
  instance_id  BIGINT,
  PRIMARY KEY (source, event_id)
);

CREATE TABLE audit_log (
  seq          BIGSERIAL PRIMARY KEY,
  at           BIGINT NOT NULL,
  actor        TEXT NOT NULL,
  tenant       TEXT NOT NULL,
  instance_id  BIGINT NOT NULL,
  action       TEXT NOT NULL,
  reason       TEXT NOT NULL,
  detail       TEXT NOT NULL DEFAULT '{}'
);
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit_log is append-only';
END;
$$;
CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE ON audit_log
  FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();

CREATE TABLE alerts (
  id           BIGSERIAL PRIMARY KEY,
  instance_id  BIGINT NOT NULL,
  tenant       TEXT NOT NULL,
  step_name    TEXT NOT NULL,
  kind         SMALLINT NOT NULL,
  state        SMALLINT NOT NULL,
  message      TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  updated_at   BIGINT NOT NULL
);
CREATE INDEX alerts_open ON alerts (state, created_at);
