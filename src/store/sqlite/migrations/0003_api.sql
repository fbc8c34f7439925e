-- API tokens: only a SHA-256 of each token is stored; the token is shown once.
CREATE TABLE api_tokens (
  token_hash  TEXT PRIMARY KEY,
  name        TEXT NOT NULL,
  tenant      TEXT NOT NULL,   -- a tenant, or '*' for all tenants
  role        TEXT NOT NULL,   -- viewer | operator | admin
  created_at  BIGINT NOT NULL,
  revoked_at  BIGINT NOT NULL DEFAULT 0
);
