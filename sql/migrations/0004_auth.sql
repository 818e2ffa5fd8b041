-- The auth service's tables. Passwords and tokens are stored only as
-- hashes: a database dump reveals no credential.

CREATE TABLE users (
  username VARCHAR(100) NOT NULL PRIMARY KEY,
  kind ENUM('person', 'service') NOT NULL DEFAULT 'person',
  roles SET('user', 'developer', 'admin') NOT NULL DEFAULT 'user',
  state ENUM('active', 'deactivated') NOT NULL DEFAULT 'active',
  display_name VARCHAR(255) NOT NULL DEFAULT '',
  email VARCHAR(255) NOT NULL DEFAULT '',
  -- scrypt$<n>$<r>$<p>$<salt hex>$<hash hex>; NULL: no password login.
  password_hash VARCHAR(255) NULL,
  time_created_ms BIGINT NOT NULL,
  time_deactivated_ms BIGINT NULL
) ENGINE=InnoDB;

-- Bearer tokens: the secret handed out once is "<token_id>.<random>"; only
-- SHA-256 of the whole secret is kept (the random part is 256 bits, so no
-- salt or slow hash is needed).
CREATE TABLE tokens (
  token_id CHAR(16) NOT NULL PRIMARY KEY,
  secret_sha256 CHAR(64) NOT NULL UNIQUE,
  username VARCHAR(100) NOT NULL,
  kind ENUM('session', 'api') NOT NULL,
  name VARCHAR(255) NOT NULL DEFAULT '',
  time_created_ms BIGINT NOT NULL,
  time_expires_ms BIGINT NOT NULL,
  time_revoked_ms BIGINT NULL,
  INDEX tokens_user (username, time_expires_ms),
  CONSTRAINT tokens_user FOREIGN KEY (username) REFERENCES users (username)
) ENGINE=InnoDB;
