-- A retype followed (ADR 0047) reaches every transform downstream of it (issue #24's
-- randomized runs found two ways it did not, one of them silent):
--
-- - Through a UNION's table: a branch's target column was retyped, and the union's table
--   (0041: an engine table the branches' rows are mirrored into) kept the old type, so a
--   value the new type holds was cast into the old one on its way (numeric(12,2) rounding
--   1.005 to 1.01), and the transform reading the union saw no change of its source: the
--   target silently held other values than its statement. Now, once a round has followed
--   transforms feeding a union's table, the table's columns are retyped, in the same
--   transaction and before any refill, to the types Postgres gives the UNION ALL of its
--   branches' targets as they now are; the transforms reading the table then follow it in
--   the next round. At the round's end, not with each branch: with the branches' page
--   slots and targets held, no drain can be writing the table through a branch's mirror
--   while waiting for a branch this transaction is about to lock (a deadlock).
-- - Down a chain: the transforms reading a followed target were looked at by the same pass
--   only as they were when it began, so the target's retyped column made the staging
--   worker stop them (capture_failure) instead of following them. _follow_source_columns
--   now goes on until a round follows nothing new, each transform once.
--
-- - Keys held before the follow: tried again once it is done (_follow_transform wrapped,
--   0030's renamed _follow_transform_before_release).
--
-- _follow_source_columns (0030, its only body) is replaced, its change marked "0052".


ALTER FUNCTION @schema@._follow_transform(@schema@.transforms) RENAME TO _follow_transform_before_release;

-- As before (0030), and the transform's held keys go back into the ledger, as RESUME puts
-- them (0011): a key held between the retype and this follow (a value the new type holds
-- but the target's old column could not: "integer out of range") is tried again once the
-- target is retyped, rather than held until an operator releases it.
CREATE FUNCTION @schema@._follow_transform(t @schema@.transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM @schema@._follow_transform_before_release(t);
  WITH released AS (
    DELETE FROM @schema@.held_keys h WHERE h.transform_id = t.id RETURNING h.source_id, h.key)
  INSERT INTO @schema@.ledger (gen, source_id, xid, keys)
  SELECT @schema@.ledger_generation(x.xid), r.source_id, x.xid,
         ARRAY[CASE WHEN cardinality(r.key) = 1 THEN r.key[1] ELSE r.key::text END]
    FROM (SELECT DISTINCT source_id, key FROM released) r,
         (SELECT pg_current_xact_id()::text::bigint AS xid) x;
END
$fn$;

-- Retypes the columns of union table `u` to the types of the UNION ALL of the targets that
-- feed it, as they are now (Postgres's resolution of the branches' types).
CREATE FUNCTION @schema@._follow_union_table(u oid)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  cols text;
  q text;
  probe oid;
  r record;
BEGIN
  SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols
    FROM pg_attribute a
   WHERE a.attrelid = u AND a.attnum > 0 AND NOT a.attisdropped
     AND a.attname NOT IN ('trellis#branch', 'trellis#key');
  SELECT string_agg(format('SELECT %s FROM %s', cols, t.target_oid::regclass), ' UNION ALL ' ORDER BY f.branch)
    INTO q
    FROM @schema@.union_feeds f JOIN @schema@.transforms t ON t.id = f.transform_id
   WHERE f.table_oid = u;
  IF q IS NULL THEN
    RETURN;
  END IF;
  EXECUTE 'CREATE TEMP TABLE trellis_union_probe AS ' || q || ' WITH NO DATA';
  probe := to_regclass('pg_temp.trellis_union_probe');
  FOR r IN
    SELECT a.attname, format_type(p.atttypid, p.atttypmod) AS want
      FROM pg_attribute a JOIN pg_attribute p ON p.attrelid = probe AND p.attname = a.attname
     WHERE a.attrelid = u AND a.attnum > 0 AND NOT a.attisdropped
       AND (a.atttypid, a.atttypmod) IS DISTINCT FROM (p.atttypid, p.atttypmod)
     ORDER BY a.attnum
  LOOP
    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s USING %I::%s',
                   u::regclass, r.attname, r.want, r.attname, r.want);
  END LOOP;
  EXECUTE 'DROP TABLE pg_temp.trellis_union_probe';
END
$fn$;


CREATE OR REPLACE FUNCTION @schema@._follow_source_columns()
RETURNS TABLE (target text, refused text) LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms;
  seen int[] := '{}'; -- 0052: each transform looked at once per call
  looked int;         -- 0052: how many the last round looked at
  skip boolean;       -- 0052
  round_followed int[]; -- 0052: the transforms this round followed
  u oid;              -- 0052
BEGIN
  -- 0052: rounds until one looks at nothing new: a transform followed can retype the
  -- target (or union table) another transform reads, which the next round follows.
  LOOP
  looked := 0;
  round_followed := '{}';
  FOR t IN
    SELECT x.* FROM @schema@.transforms x
     WHERE x.capture_failure IS NULL AND x.paused_at IS NULL
       AND x.id <> ALL (seen) -- 0052
       AND EXISTS (
         SELECT 1 FROM @schema@.transform_sources ts
           CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) r
           JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attnum = (r->>'attnum')::int
          WHERE ts.transform_id = x.id AND NOT a.attisdropped
            AND (a.attname <> r->>'name' OR format_type(a.atttypid, a.atttypmod) <> r->>'type'))
       -- Nothing about its sources that stops it: every read column there, every source
       -- there with its key's columns (by attnum), and no column added to one it reads
       -- whole (its rows' JSON would change shape).
       AND NOT EXISTS (
         SELECT 1 FROM @schema@.transform_sources ts
           LEFT JOIN pg_class c ON c.oid = ts.source_oid
          WHERE ts.transform_id = x.id
            AND (c.oid IS NULL
                 OR EXISTS (SELECT 1 FROM jsonb_array_elements(ts.read_attrs) r
                             LEFT JOIN pg_attribute a ON a.attrelid = ts.source_oid
                                                     AND a.attnum = (r->>'attnum')::int
                             WHERE a.attnum IS NULL OR a.attisdropped)
                 OR (SELECT array_agg(a.attnum::int ORDER BY k.i)
                       FROM pg_index i
                       CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
                       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                      WHERE i.indrelid = ts.source_oid AND i.indisprimary)
                    IS DISTINCT FROM
                    ARRAY(SELECT (SELECT (r->>'attnum')::int FROM jsonb_array_elements(ts.read_attrs) r
                                   WHERE r->>'name' = k.name)
                            FROM unnest(ts.key_columns) WITH ORDINALITY AS k(name, i) ORDER BY k.i)
                 OR (coalesce((x.spec->>'whole_row')::boolean, false) AND EXISTS (
                       SELECT 1 FROM pg_attribute a
                        WHERE a.attrelid = ts.source_oid AND a.attnum > 0 AND NOT a.attisdropped
                          AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(ts.read_attrs) r
                                           WHERE (r->>'attnum')::int = a.attnum)))))
     ORDER BY x.id
  LOOP
    seen := seen || t.id; -- 0052
    looked := looked + 1; -- 0052
    target := t.target_name;
    skip := false;
    -- 0052: a deadlock or a lock not granted (a union's table is locked too, which the
    -- drain writes through the branches' mirrors) is tried again, not taken as a refusal
    -- (which would stop the transform).
    FOR attempt IN 1 .. 5 LOOP
      BEGIN
        -- Locks in the drain's order (page slots, pipeline row, target, catalog row): the
        -- drain applying a range to this target finishes first, and none starts meanwhile.
        PERFORM 1 FROM @schema@.page_slots s WHERE s.transform_id = t.id ORDER BY s.bucket FOR UPDATE;
        PERFORM 1 FROM @schema@.pipeline p WHERE p.transform_id = t.id FOR UPDATE;
        EXECUTE 'LOCK TABLE ' || t.target_oid::regclass::text || ' IN ACCESS EXCLUSIVE MODE';
        SELECT x.* INTO t FROM @schema@.transforms x WHERE x.id = t.id FOR UPDATE;
        IF t.capture_failure IS NOT NULL OR t.paused_at IS NOT NULL THEN
          skip := true;
          EXIT;
        END IF;
        PERFORM @schema@._follow_transform(t);
        refused := NULL;
        round_followed := round_followed || t.id;
        EXIT;
      EXCEPTION
        WHEN deadlock_detected OR lock_not_available THEN
          refused := SQLERRM;
          PERFORM pg_sleep(0.05 * attempt * (0.5 + random()));
        WHEN OTHERS THEN
          refused := SQLERRM;
          EXIT;
      END;
    END LOOP;
    CONTINUE WHEN skip;
    RETURN NEXT;
  END LOOP;
  -- 0052: the union tables the round's transforms feed, retyped as their branches now are.
  FOR u IN SELECT DISTINCT f.table_oid FROM @schema@.union_feeds f
            WHERE f.transform_id = ANY (round_followed) ORDER BY 1 LOOP
    FOR attempt IN 1 .. 5 LOOP
      BEGIN
        PERFORM @schema@._follow_union_table(u);
        EXIT;
      EXCEPTION WHEN deadlock_detected OR lock_not_available THEN
        IF attempt = 5 THEN
          RAISE;
        END IF;
        PERFORM pg_sleep(0.05 * attempt * (0.5 + random()));
      END;
    END LOOP;
  END LOOP;
  EXIT WHEN looked = 0; -- 0052
  END LOOP;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
