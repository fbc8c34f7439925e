-- Tokens expire, are listed and revoked by name: names become unique (older
-- duplicates keep their first holder's name; the others get '#' and the first
-- 12 characters of their hash, which `waystone token list` shows as the ID).
ALTER TABLE api_tokens ADD COLUMN expires_at BIGINT NOT NULL DEFAULT 0;  -- 0 = never
UPDATE api_tokens t SET name = t.name || '#' || left(t.token_hash, 12)
 WHERE EXISTS (SELECT 1 FROM api_tokens o
                WHERE o.name = t.name AND (o.created_at, o.token_hash) < (t.created_at, t.token_hash));
CREATE UNIQUE INDEX api_tokens_name ON api_tokens (name);

-- Keys the server derives public ids from (base/public_id.h): made once, here.
CREATE TABLE server_keys (
  name   TEXT PRIMARY KEY,
  value  TEXT NOT NULL
);
INSERT INTO server_keys VALUES ('public_ids', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));
