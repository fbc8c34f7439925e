-- Tokens expire, are listed and revoked by name: names become unique (older
-- duplicates keep their first holder's name; the others get '#' and the first
-- 12 characters of their hash, which `waystone token list` shows as the ID).
ALTER TABLE api_tokens ADD COLUMN expires_at BIGINT NOT NULL DEFAULT 0;  -- 0 = never
UPDATE api_tokens SET name = name || '#' || substr(token_hash, 1, 12)
 WHERE rowid NOT IN (SELECT MIN(rowid) FROM api_tokens GROUP BY name);
CREATE UNIQUE INDEX api_tokens_name ON api_tokens (name);

-- Keys the server derives public ids from (base/public_id.h): made once, here.
CREATE TABLE server_keys (
  name   TEXT PRIMARY KEY,
  value  TEXT NOT NULL
);
INSERT INTO server_keys VALUES ('public_ids', lower(hex(randomblob(32))));
