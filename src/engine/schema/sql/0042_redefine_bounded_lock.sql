-- A redefinition's switch holds the target's ACCESS EXCLUSIVE lock for metadata only
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
CREATE FUNCTION @schema@._redefine_staging(t @schema@.transforms, s @schema@.transforms, plan jsonb)
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
         OR cardinality(@schema@._column_dependants(t, att.attnum)) > 0
         OR EXISTS (SELECT 1 FROM @schema@.transform_sources ts JOIN @schema@.transforms x ON x.id = ts.transform_id
                     WHERE ts.source_oid = t.target_oid AND x.id <> t.id AND x.id <> s.id
                       AND c->>'name' = ANY (ts.read_columns::text[])) THEN
        RETURN jsonb_build_object('staged', false);
      END IF;
    END IF;
    columns := columns || jsonb_build_object(
      'name', c->>'name', 'type', c->>'type', 'collation', c->'collation',
      'staged', 'trellis#' || s.id || '#' || (SELECT cc.ordinal FROM @schema@.transform_columns cc
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
CREATE FUNCTION @schema@._redefine_prepare(shadow_id int)
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  s @schema@.transforms;
  t @schema@.transforms;
  plan jsonb;
  st jsonb;
  c jsonb;
  lit text;
  added int := 0;
BEGIN
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  plan := @schema@._redefine_plan(t, s.spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    RETURN 0;
  END IF;
  st := @schema@._redefine_staging(t, s, plan);
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
CREATE FUNCTION @schema@._redefine_fill(shadow_id int, after text[], batch int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  s @schema@.transforms;
  t @schema@.transforms;
  plan jsonb;
  st jsonb;
  staged jsonb;
  ids int[];
  keys text[];
  key_list text;
  cond text := 'true';
  result jsonb;
BEGIN
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  ids := ARRAY(SELECT i FROM unnest(ARRAY[s.id, s.redefines]) i ORDER BY i);
  PERFORM 1 FROM @schema@.page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM @schema@.pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  plan := @schema@._redefine_plan(t, s.spec);
  st := @schema@._redefine_staging(t, s, plan);
  IF NOT (st->>'staged')::boolean THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  staged := (SELECT coalesce(jsonb_agg(c), '[]') FROM jsonb_array_elements(st->'columns') c
              WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid
                               AND a.attname = c->>'staged' AND NOT a.attisdropped));
  IF jsonb_array_length(staged) = 0 THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  PERFORM set_config('trellis.maintaining', @schema_literal@, true);
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
CREATE OR REPLACE FUNCTION @schema@._drop_redefinition()
RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  IF OLD.redefines IS NULL THEN
    DELETE FROM @schema@.transforms s WHERE s.redefines = OLD.id;
  ELSE
    -- 0042
    FOR r IN SELECT a.attrelid, a.attname FROM @schema@.transforms x
               JOIN pg_attribute a ON a.attrelid = x.target_oid
              WHERE x.id = OLD.redefines AND NOT a.attisdropped
                AND starts_with(a.attname, 'trellis#' || OLD.id || '#') LOOP
      EXECUTE format('ALTER TABLE %s DROP COLUMN %I', r.attrelid::regclass::text, r.attname);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = OLD.target_oid) THEN
      EXECUTE 'DROP TABLE ' || OLD.target_oid::regclass::text;
    END IF;
    EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || OLD.id);
  END IF;
  RETURN OLD;
END
$fn$;

-- Step 3: 0035's _redefine_switch, with the staged path (see the top of this file): when
-- _redefine_prepare added every column to stage, the rows are written under EXCLUSIVE and
-- ACCESS EXCLUSIVE covers the metadata and the rows the new definition adds; otherwise as
-- before. Reports also readersBlockedMs (how long ACCESS EXCLUSIVE was held: 0 when the
-- switch took none) and staged.
CREATE OR REPLACE FUNCTION @schema@._redefine_switch(shadow_id int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  s @schema@.transforms;
  t @schema@.transforms;
  x @schema@.transforms;
  p @schema@.pipeline;
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
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  ids := ARRAY(SELECT DISTINCT i FROM unnest(ARRAY[t.id, s.id] || ARRAY(
                 SELECT ts.transform_id FROM @schema@.transform_sources ts WHERE ts.source_oid = t.target_oid)) i
               ORDER BY i);
  PERFORM 1 FROM @schema@.page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM @schema@.pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    -- Dropped, or replaced by another ALTER TRANSFORM … AS, while this waited.
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO p FROM @schema@.pipeline px WHERE px.transform_id = s.id;
  IF p.phase <> 'live' OR p.follow_pending OR s.paused_at IS NOT NULL THEN
    RETURN jsonb_build_object('switched', false, 'why', 'the new definition is not live yet');
  END IF;

  plan := @schema@._redefine_plan(t, s.spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    PERFORM @schema@._fail('TRC01', format('transform %I cannot be switched to its new definition: %s', t.target_name,
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
  st := @schema@._redefine_staging(t, s, plan);
  staged_mode := (st->>'staged')::boolean AND NOT EXISTS (
    SELECT 1 FROM jsonb_array_elements(st->'columns') sc
     WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid
                          AND a.attname = sc->>'staged' AND NOT a.attisdropped));
  IF staged_mode THEN
    -- EXCLUSIVE: the drains' writes wait, readers go on reading the old rows.
    EXECUTE 'LOCK TABLE ' || rel || ' IN EXCLUSIVE MODE';
    locked_at := clock_timestamp();
    EXECUTE 'LOCK TABLE ' || shadow_rel || ' IN ACCESS EXCLUSIVE MODE';
    PERFORM set_config('trellis.maintaining', @schema_literal@, true);
    cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
               FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
    ncols := (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
    -- The target's column for each of the new definition's: its staged one where staged.
    tcols := (SELECT string_agg(quote_ident(coalesce(sc->>'staged', cc.name)), ', ' ORDER BY cc.ordinal)
                FROM @schema@.transform_columns cc
                LEFT JOIN jsonb_array_elements(st->'columns') sc ON sc->>'name' = cc.name
               WHERE cc.transform_id = s.id);
    key_match := (SELECT string_agg(format('n.%I = t.%I', k, k), ' AND ') FROM unnest(new_key) k);
    EXECUTE 'DELETE FROM ' || rel || ' t WHERE NOT EXISTS (SELECT 1 FROM ' || shadow_rel || ' n WHERE ' || key_match || ')';
    GET DIAGNOSTICS deleted = ROW_COUNT;
    -- Rows the drains changed since the fill (and the kept columns that differ): written.
    EXECUTE 'UPDATE ' || rel || ' t SET (' || tcols || ') = ROW(' || ncols || ') FROM ' || shadow_rel || ' n WHERE '
      || key_match || ' AND record_image_ne(ROW(' || (
           SELECT string_agg('t.' || quote_ident(coalesce(sc->>'staged', cc.name)), ', ' ORDER BY cc.ordinal)
             FROM @schema@.transform_columns cc
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
          PERFORM @schema@._fail('TRC01', format('transform %I cannot be switched to its new definition: %s%s',
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
  PERFORM set_config('trellis.maintaining', @schema_literal@, true);

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
      PERFORM @schema@._fail('TRC01', format('transform %I cannot be switched to its new definition: %s%s',
        t.target_name, SQLERRM, coalesce(' (' || replace(nullif(detail, ''), E'\n', '; ') || ')', '')));
  END;

  -- The rows: the shadow's, by a diff (rows gone deleted, rows new or changed written, as
  -- the drain writes them: value images, so 1.0 becomes 1.00), so a chain reading the target
  -- sees keyed changes.
  cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
             FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
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
          FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id) || ')'
      || ' FROM ' || shadow_rel || ' n WHERE ' || coalesce(key_match || ' AND ', '')
      || 'record_image_ne(ROW(' || (SELECT string_agg('t.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                                      FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id)
      || '), ROW(' || (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                        FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id) || '))';
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
  -- Columns staged for a switch that could not be staged after all (the app indexed a
  -- retyped column since, say): not the target's.
  FOR r IN SELECT a.attname FROM pg_attribute a
            WHERE a.attrelid = t.target_oid AND NOT a.attisdropped
              AND starts_with(a.attname, 'trellis#' || s.id || '#') LOOP
    EXECUTE format('ALTER TABLE %s DROP COLUMN %I', rel, r.attname);
    readers_at := coalesce(readers_at, clock_timestamp());
  END LOOP;
  END IF;

  -- Transforms reading the target follow a column's new type (ADR 0047: their definition
  -- rebound and analysed again, their target altered, re-derived by the staging worker),
  -- or the switch is refused naming them.
  FOR x IN
    SELECT y.* FROM @schema@.transforms y
     WHERE y.id <> t.id AND y.id <> s.id AND y.capture_failure IS NULL AND y.paused_at IS NULL
       AND EXISTS (SELECT 1 FROM @schema@.transform_sources ts
                     CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) ra
                     JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attname = ra->>'name'
                    WHERE ts.transform_id = y.id AND ts.source_oid = t.target_oid AND NOT a.attisdropped
                      AND (format_type(a.atttypid, a.atttypmod) <> ra->>'type' OR a.attnum <> (ra->>'attnum')::int))
     ORDER BY y.id
  LOOP
    -- read_attrs by name: a column dropped and added again moved to another attnum.
    UPDATE @schema@.transform_sources ts
       SET read_attrs = (SELECT jsonb_agg(CASE WHEN a.attnum IS NULL THEN ra
                                               ELSE jsonb_set(ra, '{attnum}', to_jsonb(a.attnum::int)) END)
                           FROM jsonb_array_elements(ts.read_attrs) ra
                           LEFT JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attname = ra->>'name'
                                                   AND NOT a.attisdropped)
     WHERE ts.transform_id = x.id AND ts.source_oid = t.target_oid;
    BEGIN
      EXECUTE 'LOCK TABLE ' || x.target_oid::regclass::text || ' IN ACCESS EXCLUSIVE MODE';
      PERFORM @schema@._follow_transform(x);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS detail = MESSAGE_TEXT;
      PERFORM @schema@._fail('TRC01', format('transform %I cannot be switched to its new definition: transform %I reads it and %s',
        t.target_name, x.target_name, detail));
    END;
  END LOOP;

  -- The catalog: the shadow's rows become the transform's (definition, plan, cursor, key
  -- map, group states, held keys), on the target; the old transform's go.
  UPDATE @schema@.transforms y SET redefines = NULL WHERE y.id = s.id;
  DELETE FROM @schema@.transforms y WHERE y.id = t.id;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id);
  UPDATE @schema@.transforms y
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

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
