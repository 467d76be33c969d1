-- Builds filled by several drain loops at once (issue #14, ADR 0028). A build of a
-- projection or join first plans its chunks (key ranges of the FROM table, computed in
-- one pass over its key); any drain loop, in any process, then claims one with FOR UPDATE
-- SKIP LOCKED and fills it, deleting it in the same transaction. The build's pipeline row
-- is not locked by the fills, so they run side by side; the last step (the target's key
-- built back, statistics, catching_up) runs once no chunk is left to fill.

ALTER TABLE @schema@.pipeline DROP CONSTRAINT pipeline_backfill_stage_check;
-- 'chunks': the planned chunks of build_chunks are being filled (see drain/build-chunks.ts).
ALTER TABLE @schema@.pipeline ADD CONSTRAINT pipeline_backfill_stage_check
  CHECK (backfill_stage IN ('rows', 'chunks', 'groups', 'repair'));

CREATE TABLE @schema@.build_chunks (
  transform_id int NOT NULL REFERENCES @schema@.pipeline ON DELETE CASCADE,
  chunk int NOT NULL,
  -- Driving keys after `lo` up to and including `hi` (NULL: an open end), as text[].
  lo text[],
  hi text[],
  -- Driving rows in the chunk when it was planned (progress, not a bound).
  rows bigint NOT NULL,
  -- Its fill failed on a row: left to the last step, which re-derives it key by key with
  -- the target's key back, so the failing rows are held and the rest filled.
  repair boolean NOT NULL DEFAULT false,
  PRIMARY KEY (transform_id, chunk)
);

-- As before (0007), and the chunks of a build in progress go with it.
CREATE OR REPLACE FUNCTION @schema@._request_rebuild(transform_id int)
RETURNS void LANGUAGE sql AS $fn$
  UPDATE @schema@.pipeline
     SET phase = 'waiting_to_backfill', rebuild = true, backfill_stage = 'rows',
         open_lo = NULL, open_hi = NULL,
         open_pages = NULL, pages_left = NULL, backfill_position = NULL, backfill_done = 0,
         backfill_total = NULL, build_attempts = 0, build_error = NULL, build_next_at = NULL,
         updated_at = now()
   WHERE pipeline.transform_id = _request_rebuild.transform_id;
  DELETE FROM @schema@.pages WHERE pages.transform_id = _request_rebuild.transform_id;
  DELETE FROM @schema@.build_chunks WHERE build_chunks.transform_id = _request_rebuild.transform_id;
$fn$;

