-- Samples only when something changed (ADR 0063).
--
-- The staging worker sampled every transform every ten seconds (0034), so an idle instance
-- wrote a row per transform every ten seconds, against I8 (idle transforms cost next to
-- nothing). A sample is now written only when the transform's lag (in segments), its
-- changed keys applied or its build's keys done differ from its latest sample. When a
-- change comes after such a quiet stretch, the pass before it (which found nothing
-- changed) is written first, as a copy of the latest sample at that pass's time: the
-- charts then show the quiet stretch as it was, flat, and the change from where it began,
-- not a slope across the stretch. The latest sample of each transform is kept past the
-- hour (history() reads the last hour only), so that a quiet instance writes nothing to
-- find out whether it changed.
--
-- Hidden parts (0036) and the shadows of redefinitions being built (0035) are left out:
-- they are not transforms an operator sees, and their keys are counted by their own.

DELETE FROM @schema@.samples s
 USING @schema@.transforms t
 WHERE t.id = s.transform_id AND (t.part_of IS NOT NULL OR t.redefines IS NOT NULL);

-- The transforms whose lag (segments), changed keys applied or build's keys done differ
-- from their latest sample (or that have none) at `p_at`: their values now and their
-- latest sample's. Hidden parts and shadows of redefinitions left out.
CREATE FUNCTION @schema@._sample_changes(p_at timestamptz)
RETURNS TABLE (transform_id int, lag_seconds float8, lag_segments bigint, keys bigint,
               backfill_done bigint, last_at timestamptz, last_lag_seconds float8,
               last_lag_segments bigint, last_keys bigint, last_backfill_done bigint)
LANGUAGE sql STABLE AS $fn$
  SELECT c.id, c.lag_seconds, c.lag_segments, c.keys, c.backfill_done,
         l.at, l.lag_seconds, l.lag_segments, l.keys, l.backfill_done
    FROM (SELECT t.id, coalesce(w.seconds, 0) AS lag_seconds, coalesce(w.segments, 0) AS lag_segments,
                 coalesce(d.keys, 0) AS keys, @schema@._keys_built(p) AS backfill_done
            FROM @schema@.transforms t
            JOIN @schema@.pipeline p ON p.transform_id = t.id
            LEFT JOIN @schema@.drain_time d ON d.transform_id = t.id
            LEFT JOIN LATERAL (
              SELECT count(*) AS segments,
                     extract(epoch FROM p_at - min(k.at))::float8 AS seconds
                FROM @schema@.ticks k WHERE k.seq > p.cursor_tick) w ON p.cursor_tick IS NOT NULL
           WHERE t.part_of IS NULL AND t.redefines IS NULL) c
    LEFT JOIN LATERAL (
      SELECT s.* FROM @schema@.samples s WHERE s.transform_id = c.id ORDER BY s.at DESC LIMIT 1) l ON true
   WHERE l.transform_id IS NULL
      OR c.lag_segments <> l.lag_segments OR c.keys <> l.keys
      OR c.backfill_done IS DISTINCT FROM l.backfill_done
$fn$;

-- Takes a sample of every transform that changed since its latest, and forgets samples
-- older than an hour but each transform's latest. `p_last_pass` is the `at` the previous
-- call of this election returned (null at first): the time as of which every transform
-- not sampled then was as its latest sample says. Returns how many samples it wrote and
-- the time of this pass. With nothing changed and nothing turning an hour old it only
-- reads (no transaction id, no WAL).
CREATE FUNCTION @schema@._sample(p_last_pass timestamptz, OUT written int, OUT at timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
  carried int;
BEGIN
  at := clock_timestamp();
  written := 0;
  -- Deletes nothing (and so writes nothing) unless a sample has just turned an hour old.
  DELETE FROM @schema@.samples s
   WHERE s.at < _sample.at - interval '1 hour'
     AND EXISTS (SELECT 1 FROM @schema@.samples n WHERE n.transform_id = s.transform_id AND n.at > s.at);
  IF NOT EXISTS (SELECT 1 FROM @schema@._sample_changes(at)) THEN
    RETURN;
  END IF;
  -- The quiet stretch, as the previous pass found it: the latest sample, at that pass.
  INSERT INTO @schema@.samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
  SELECT x.transform_id, p_last_pass,
         x.last_lag_seconds + CASE WHEN x.last_lag_segments > 0
                                   THEN extract(epoch FROM p_last_pass - x.last_at) ELSE 0 END,
         x.last_lag_segments, x.last_keys, x.last_backfill_done
    FROM @schema@._sample_changes(at) x
   WHERE p_last_pass IS NOT NULL AND x.last_at IS NOT NULL AND p_last_pass > x.last_at
     AND p_last_pass < _sample.at
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS carried = ROW_COUNT;
  -- Read again: the copies above are older than the samples they copy, not newer.
  INSERT INTO @schema@.samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
  SELECT x.transform_id, _sample.at, x.lag_seconds, x.lag_segments, x.keys, x.backfill_done
    FROM @schema@._sample_changes(at) x
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS written = ROW_COUNT;
  written := written + carried;
END
$fn$;

-- The 0034 form, for a process of the previous version: the same, with no previous pass.
CREATE OR REPLACE FUNCTION @schema@._sample()
RETURNS int LANGUAGE sql AS $fn$
  SELECT written FROM @schema@._sample(NULL::timestamptz)
$fn$;
