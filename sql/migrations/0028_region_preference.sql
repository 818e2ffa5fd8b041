-- Which regions the deployment's machines are made in, in the order the
-- autoscaler asks for them: 0 is the cloud's first configured region, where
-- a job that names no region is placed first (ListRegions' default_region).
-- add_regions sets it from the cloud's configured regions at each driver
-- start; NULL for a region the cloud does not have (`local` in a cloud
-- deployment). A deployment with no cloud (corral up) ranks none: its local
-- provider makes machines in every region of the table.
ALTER TABLE regions
  ADD COLUMN preference TINYINT NULL;
