-- Capture edges and definitions under load (issue #21 items 2, 8, 9 and 12).

-- Item 8: a statement deadlocking with the app's writers or the engine's workers (40P01),
-- or failing a serialization check (40001), is run again, up to 8 times with a short
-- jittered backoff, inside the caller's transaction (each attempt is a subtransaction: the
-- losing attempt's locks are released, so the other side goes on). Postgres picks the
-- victim that waited first; retried, the statement goes through once the other side
-- committed. Exhausted, it fails with TRT01 (the handle's `transient`), never as an
-- uncoded database error.
CREATE FUNCTION @schema@._apply_retrying(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  attempt int := 0;
  attempts constant int := 8;
  last_error text;
BEGIN
  LOOP
    attempt := attempt + 1;
    BEGIN
      RETURN @schema@._apply(statement, transform_only);
    EXCEPTION WHEN deadlock_detected OR serialization_failure THEN
      GET STACKED DIAGNOSTICS last_error = MESSAGE_TEXT;
      IF attempt >= attempts THEN
        RAISE EXCEPTION USING ERRCODE = 'TRT01',
          MESSAGE = format('the statement met concurrent work %s times in a row (%s): try it again',
                           attempts, last_error),
          HINT = 'Nothing was changed. Writers or the engine''s workers held the same rows; the statement can be repeated as it is.';
      END IF;
      PERFORM pg_sleep(0.02 * attempt + random() * 0.05 * attempt);
    END;
  END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.apply(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT @schema@._apply_retrying(statement, false)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.define(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT @schema@._apply_retrying(statement, true)
$fn$;

-- Item 2 (ADR 0039): a table a logical replication subscription writes. Postgres's apply
-- worker fires row-level triggers only (and only those enabled REPLICA or ALWAYS), never
-- the statement-level capture triggers: such a source also gets a row-level capture
-- trigger, ENABLE REPLICA (src/engine/capture/trigger-sql.ts). True when the table, or a
-- partition or inheritance child of it, is in some subscription of this database.
CREATE FUNCTION @schema@._subscribed(rel oid)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE tree(relid) AS (
    SELECT rel
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
  SELECT EXISTS (SELECT 1 FROM pg_subscription_rel sr WHERE sr.srrelid IN (SELECT relid FROM tree))
$fn$;

-- _capture_status as in 0020, with each source's `subscribed`.
CREATE OR REPLACE FUNCTION @schema@._capture_status(p_transform_id bigint)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object(
    'setting', c.capture,
    'sources', coalesce((
      SELECT jsonb_agg(jsonb_build_object(
               'table', coalesce(src.qualified, ts.source_schema || '.' || ts.source_name),
               'mode', CASE WHEN src.wal_state = 'ready' AND src.installed_at IS NULL THEN 'logical'
                            WHEN src.wal_state IS NULL THEN 'trigger'
                            ELSE 'switching' END,
               'reason', CASE WHEN c.capture = 'logical' AND src.wal_state IS NULL
                               AND EXISTS (SELECT 1 FROM pg_class rc WHERE rc.oid = ts.source_oid)
                              THEN @schema@._wal_ineligible(ts.source_oid) END,
               'subscribed', @schema@._subscribed(ts.source_oid))
             ORDER BY ts.ordinal)
        FROM @schema@.transform_sources ts
        LEFT JOIN @schema@.sources src ON src.source_oid = ts.source_oid
       WHERE ts.transform_id = p_transform_id), '[]'),
    'slot', CASE WHEN c.wal_slot IS NOT NULL THEN (
      SELECT jsonb_build_object(
               'name', c.wal_slot, 'limitBytes', c.wal_retention_limit,
               'retainedBytes', pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::bigint,
               'confirmedLsn', rs.confirmed_flush_lsn::text)
        FROM (SELECT 1) one
        LEFT JOIN pg_replication_slots rs
               ON rs.slot_name = c.wal_slot AND rs.database = current_database()) END)
  FROM @schema@.config c
$fn$;

-- _capture_fingerprint as in 0019, with the subscriptions' rows for the sources: a table
-- becoming a subscription's target (or leaving one) brings a reconcile pass within a tick
-- check, as DDL on it does.
CREATE OR REPLACE FUNCTION @schema@._capture_fingerprint()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE src(oid) AS (SELECT DISTINCT source_oid FROM @schema@.transform_sources),
  tree(relid) AS (
    SELECT oid FROM src
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  rel(oid) AS (SELECT relid FROM tree UNION SELECT target_oid FROM @schema@.transforms),
  pub AS (SELECT p.oid, p.xmin FROM pg_publication p WHERE p.pubname = @schema@._wal_publication())
  SELECT concat_ws('/',
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transforms),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transform_columns),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transform_sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.config),
    (SELECT count(*) || ':' || coalesce(sum(c.xmin::text::bigint), 0)
       FROM pg_class c WHERE c.oid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(a.xmin::text::bigint), 0)
       FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM rel) AND a.attnum > 0),
    (SELECT count(*) || ':' || coalesce(sum(x.xmin::text::bigint), 0)
       FROM pg_index x WHERE x.indrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(g.xmin::text::bigint), 0)
       FROM pg_trigger g WHERE g.tgrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(p.xmin::text::bigint), 0)
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname = @schema_literal@),
    (SELECT count(*) || ':' || coalesce(sum(pub.xmin::text::bigint), 0) FROM pub),
    (SELECT count(*) || ':' || coalesce(sum(r.xmin::text::bigint), 0)
       FROM pg_publication_rel r WHERE r.prpubid IN (SELECT oid FROM pub)),
    (SELECT count(*) || ':' || coalesce(sum(sr.xmin::text::bigint), 0)
       FROM pg_subscription_rel sr WHERE sr.srrelid IN (SELECT oid FROM rel)))
$fn$;

-- _drop_stale_capture as in 0016, with the row-level capture functions (capture_<id>_row)
-- and their triggers.
CREATE OR REPLACE FUNCTION @schema@._drop_stale_capture()
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT tg.tgname, tg.tgrelid::regclass::text AS rel
      FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
     WHERE NOT tg.tgisinternal AND tg.tgparentid = 0
       AND p.pronamespace = quote_ident(@schema_literal@)::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate|row)$'
       AND NOT EXISTS (SELECT 1 FROM @schema@.sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
  END LOOP;
  FOR r IN
    SELECT p.oid::regprocedure::text AS fn
      FROM pg_proc p
     WHERE p.pronamespace = quote_ident(@schema_literal@)::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate|row)$'
       AND NOT EXISTS (SELECT 1 FROM @schema@.sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE 'DROP FUNCTION ' || r.fn;
  END LOOP;
END
$fn$;
