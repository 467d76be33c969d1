-- Schema dumps (issue #13, ADR 0022). A schema-only pg_dump carries Trellis's schema, the
-- targets and the capture triggers, but no rows: loaded into a new database it has targets
-- and no transforms. The SQL dumpDefinitionsSql() appends registers each definition again
-- with restore_definition(), in the order they were defined, so the worker that starts on
-- the loaded database builds them. Only definitions are restored: the ledger, progress,
-- pauses, quarantine and claims are runtime state, and every restored transform starts at
-- waiting_to_backfill.

-- Capture left behind by the dumped database: triggers calling, and functions named for, a
-- source this catalog does not know (the dump's sources rows are runtime state, not
-- dumped). They would write ledger rows under ids that now mean other tables; the staging
-- worker installs capture afresh for every source a transform reads.
CREATE FUNCTION @schema@._drop_stale_capture()
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT tg.tgname, tg.tgrelid::regclass::text AS rel
      FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
     WHERE NOT tg.tgisinternal
       AND p.pronamespace = quote_ident(@schema_literal@)::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate)$'
       AND NOT EXISTS (SELECT 1 FROM @schema@.sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
  END LOOP;
  FOR r IN
    SELECT p.oid::regprocedure::text AS fn
      FROM pg_proc p
     WHERE p.pronamespace = quote_ident(@schema_literal@)::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate)$'
       AND NOT EXISTS (SELECT 1 FROM @schema@.sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE 'DROP FUNCTION ' || r.fn;
  END LOOP;
END
$fn$;

-- Key maps of transforms this catalog does not have (the dumped database's ids): a restored
-- transform gets a new id, whose map_<id> name the dump may already use.
CREATE FUNCTION @schema@._drop_stale_key_maps()
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT c.relname FROM pg_class c
     WHERE c.relnamespace = quote_ident(@schema_literal@)::regnamespace AND c.relkind = 'r'
       AND c.relname ~ '^map_[0-9]+$'
       AND NOT EXISTS (SELECT 1 FROM @schema@.transforms t
                        WHERE t.id = substring(c.relname FROM '^map_([0-9]+)$')::int)
  LOOP
    EXECUTE 'DROP TABLE ' || quote_ident(@schema_literal@) || '.' || quote_ident(r.relname);
  END LOOP;
END
$fn$;

-- Registers a dumped definition again: `statement` as the catalog held it, resolved with
-- the search_path it was defined under. The target the dump created is kept (with the
-- app's indexes, grants and the views that read it) when its columns are the ones the
-- definition gives now; without one, the target is created. The transform starts at
-- waiting_to_backfill, and its backfill empties the target first. A transform already
-- registered with the same statement is left as it is (a file loaded twice); with another
-- statement, the call fails (conflict).
-- Returns {"kind": "transform_restored" | "unchanged", "target"}.
CREATE FUNCTION @schema@.restore_definition(statement text, search_path text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  old_path text := current_setting('search_path');
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
  ast jsonb;
  tname text;
  existing @schema@.transforms;
  dumped oid;
  aside text;
  t @schema@.transforms;
  made text;
  kept text;
BEGIN
  IF tschema IS NULL THEN
    PERFORM @schema@._fail('TRV01', format(
      'the Trellis schema %I has no config row: load its migrations and config rows (dumpDefinitionsSql() writes them) first',
      @schema_literal@));
  END IF;
  ast := @schema@.parse_statement(statement);
  IF ast->>'kind' <> 'transform' THEN
    PERFORM @schema@._fail('TRV01', 'restore_definition() takes a TRANSFORM statement');
  END IF;
  PERFORM pg_advisory_xact_lock(1953653104, hashtext(@schema_literal@));
  tname := ast->'target'->>'name';
  SELECT * INTO existing FROM @schema@.transforms x
   WHERE x.target_schema = tschema AND x.target_name = tname;
  IF FOUND THEN
    IF existing.statement = restore_definition.statement THEN
      RETURN jsonb_build_object('kind', 'unchanged', 'target', tname);
    END IF;
    PERFORM @schema@._fail('TRC01', format(
      'a transform named %I is already defined, with another statement: DROP TRANSFORM it first', tname));
  END IF;
  PERFORM @schema@._drop_stale_capture();
  PERFORM @schema@._drop_stale_key_maps();

  -- The dumped target moves aside while the statement is defined again (which makes a
  -- target of its own), then takes that one's place.
  dumped := to_regclass(quote_ident(tschema) || '.' || quote_ident(tname));
  IF dumped IS NOT NULL THEN
    aside := 'trellis_restoring_' || dumped::text;
    EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', tschema, tname, aside);
  END IF;
  PERFORM set_config('search_path', restore_definition.search_path, true);
  PERFORM @schema@._define(ast, restore_definition.statement);
  PERFORM set_config('search_path', old_path, true);
  SELECT * INTO t FROM @schema@.transforms x WHERE x.target_schema = tschema AND x.target_name = tname;

  IF dumped IS NOT NULL THEN
    SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY a.attnum)
      INTO made FROM pg_attribute a WHERE a.attrelid = t.target_oid AND a.attnum > 0 AND NOT a.attisdropped;
    SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY a.attnum)
      INTO kept FROM pg_attribute a WHERE a.attrelid = dumped AND a.attnum > 0 AND NOT a.attisdropped;
    IF made IS DISTINCT FROM kept THEN
      PERFORM @schema@._fail('TRC01', format(
        'the target %I.%I in this database has the columns (%s), but its definition gives (%s) here: the sources differ from the dumped database''s',
        tschema, tname, kept, made));
    END IF;
    EXECUTE 'DROP TABLE ' || t.target_oid::regclass::text;
    EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', tschema, aside, tname);
    UPDATE @schema@.transforms SET target_oid = dumped WHERE id = t.id RETURNING * INTO t;
    -- Its key and guard as Trellis makes them (the dump should have both).
    PERFORM @schema@._repair_target(t);
  END IF;
  -- The backfill empties the target first: a dump with rows loads no stale ones.
  PERFORM @schema@._request_rebuild(t.id);
  RETURN jsonb_build_object('kind', 'transform_restored', 'target', tname);
END
$fn$;
