-- Leadership as a lease that expires (issue 10). Wave 1 elected the leader
-- with a MySQL named lock held on a connection of its own: a paused leader
-- (SIGSTOP, a long GC pause, a partition that leaves its TCP connection up)
-- kept that connection and so the lock, and nobody took over; Galera does
-- not support named locks either.
--
-- One row says which driver leads, under which epoch, and until when by
-- the database's clock (UTC_TIMESTAMP(6): no driver's clock is ever
-- compared with it, and UTC because NOW() follows each session's time
-- zone). The leader renews it every second or so (renew_leader_lease); a
-- standby takes it over only once it has expired (acquire_leader_lease),
-- and the takeover increments leader_epoch.epoch, the fencing every
-- state-changing driver procedure checks. expires_at NULL or in the past:
-- nobody leads.
--
-- Apart from leader_epoch on purpose: every driver transaction share-locks
-- the epoch row (check_epoch), and a renewal that updated it every second
-- would wait for the longest of them, and make every later one wait behind
-- it. Driver transactions never touch this row. Lock order of the lease
-- procedures: leader_lease, then leader_epoch.
CREATE TABLE leader_lease (
  singleton TINYINT NOT NULL PRIMARY KEY DEFAULT 1,
  epoch BIGINT NOT NULL,
  holder_name VARCHAR(255) NULL,
  acquired_at DATETIME(6) NULL,
  renewed_at DATETIME(6) NULL,
  expires_at DATETIME(6) NULL,
  CONSTRAINT leader_lease_single_row CHECK (singleton = 1)
) ENGINE=InnoDB;

-- Whoever led under the named lock holds no lease: the first driver to
-- campaign takes over, with the next epoch.
INSERT INTO leader_lease (singleton, epoch, holder_name) SELECT 1, epoch, leader_name FROM leader_epoch;
