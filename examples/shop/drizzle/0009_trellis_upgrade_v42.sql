-- Written by `trellis generate upgrade` (trellis-pg 0.2.0).
-- trellis-pg: upgrade the Trellis catalog schema "trellis" from version 36 to version 42.
-- Only the migrations after version 36, each version-guarded and locked: safe to run again,
-- and beside Trellis.migrate(). A database below version 36 is refused with what to run.
DO $trellis_upgrade$
DECLARE
  newer int;
  boss_version int;
  installed int := 0;
BEGIN
  PERFORM pg_advisory_xact_lock(1953654124, hashtext('trellis'));
  IF to_regclass('"trellis".migrations') IS NOT NULL THEN
    SELECT coalesce(max(version), 0) INTO installed FROM "trellis".migrations;
  END IF;
  IF installed < 36 THEN
    RAISE EXCEPTION 'the Trellis schema % is at version %, and this migration upgrades it from version 36 to 42', 'trellis', installed
      USING ERRCODE = 'TRI01',
            HINT = 'run the migrations that bring it to version 36 first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)';
  END IF;
  SELECT max(version) INTO newer FROM "trellis".migrations WHERE version > 42 AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (42): upgrade trellis-pg',
      'trellis', newer USING ERRCODE = 'TRI01';
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 37) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (37, 'placeholder', false);
    EXECUTE $trellis_m37$-- Placeholder: keeps migration numbers contiguous until the lead merges branches (h-redef).
$trellis_m37$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 38) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (38, 'placeholder', false);
    EXECUTE $trellis_m38$-- Placeholder: keeps migration numbers contiguous until the lead merges branches (h-redef).
$trellis_m38$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 39) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (39, 'placeholder', false);
    EXECUTE $trellis_m39$-- Placeholder: keeps migration numbers contiguous until the lead merges branches (h-redef).
$trellis_m39$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 40) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (40, 'placeholder', false);
    EXECUTE $trellis_m40$-- Placeholder: keeps migration numbers contiguous until the lead merges branches (h-redef).
$trellis_m40$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 41) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (41, 'placeholder', false);
    EXECUTE $trellis_m41$-- Placeholder: keeps migration numbers contiguous until the lead merges branches (h-redef).
$trellis_m41$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 42) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (42, 'redefine_bounded_lock', false);
    EXECUTE $trellis_m42$-- A redefinition's switch holds the target's ACCESS EXCLUSIVE lock for metadata only
-- (issue #25, ADR 0055's addendum). Before: a column added, retyped or replaced was
-- written under ACCESS EXCLUSIVE (ALTER TABLE, then every row updated: 1.5 s for 50,000
-- rows). Now, once the shadow is live and the switch can be staged:
--
-- 1. _redefine_prepare, a short transaction of its own: each column the new definition
--    adds, retypes or replaces is added to the target as a staged column
--    "trellis#<shadow id>#<ordinal>" (ADD COLUMN without a rewrite: nullable, or NOT NULL
--    with a constant default taken from the shadow, which Postgres records without
--    touching a row).
-- 2. _redefine_fill, batches of rows by key, each a transaction holding the drain's locks of
--    the transform and its shadow: the staged columns take the shadow's values. The old
--    definition keeps maintaining the target's own columns; readers read those.
-- 3. _redefine_switch, one transaction: under EXCLUSIVE (readers go on, seeing the old rows)
--    the rows the drains changed since are made the shadow's (kept and staged columns), the
--    rows the new definition lacks deleted, the keys it adds listed; then under ACCESS
--    EXCLUSIVE, metadata only: old columns dropped, staged ones renamed, defaults dropped,
--    NOT NULL adjusted, the listed rows inserted.
--
-- Where the switch cannot be staged (the key changes, the engine's join indexes change, a
-- retyped column carries the app's index, constraint, grant or comment, or a chain reads
-- it), it goes as before (_redefine_switch's classic path, ALTER COLUMN TYPE under the lock).

-- How the switch of shadow `s` (redefining `t`, by `plan`) can be staged: {staged: false}
-- when it cannot; else {staged: true, columns: [{name, staged, type, collation, not_null}]}
-- (the columns to stage: added, retyped, replaced).
CREATE FUNCTION "trellis"._redefine_staging(t "trellis".transforms, s "trellis".transforms, plan jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  c jsonb;
  att pg_attribute;
  columns jsonb := '[]';
  keys text[];
  old_wanted text[];
  new_wanted text[];
BEGIN
  IF (plan->>'key_changed')::boolean OR jsonb_array_length(coalesce(s.spec->'key', '[]')) = 0
     OR coalesce((s.spec->>'key_nullable')::boolean, false) THEN
    RETURN jsonb_build_object('staged', false);
  END IF;
  new_wanted := ARRAY(SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                        FROM jsonb_array_elements(s.spec->'sources') src
                       WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');
  old_wanted := ARRAY(SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                        FROM jsonb_array_elements(t.spec->'sources') src
                       WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');
  IF new_wanted IS DISTINCT FROM old_wanted THEN
    RETURN jsonb_build_object('staged', false);
  END IF;
  -- Columns the engine's own objects stand on: the key, joined tables' keys.
  keys := ARRAY(SELECT jsonb_array_elements_text(s.spec->'key'))
    || ARRAY(SELECT jsonb_array_elements_text(t.spec->'key'))
    || ARRAY(SELECT k FROM jsonb_array_elements((s.spec->'sources') || (t.spec->'sources')) src,
                           jsonb_array_elements_text(CASE WHEN jsonb_typeof(src->'target_key_columns') = 'array'
                                                          THEN src->'target_key_columns' ELSE '[]' END) k);
  FOR c IN SELECT value FROM jsonb_array_elements(plan->'columns') LOOP
    CONTINUE WHEN c->>'action' = 'drop';
    IF c->>'action' IN ('retype', 'replace') THEN
      SELECT * INTO att FROM pg_attribute a
       WHERE a.attrelid = t.target_oid AND a.attname = c->>'name' AND NOT a.attisdropped;
      IF NOT FOUND OR c->>'name' = ANY (keys) OR att.attacl IS NOT NULL
         OR col_description(t.target_oid, att.attnum) IS NOT NULL
         OR cardinality("trellis"._column_dependants(t, att.attnum)) > 0
         OR EXISTS (SELECT 1 FROM "trellis".transform_sources ts JOIN "trellis".transforms x ON x.id = ts.transform_id
                     WHERE ts.source_oid = t.target_oid AND x.id <> t.id AND x.id <> s.id
                       AND c->>'name' = ANY (ts.read_columns::text[])) THEN
        RETURN jsonb_build_object('staged', false);
      END IF;
    END IF;
    columns := columns || jsonb_build_object(
      'name', c->>'name', 'type', c->>'type', 'collation', c->'collation',
      'staged', 'trellis#' || s.id || '#' || (SELECT cc.ordinal FROM "trellis".transform_columns cc
                                              WHERE cc.transform_id = s.id AND cc.name = c->>'name'),
      'not_null', coalesce((SELECT a.attnotnull FROM pg_attribute a
                             WHERE a.attrelid = s.target_oid AND a.attname = c->>'name' AND NOT a.attisdropped), false));
  END LOOP;
  RETURN jsonb_build_object('staged', true, 'columns', columns);
END
$fn$;

-- Step 1 (the staging worker, in a transaction of its own with a short lock_timeout, once
-- the shadow is live): the staged columns added to the target, each without a rewrite.
-- Returns how many were added now (0: none to stage, already added, or not staged).
CREATE FUNCTION "trellis"._redefine_prepare(shadow_id int)
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
  plan jsonb;
  st jsonb;
  c jsonb;
  lit text;
  added int := 0;
BEGIN
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  plan := "trellis"._redefine_plan(t, s.spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    RETURN 0;
  END IF;
  st := "trellis"._redefine_staging(t, s, plan);
  IF NOT (st->>'staged')::boolean THEN
    RETURN 0;
  END IF;
  FOR c IN SELECT value FROM jsonb_array_elements(st->'columns') LOOP
    CONTINUE WHEN EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid
                             AND a.attname = c->>'staged' AND NOT a.attisdropped);
    lit := NULL;
    IF (c->>'not_null')::boolean THEN
      -- A constant default: Postgres records it as the value of the rows there are, with
      -- no rewrite and no scan; the fill and the switch write the real values.
      EXECUTE format('SELECT n.%I::text FROM %s n WHERE n.%I IS NOT NULL LIMIT 1', c->>'name',
                     s.target_oid::regclass::text, c->>'name') INTO lit;
    END IF;
    EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s%s%s', t.target_oid::regclass::text, c->>'staged', c->>'type',
                   coalesce(' COLLATE ' || (c->>'collation'), ''),
                   CASE WHEN lit IS NOT NULL THEN format(' NOT NULL DEFAULT %L::%s', lit, c->>'type') ELSE '' END);
    added := added + 1;
  END LOOP;
  RETURN added;
END
$fn$;

-- Step 2: one batch of the fill, the shadow's rows after key `after` (NULL: from the
-- first), at most `batch` of them: the target's staged columns take the shadow's values
-- where they differ. Holds the drain's locks of the transform and its shadow (page slots,
-- then pipeline rows, as the drain takes them) for the batch. Returns {updated, last}:
-- `last` the batch's last key (text values) to pass on, NULL once every row was seen.
CREATE FUNCTION "trellis"._redefine_fill(shadow_id int, after text[], batch int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
  plan jsonb;
  st jsonb;
  staged jsonb;
  ids int[];
  keys text[];
  key_list text;
  cond text := 'true';
  result jsonb;
BEGIN
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  ids := ARRAY(SELECT i FROM unnest(ARRAY[s.id, s.redefines]) i ORDER BY i);
  PERFORM 1 FROM "trellis".page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM "trellis".pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  plan := "trellis"._redefine_plan(t, s.spec);
  st := "trellis"._redefine_staging(t, s, plan);
  IF NOT (st->>'staged')::boolean THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  staged := (SELECT coalesce(jsonb_agg(c), '[]') FROM jsonb_array_elements(st->'columns') c
              WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid
                               AND a.attname = c->>'staged' AND NOT a.attisdropped));
  IF jsonb_array_length(staged) = 0 THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  PERFORM set_config('trellis.maintaining', 'trellis', true);
  keys := ARRAY(SELECT jsonb_array_elements_text(s.spec->'key'));
  key_list := (SELECT string_agg(quote_ident(k), ', ') FROM unnest(keys) k);
  IF after IS NOT NULL THEN
    cond := '(' || (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k) || ') > ('
      || (SELECT string_agg(format('%L::%s', after[o], format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY o)
            FROM unnest(keys) WITH ORDINALITY AS u(k, o)
            JOIN pg_attribute a ON a.attrelid = s.target_oid AND a.attname = u.k) || ')';
  END IF;
  EXECUTE format(
    'WITH b AS (SELECT %s FROM %s n WHERE %s ORDER BY %s LIMIT %s),'
    ' u AS (UPDATE %s t SET (%s) = ROW(%s) FROM b JOIN %s n ON %s WHERE %s AND record_image_ne(ROW(%s), ROW(%s)) RETURNING 1)'
    ' SELECT jsonb_build_object(''updated'', (SELECT count(*) FROM u),'
    ' ''last'', (SELECT to_jsonb(ARRAY[%s]) FROM b ORDER BY %s LIMIT 1))',
    (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k),
    s.target_oid::regclass::text, cond, key_list, batch,
    t.target_oid::regclass::text,
    (SELECT string_agg(quote_ident(c->>'staged'), ', ') FROM jsonb_array_elements(staged) c),
    (SELECT string_agg('n.' || quote_ident(c->>'name'), ', ') FROM jsonb_array_elements(staged) c),
    s.target_oid::regclass::text,
    (SELECT string_agg(format('n.%I = b.%I', k, k), ' AND ') FROM unnest(keys) k),
    (SELECT string_agg(format('t.%I = n.%I', k, k), ' AND ') FROM unnest(keys) k),
    (SELECT string_agg('t.' || quote_ident(c->>'staged'), ', ') FROM jsonb_array_elements(staged) c),
    (SELECT string_agg('n.' || quote_ident(c->>'name'), ', ') FROM jsonb_array_elements(staged) c),
    (SELECT string_agg('b.' || quote_ident(k) || '::text', ', ') FROM unnest(keys) k),
    (SELECT string_agg('b.' || quote_ident(k) || ' DESC', ', ') FROM unnest(keys) k))
  INTO result;
  RETURN jsonb_build_object('updated', result->'updated',
                            'last', CASE WHEN jsonb_typeof(result->'last') = 'array' THEN result->'last' END);
END
$fn$;

-- 0035's _drop_redefinition, and a shadow's staged columns dropped from the target with it
-- (a redefinition replaced, given up, or dropped with its transform).
CREATE OR REPLACE FUNCTION "trellis"._drop_redefinition()
RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  IF OLD.redefines IS NULL THEN
    DELETE FROM "trellis".transforms s WHERE s.redefines = OLD.id;
  ELSE
    -- 0042
    FOR r IN SELECT a.attrelid, a.attname FROM "trellis".transforms x
               JOIN pg_attribute a ON a.attrelid = x.target_oid
              WHERE x.id = OLD.redefines AND NOT a.attisdropped
                AND starts_with(a.attname, 'trellis#' || OLD.id || '#') LOOP
      EXECUTE format('ALTER TABLE %s DROP COLUMN %I', r.attrelid::regclass::text, r.attname);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = OLD.target_oid) THEN
      EXECUTE 'DROP TABLE ' || OLD.target_oid::regclass::text;
    END IF;
    EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || OLD.id);
  END IF;
  RETURN OLD;
END
$fn$;

-- Step 3: 0035's _redefine_switch, with the staged path (see the top of this file): when
-- _redefine_prepare added every column to stage, the rows are written under EXCLUSIVE and
-- ACCESS EXCLUSIVE covers the metadata and the rows the new definition adds; otherwise as
-- before. Reports also readersBlockedMs (how long ACCESS EXCLUSIVE was held: 0 when the
-- switch took none) and staged.
CREATE OR REPLACE FUNCTION "trellis"._redefine_switch(shadow_id int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
  x "trellis".transforms;
  p "trellis".pipeline;
  ids int[];
  rel text;
  shadow_rel text;
  plan jsonb;
  c jsonb;
  ddl boolean;
  key_changed boolean;
  locked_at timestamptz;
  r record;
  cols text;
  keys text;
  key_match text;
  deleted bigint := 0;
  gone bigint := 0;
  written bigint := 0;
  wanted text[];
  detail text;
  new_key text[];
  -- 0042
  st jsonb;
  staged_mode boolean;
  tcols text;
  ncols text;
  readers_at timestamptz;
BEGIN
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  ids := ARRAY(SELECT DISTINCT i FROM unnest(ARRAY[t.id, s.id] || ARRAY(
                 SELECT ts.transform_id FROM "trellis".transform_sources ts WHERE ts.source_oid = t.target_oid)) i
               ORDER BY i);
  PERFORM 1 FROM "trellis".page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM "trellis".pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    -- Dropped, or replaced by another ALTER TRANSFORM … AS, while this waited.
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO p FROM "trellis".pipeline px WHERE px.transform_id = s.id;
  IF p.phase <> 'live' OR p.follow_pending OR s.paused_at IS NOT NULL THEN
    RETURN jsonb_build_object('switched', false, 'why', 'the new definition is not live yet');
  END IF;

  plan := "trellis"._redefine_plan(t, s.spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    PERFORM "trellis"._fail('TRC01', format('transform %I cannot be switched to its new definition: %s', t.target_name,
      (SELECT string_agg(v, '; ') FROM jsonb_array_elements_text(plan->'refused') v)));
  END IF;
  key_changed := (plan->>'key_changed')::boolean;
  new_key := ARRAY(SELECT jsonb_array_elements_text(s.spec->'key'));
  -- The engine's indexes on joined tables' keys the new definition needs.
  wanted := ARRAY(SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                    FROM jsonb_array_elements(s.spec->'sources') src
                   WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');
  ddl := key_changed OR jsonb_array_length(plan->'columns') > 0
    OR wanted IS DISTINCT FROM ARRAY(
         SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
           FROM jsonb_array_elements(t.spec->'sources') src
          WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');

  rel := t.target_oid::regclass::text;
  shadow_rel := s.target_oid::regclass::text;
  -- 0042: staged when _redefine_prepare added every column to stage (the fill wrote them).
  st := "trellis"._redefine_staging(t, s, plan);
  staged_mode := (st->>'staged')::boolean AND NOT EXISTS (
    SELECT 1 FROM jsonb_array_elements(st->'columns') sc
     WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid
                          AND a.attname = sc->>'staged' AND NOT a.attisdropped));
  IF staged_mode THEN
    -- EXCLUSIVE: the drains' writes wait, readers go on reading the old rows.
    EXECUTE 'LOCK TABLE ' || rel || ' IN EXCLUSIVE MODE';
    locked_at := clock_timestamp();
    EXECUTE 'LOCK TABLE ' || shadow_rel || ' IN ACCESS EXCLUSIVE MODE';
    PERFORM set_config('trellis.maintaining', 'trellis', true);
    cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
               FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
    ncols := (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
    -- The target's column for each of the new definition's: its staged one where staged.
    tcols := (SELECT string_agg(quote_ident(coalesce(sc->>'staged', cc.name)), ', ' ORDER BY cc.ordinal)
                FROM "trellis".transform_columns cc
                LEFT JOIN jsonb_array_elements(st->'columns') sc ON sc->>'name' = cc.name
               WHERE cc.transform_id = s.id);
    key_match := (SELECT string_agg(format('n.%I = t.%I', k, k), ' AND ') FROM unnest(new_key) k);
    EXECUTE 'DELETE FROM ' || rel || ' t WHERE NOT EXISTS (SELECT 1 FROM ' || shadow_rel || ' n WHERE ' || key_match || ')';
    GET DIAGNOSTICS deleted = ROW_COUNT;
    -- Rows the drains changed since the fill (and the kept columns that differ): written.
    EXECUTE 'UPDATE ' || rel || ' t SET (' || tcols || ') = ROW(' || ncols || ') FROM ' || shadow_rel || ' n WHERE '
      || key_match || ' AND record_image_ne(ROW(' || (
           SELECT string_agg('t.' || quote_ident(coalesce(sc->>'staged', cc.name)), ', ' ORDER BY cc.ordinal)
             FROM "trellis".transform_columns cc
             LEFT JOIN jsonb_array_elements(st->'columns') sc ON sc->>'name' = cc.name
            WHERE cc.transform_id = s.id)
      || '), ROW(' || ncols || '))';
    GET DIAGNOSTICS written = ROW_COUNT;
    ddl := jsonb_array_length(plan->'columns') > 0 OR EXISTS (
      SELECT 1 FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
       WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
         AND NOT a.attisdropped AND NOT n.attisdropped AND a.attnotnull <> n.attnotnull);
    IF NOT ddl THEN
      EXECUTE 'INSERT INTO ' || rel || ' (' || cols || ') SELECT ' || ncols || ' FROM ' || shadow_rel || ' n'
        || ' WHERE NOT EXISTS (SELECT 1 FROM ' || rel || ' t WHERE ' || key_match || ')';
      GET DIAGNOSTICS gone = ROW_COUNT;
      written := written + gone;
    ELSE
      -- The keys to insert, listed before the lock readers wait for.
      EXECUTE format('CREATE TEMP TABLE %I ON COMMIT DROP AS SELECT %s FROM %s n WHERE NOT EXISTS (SELECT 1 FROM %s t WHERE %s)',
                     'trellis#new#' || s.id, (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(new_key) k),
                     shadow_rel, rel, key_match);
      -- ACCESS EXCLUSIVE, for metadata and the rows the new definition adds only.
      EXECUTE 'LOCK TABLE ' || rel || ' IN ACCESS EXCLUSIVE MODE';
      readers_at := clock_timestamp();
      BEGIN
        FOR c IN SELECT value FROM jsonb_array_elements(plan->'columns') LOOP
          IF c->>'action' IN ('drop', 'retype', 'replace') THEN
            EXECUTE format('ALTER TABLE %s DROP COLUMN %I', rel, c->>'name');
          END IF;
          IF c->>'action' IN ('add', 'retype', 'replace') THEN
            EXECUTE format('ALTER TABLE %s RENAME COLUMN %I TO %I', rel,
              (SELECT sc->>'staged' FROM jsonb_array_elements(st->'columns') sc WHERE sc->>'name' = c->>'name'), c->>'name');
            EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT', rel, c->>'name');
          END IF;
        END LOOP;
      EXCEPTION
        WHEN dependent_objects_still_exist OR feature_not_supported THEN
          GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
          PERFORM "trellis"._fail('TRC01', format('transform %I cannot be switched to its new definition: %s%s',
            t.target_name, SQLERRM, coalesce(' (' || replace(nullif(detail, ''), E'\n', '; ') || ')', '')));
      END;
      FOR r IN SELECT a.attname FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
                WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
                  AND NOT a.attisdropped AND NOT n.attisdropped AND a.attnotnull AND NOT n.attnotnull LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP NOT NULL', rel, r.attname);
      END LOOP;
      EXECUTE 'INSERT INTO ' || rel || ' (' || cols || ') SELECT ' || ncols || ' FROM ' || shadow_rel || ' n JOIN pg_temp.'
        || quote_ident('trellis#new#' || s.id) || ' k ON '
        || (SELECT string_agg(format('n.%I = k.%I', k, k), ' AND ') FROM unnest(new_key) k);
      GET DIAGNOSTICS gone = ROW_COUNT;
      written := written + gone;
      EXECUTE 'DROP TABLE pg_temp.' || quote_ident('trellis#new#' || s.id);
    END IF;
    -- NOT NULL where the new definition's columns are (a scan, where a staged column could
    -- not be added NOT NULL: the shadow had no row then).
    FOR r IN SELECT a.attname FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
              WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
                AND NOT a.attisdropped AND NOT n.attisdropped AND NOT a.attnotnull AND n.attnotnull LOOP
      EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET NOT NULL', rel, r.attname);
    END LOOP;
  ELSE
  EXECUTE 'LOCK TABLE ' || rel || CASE WHEN ddl THEN ' IN ACCESS EXCLUSIVE MODE' ELSE ' IN EXCLUSIVE MODE' END;
  locked_at := clock_timestamp();
  EXECUTE 'LOCK TABLE ' || shadow_rel || ' IN ACCESS EXCLUSIVE MODE';
  PERFORM set_config('trellis.maintaining', 'trellis', true);

  BEGIN
    -- The engine's own objects the new definition does not keep: its key constraint (or a
    -- grand total's index) when the key changes, the indexes on keys no longer joined.
    FOR r IN
      SELECT i.indexrelid::regclass::text AS idx, con.conname,
             array_to_string(ARRAY(SELECT quote_ident(a.attname) FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
                                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o), ', ') AS cols,
             i.indisunique, i.indexprs IS NOT NULL AS on_expression
        FROM pg_index i LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
       WHERE i.indrelid = t.target_oid
    LOOP
      IF key_changed AND r.conname IS NOT NULL AND r.cols = coalesce((
           SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k), '') THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', rel, r.conname);
      ELSIF key_changed AND r.indisunique AND r.on_expression AND jsonb_array_length(t.spec->'key') = 0
            AND r.conname IS NULL THEN
        EXECUTE 'DROP INDEX ' || r.idx;
      ELSIF NOT r.indisunique AND NOT r.on_expression AND r.cols IN (
              SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                FROM jsonb_array_elements(t.spec->'sources') src
               WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array')
            AND r.cols <> ALL (wanted) THEN
        EXECUTE 'DROP INDEX ' || r.idx;
      END IF;
    END LOOP;
    IF key_changed THEN
      -- Rows keyed another way: every row is written again.
      EXECUTE 'DELETE FROM ' || rel;
      GET DIAGNOSTICS deleted = ROW_COUNT;
    END IF;
    FOR c IN SELECT value FROM jsonb_array_elements(plan->'columns') LOOP
      IF c->>'action' IN ('drop', 'replace') THEN
        EXECUTE format('ALTER TABLE %s DROP COLUMN %I', rel, c->>'name');
      END IF;
      IF c->>'action' IN ('add', 'replace') THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s%s', rel, c->>'name', c->>'type',
                       coalesce(' COLLATE ' || (c->>'collation'), ''));
      ELSIF c->>'action' = 'retype' THEN
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s%s USING %I::%s', rel, c->>'name', c->>'type',
                       coalesce(' COLLATE ' || (c->>'collation'), ''), c->>'name', c->>'type');
      END IF;
    END LOOP;
    -- NULLs the new definition allows where the old did not (before the rows come).
    FOR r IN SELECT a.attname FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
              WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
                AND NOT a.attisdropped AND NOT n.attisdropped AND a.attnotnull AND NOT n.attnotnull LOOP
      EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP NOT NULL', rel, r.attname);
    END LOOP;
    IF key_changed THEN
      keys := (SELECT string_agg(quote_ident(k), ', ') FROM unnest(new_key) k);
      IF keys IS NULL THEN
        EXECUTE 'CREATE UNIQUE INDEX ON ' || rel || ' ((true))';
      ELSIF coalesce((s.spec->>'key_nullable')::boolean, false) THEN
        EXECUTE 'ALTER TABLE ' || rel || ' ADD UNIQUE NULLS NOT DISTINCT (' || keys || ')';
      ELSE
        EXECUTE 'ALTER TABLE ' || rel || ' ADD PRIMARY KEY (' || keys || ')';
      END IF;
    END IF;
    FOR r IN SELECT w FROM unnest(wanted) w WHERE w NOT IN (
               SELECT array_to_string(ARRAY(SELECT quote_ident(a.attname) FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
                                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o), ', ')
                 FROM pg_index i WHERE i.indrelid = t.target_oid AND NOT i.indisunique AND i.indexprs IS NULL) LOOP
      EXECUTE 'CREATE INDEX ON ' || rel || ' (' || r.w || ')';
    END LOOP;
  EXCEPTION
    WHEN dependent_objects_still_exist OR feature_not_supported THEN
      GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
      PERFORM "trellis"._fail('TRC01', format('transform %I cannot be switched to its new definition: %s%s',
        t.target_name, SQLERRM, coalesce(' (' || replace(nullif(detail, ''), E'\n', '; ') || ')', '')));
  END;

  -- The rows: the shadow's, by a diff (rows gone deleted, rows new or changed written, as
  -- the drain writes them: value images, so 1.0 becomes 1.00), so a chain reading the target
  -- sees keyed changes.
  cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
             FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
  IF NOT key_changed THEN
    -- `=` where the key column cannot be NULL (a hash anti-join); IS NOT DISTINCT FROM,
    -- which Postgres can only join by nested loop, only where it can (a nullable key).
    key_match := (SELECT string_agg(format(CASE WHEN a.attnotnull THEN 'n.%I = t.%I' ELSE 'n.%I IS NOT DISTINCT FROM t.%I' END,
                                           k, k), ' AND ')
                    FROM unnest(new_key) k
                    LEFT JOIN pg_attribute a ON a.attrelid = s.target_oid AND a.attname = k);
    EXECUTE 'DELETE FROM ' || rel || ' t WHERE NOT EXISTS (SELECT 1 FROM ' || shadow_rel || ' n'
      || coalesce(' WHERE ' || key_match, '') || ')';
    GET DIAGNOSTICS gone = ROW_COUNT;
    deleted := deleted + gone;
  END IF;
  -- Rows the target holds otherwise, updated, and rows it lacks, inserted, each by one join
  -- (a hash join where the key cannot be NULL): an unchanged row is not touched. No writer
  -- but this one can reach the target meanwhile (the drain's locks are held).
  IF NOT key_changed THEN
    EXECUTE 'UPDATE ' || rel || ' t SET (' || cols || ') = ROW(' || (
        SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
          FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id) || ')'
      || ' FROM ' || shadow_rel || ' n WHERE ' || coalesce(key_match || ' AND ', '')
      || 'record_image_ne(ROW(' || (SELECT string_agg('t.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                                      FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id)
      || '), ROW(' || (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                        FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id) || '))';
    GET DIAGNOSTICS written = ROW_COUNT;
  END IF;
  EXECUTE 'INSERT INTO ' || rel || ' (' || cols || ') SELECT ' || cols || ' FROM ' || shadow_rel || ' n'
    || CASE WHEN key_changed THEN '' ELSE
         ' WHERE NOT EXISTS (SELECT 1 FROM ' || rel || ' t' || coalesce(' WHERE ' || key_match, '') || ')' END;
  GET DIAGNOSTICS gone = ROW_COUNT;
  written := written + gone;
  -- NOT NULL where the new definition's columns are (the rows are in now).
  FOR r IN SELECT a.attname FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
            WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
              AND NOT a.attisdropped AND NOT n.attisdropped AND NOT a.attnotnull AND n.attnotnull LOOP
    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET NOT NULL', rel, r.attname);
  END LOOP;

  IF ddl THEN
    readers_at := locked_at;
  END IF;
  END IF;

  -- Transforms reading the target follow a column's new type (ADR 0047: their definition
  -- rebound and analysed again, their target altered, re-derived by the staging worker),
  -- or the switch is refused naming them.
  FOR x IN
    SELECT y.* FROM "trellis".transforms y
     WHERE y.id <> t.id AND y.id <> s.id AND y.capture_failure IS NULL AND y.paused_at IS NULL
       AND EXISTS (SELECT 1 FROM "trellis".transform_sources ts
                     CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) ra
                     JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attname = ra->>'name'
                    WHERE ts.transform_id = y.id AND ts.source_oid = t.target_oid AND NOT a.attisdropped
                      AND (format_type(a.atttypid, a.atttypmod) <> ra->>'type' OR a.attnum <> (ra->>'attnum')::int))
     ORDER BY y.id
  LOOP
    -- read_attrs by name: a column dropped and added again moved to another attnum.
    UPDATE "trellis".transform_sources ts
       SET read_attrs = (SELECT jsonb_agg(CASE WHEN a.attnum IS NULL THEN ra
                                               ELSE jsonb_set(ra, '{attnum}', to_jsonb(a.attnum::int)) END)
                           FROM jsonb_array_elements(ts.read_attrs) ra
                           LEFT JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attname = ra->>'name'
                                                   AND NOT a.attisdropped)
     WHERE ts.transform_id = x.id AND ts.source_oid = t.target_oid;
    BEGIN
      EXECUTE 'LOCK TABLE ' || x.target_oid::regclass::text || ' IN ACCESS EXCLUSIVE MODE';
      PERFORM "trellis"._follow_transform(x);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS detail = MESSAGE_TEXT;
      PERFORM "trellis"._fail('TRC01', format('transform %I cannot be switched to its new definition: transform %I reads it and %s',
        t.target_name, x.target_name, detail));
    END;
  END LOOP;

  -- The catalog: the shadow's rows become the transform's (definition, plan, cursor, key
  -- map, group states, held keys), on the target; the old transform's go.
  UPDATE "trellis".transforms y SET redefines = NULL WHERE y.id = s.id;
  DELETE FROM "trellis".transforms y WHERE y.id = t.id;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id);
  UPDATE "trellis".transforms y
     SET target_schema = t.target_schema, target_name = t.target_name, target_oid = t.target_oid,
         created_at = t.created_at, updated_at = now(),
         redefinition = jsonb_build_object('state', 'switched', 'statement', s.statement,
                                           'previous', t.statement, 'since', t.redefinition->'since',
                                           'at', now(), 'changes', plan->'changes',
                                           'deleted', deleted, 'written', written,
                                           'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2),
                                           'readersBlockedMs', coalesce(round((extract(epoch FROM clock_timestamp() - readers_at) * 1000)::numeric, 2), 0),
                                           'staged', staged_mode)
   WHERE y.id = s.id;
  EXECUTE 'DROP TABLE ' || shadow_rel;
  RETURN jsonb_build_object('switched', true, 'target', t.target_name, 'changes', plan->'changes',
                            'deleted', deleted, 'written', written,
                            'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2),
                            'readersBlockedMs', coalesce(round((extract(epoch FROM clock_timestamp() - readers_at) * 1000)::numeric, 2), 0),
                            'staged', staged_mode);
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m42$;
  END IF;
  -- Postgres lets PUBLIC execute a new function: none of Trellis's is (ADR 0034), whichever
  -- migration made it. Only the owner calls them.
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
  INSERT INTO "trellis".config (target_schema) VALUES ('public')
    ON CONFLICT DO NOTHING;

  -- Background jobs (self-checks) run on pg-boss, in the schema trellis_jobs at pg-boss's
  -- schema version 24 (ADR 0014).
  IF to_regclass('trellis_jobs.migrations') IS NOT NULL THEN
    RAISE EXCEPTION 'schema trellis_jobs, where Trellis instance trellis keeps its jobs, holds another Trellis instance''s catalog: choose another catalog schema'
      USING ERRCODE = 'TRC01';
  END IF;
  IF to_regclass('trellis_jobs.version') IS NULL THEN
    EXECUTE $trellis_boss$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    
    CREATE SCHEMA IF NOT EXISTS trellis_jobs
  ;

    CREATE TYPE trellis_jobs.job_state AS ENUM (
      'created',
      'retry',
      'active',
      'completed',
      'cancelled',
      'failed'
    )
  ;

    CREATE TABLE trellis_jobs.version (
      version int primary key,
      maintained_on timestamp with time zone,
      cron_on timestamp with time zone,
      monitored_on timestamp with time zone
    )
  ;

    CREATE TABLE trellis_jobs.queue (
      name text,
      policy text,
      retry_limit int,
      retry_delay int,
      retry_backoff bool,
      expire_seconds int,
      retention_minutes int,
      dead_letter text REFERENCES trellis_jobs.queue (name),
      partition_name text,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.schedule (
      name text REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      cron text not null,
      timezone text,
      data jsonb,
      options jsonb,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.subscription (
      event text not null,
      name text not null REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY(event, name)
    )
  ;

    CREATE TABLE trellis_jobs.job (
      id uuid not null default gen_random_uuid(),
      name text not null,
      priority integer not null default(0),
      data jsonb,
      state trellis_jobs.job_state not null default('created'),
      retry_limit integer not null default(2),
      retry_count integer not null default(0),
      retry_delay integer not null default(0),
      retry_backoff boolean not null default false,
      start_after timestamp with time zone not null default now(),
      started_on timestamp with time zone,
      singleton_key text,
      singleton_on timestamp without time zone,
      expire_in interval not null default interval '15 minutes',
      created_on timestamp with time zone not null default now(),
      completed_on timestamp with time zone,
      keep_until timestamp with time zone NOT NULL default now() + interval '14 days',
      output jsonb,
      dead_letter text,
      policy text
    ) PARTITION BY LIST (name)
  ;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);
CREATE TABLE trellis_jobs.archive (LIKE trellis_jobs.job);
ALTER TABLE trellis_jobs.archive ADD PRIMARY KEY (name, id);
ALTER TABLE trellis_jobs.archive ADD archived_on timestamptz NOT NULL DEFAULT now();
CREATE INDEX archive_i1 ON trellis_jobs.archive(archived_on);

    CREATE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
      queue_created_on timestamptz;
    BEGIN

      WITH q as (
      INSERT INTO trellis_jobs.queue (
        name,
        policy,
        retry_limit,
        retry_delay,
        retry_backoff,
        expire_seconds,
        retention_minutes,
        dead_letter,
        partition_name
      )
      VALUES (
        queue_name,
        options->>'policy',
        (options->>'retryLimit')::int,
        (options->>'retryDelay')::int,
        (options->>'retryBackoff')::bool,
        (options->>'expireInSeconds')::int,
        (options->>'retentionMinutes')::int,
        options->>'deadLetter',
        table_name
      )
      ON CONFLICT DO NOTHING
      RETURNING created_on
      )
      SELECT created_on into queue_created_on from q;

      IF queue_created_on IS NULL THEN
        RETURN;
      END IF;

      EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
      EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
      EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;

    CREATE FUNCTION trellis_jobs.delete_queue(queue_name text)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar;
    BEGIN
      WITH deleted as (
        DELETE FROM trellis_jobs.queue
        WHERE name = queue_name
        RETURNING partition_name
      )
      SELECT partition_name from deleted INTO table_name;

      EXECUTE format('DROP TABLE IF EXISTS trellis_jobs.%I', table_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;
INSERT INTO trellis_jobs.version(version) VALUES ('24');
    $trellis_boss$;
  ELSE
    SELECT version INTO boss_version FROM trellis_jobs.version;
    IF boss_version >= 24 THEN
      NULL; -- up to date, or installed by a newer trellis-pg
  ELSIF boss_version = 23 THEN
    EXECUTE $trellis_boss_23$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_23$;
  ELSIF boss_version = 22 THEN
    EXECUTE $trellis_boss_22$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_22$;
  ELSIF boss_version = 21 THEN
    EXECUTE $trellis_boss_21$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ALTER COLUMN retry_limit SET DEFAULT 2;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_21$;
    ELSE
      RAISE EXCEPTION 'the jobs schema trellis_jobs is at pg-boss schema version %, which this trellis-pg cannot upgrade to 24', boss_version
        USING ERRCODE = 'TRI01';
    END IF;
  END IF;
  PERFORM trellis_jobs.create_queue('self_check', '{"policy": "standard"}'::json);

  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis_jobs" FROM PUBLIC;
END
$trellis_upgrade$;
