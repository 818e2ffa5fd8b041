-- The manifest digest of the image an attempt ran in (`sha256:` and 64
-- lowercase hex digits), as its worker pulled it: a tag can move, so this is
-- the one record of what ran. Set once, by mark_jobs_started, from the
-- worker's report that the attempt started; NULL when its runtime pulled no
-- image (the process runtime) or before it started.
ALTER TABLE attempts
  ADD COLUMN image_digest CHAR(71) CHARACTER SET ascii COLLATE ascii_bin NULL;
