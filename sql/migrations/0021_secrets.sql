-- Secrets of billing projects (issue 13): small files a project's jobs
-- mount read-only (JobSpec.secrets). The contents are only ever here as a
-- sealed box (services/common/sealing.py): encrypted for the deployment's
-- key pair, whose private half only the driver holds and which is not in
-- the database. The box is bound to its row (project and name are its
-- associated data), so moving it to another row makes it unreadable.
--
-- The frontend seals and may read every column but `sealed`; the driver
-- reads `sealed` to deliver a job's secrets; nobody else may read the
-- table (services/db/accounts.py).
CREATE TABLE secrets (
  billing_project VARCHAR(100) NOT NULL,
  name VARCHAR(64) NOT NULL,
  -- The file names (JSON array, sorted): listed; the contents are not.
  file_names TEXT NOT NULL,
  sealed MEDIUMBLOB NOT NULL,
  -- Which key pair sealed the box (services.common.sealing.key_id).
  key_id CHAR(16) NOT NULL,
  created_by VARCHAR(64) NOT NULL,
  time_created_ms BIGINT NOT NULL,
  PRIMARY KEY (billing_project, name),
  CONSTRAINT secrets_project FOREIGN KEY (billing_project) REFERENCES billing_projects (name)
) ENGINE=InnoDB;
