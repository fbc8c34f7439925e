-- Protection of fragile targets, shared by every worker on this database: per
-- (tenant, target) an operator's pause, the rate limit's next free slot and the
-- circuit breaker; and the calls under way, each a permit that expires when the
-- worker holding it dies.
CREATE TABLE target_controls (
  tenant TEXT NOT NULL,
  target TEXT NOT NULL,
  paused INTEGER NOT NULL DEFAULT 0,
  paused_by TEXT NOT NULL DEFAULT '',
  pause_reason TEXT NOT NULL DEFAULT '',
  paused_at BIGINT NOT NULL DEFAULT 0,
  next_slot_us BIGINT NOT NULL DEFAULT 0,
  failures INTEGER NOT NULL DEFAULT 0,
  open_until BIGINT NOT NULL DEFAULT 0,
  probe_until BIGINT NOT NULL DEFAULT 0,
  updated_at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant, target)
);
CREATE TABLE target_calls (
  tenant TEXT NOT NULL,
  target TEXT NOT NULL,
  permit TEXT NOT NULL,
  expires_at BIGINT NOT NULL,
  PRIMARY KEY (tenant, target, permit)
);
