-- Events delivered to a code workflow's instance while its function did not wait
-- for their type: kept in arrival order (seq) until a WaitEvent for the type takes
-- the oldest, in the transaction that records the wait step (taken_by: its index).
CREATE TABLE kept_events (
  instance_id  BIGINT NOT NULL,
  seq          BIGINT NOT NULL,
  event_type   TEXT NOT NULL,
  source       TEXT NOT NULL,
  event_id     TEXT NOT NULL,
  data_json    TEXT NOT NULL,
  received_at  BIGINT NOT NULL,
  taken_by     INTEGER,
  taken_at     BIGINT,
  PRIMARY KEY (instance_id, seq)
);
