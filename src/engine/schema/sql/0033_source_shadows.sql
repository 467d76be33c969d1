-- Key maps that stay proportional to the sources (issue #22 item 4, ADR 0051).
--
-- A GROUP BY over a join kept one key-map row per join row that passes WHERE: a join that
-- fans out (a table joined to itself on a low-cardinality column, TPC-H Q11 as a six-way
-- self-join) made the map grow with the join's row combinations, not with its sources.
-- Such a transform now keeps, in its key map, a copy of the columns it reads of each
-- source occurrence (a _shadow_: one row per source row and occurrence, `o` saying which):
-- the sources as the target was last computed from them. A change re-derives the groups
-- the changed rows' join rows fall in, in the shadow (before) and in the shadow with the
-- changed rows replaced by their current state (after), recomputing each from the latter,
-- and replaces the changed rows in the shadow: the target is always the definition over
-- the shadow. Every aggregate works; a delta (ADR 0044) would need each join row's old
-- contribution, so a transform whose join fans out is kept by group recompute.
--
-- A join fans out unless each joined source is joined on its whole key by equalities
-- (then each row of the FROM table joins at most one row of each: the join-row map is no
-- bigger than the FROM table, and kept as before), or all but one are and that one is
-- joined on the FROM table's whole key (one join row per row of it).

-- Whether the join condition of source `s` (an entry of spec.sources) equates every key
-- column of source `keyed` with a column of another source (a bare `=`; one under an OR
-- counts too, which only keeps a bigger map than needed, never a wrong one).
CREATE FUNCTION @schema@._joined_on_key(spec jsonb, s jsonb, keyed jsonb)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT NOT EXISTS (
    SELECT 1 FROM jsonb_array_elements_text(keyed->'key_columns') k
     WHERE NOT EXISTS (
       SELECT 1 FROM jsonb_array_elements(coalesce(spec->'joins', '[]')) e
         JOIN pg_attribute a ON a.attrelid = (keyed->>'oid')::oid AND a.attname = k
        WHERE (e->>'join')::int = (s->>'ordinal')::int
          AND (((e->>'left')::int = (keyed->>'ordinal')::int AND (e->>'left_attnum')::int = a.attnum
                AND (e->>'right')::int <> (keyed->>'ordinal')::int)
            OR ((e->>'right')::int = (keyed->>'ordinal')::int AND (e->>'right_attnum')::int = a.attnum
                AND (e->>'left')::int <> (keyed->>'ordinal')::int))))
$fn$;

-- Whether the join of `spec` can have more rows than its largest source: unless every
-- joined source is joined on its whole key (each row before it meets at most one of its
-- rows), or all but one are and that one is joined on the whole key of the FROM table
-- (orders JOIN lineitem ON l_orderkey = o_orderkey: one join row per lineitem).
CREATE FUNCTION @schema@._join_fans_out(spec jsonb)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH unkeyed AS (
    SELECT s FROM jsonb_array_elements(spec->'sources') s
     WHERE (s->>'ordinal')::int > 0 AND NOT @schema@._joined_on_key(spec, s, s))
  SELECT (SELECT count(*) FROM unkeyed) > 1
      OR coalesce((SELECT bool_or(NOT @schema@._joined_on_key(spec, u.s, spec->'sources'->0))
                     FROM unkeyed u), false)
$fn$;

-- As in 0026, and a GROUP BY over a join that fans out keeps source shadows ('shadow'),
-- unless it reads a whole row (a row of a shadow is not of its table's type).
CREATE OR REPLACE FUNCTION @schema@._key_map_kind(spec jsonb)
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT CASE
    WHEN jsonb_array_length(coalesce(spec->'groups', '[]')) > 0
         AND jsonb_array_length(spec->'sources') > 1
         AND NOT coalesce((spec->>'whole_row')::boolean, false)
         AND @schema@._join_fans_out(spec)
      THEN 'shadow'
    WHEN jsonb_array_length(coalesce(spec->'groups', '[]')) > 0 THEN 'groups'
    WHEN jsonb_array_length(spec->'sources') > 1 AND spec->'ast'->>'where' IS NOT NULL
         AND EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s WHERE s->>'join_type' = 'left')
      THEN 'rows'
  END
$fn$;

-- The columns of a source shadow: for each source occurrence, every column the
-- definition reads of it and its key, in the table's order, as key-map columns
-- c<ordinal>_<attnum> of the column's type and collation. Null when a read column is gone.
CREATE FUNCTION @schema@._shadow_columns(spec jsonb)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH occ AS (
    SELECT (s->>'ordinal')::int AS o, s
      FROM jsonb_array_elements(spec->'sources') s),
  wanted AS (
    SELECT occ.o, occ.s, c.name
      FROM occ CROSS JOIN LATERAL (
        SELECT jsonb_array_elements_text(coalesce(occ.s->'read_columns', '[]'))
        UNION SELECT jsonb_array_elements_text(occ.s->'key_columns')) AS c(name)),
  cols AS (
    SELECT w.o, w.name, a.attnum,
           format_type(a.atttypid, a.atttypmod)
             || CASE WHEN a.attcollation <> 0 AND a.attcollation <> ty.typcollation
                     THEN ' COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname)
                     ELSE '' END AS type
      FROM wanted w
      LEFT JOIN pg_attribute a ON a.attrelid = (w.s->>'oid')::oid AND a.attname = w.name
                              AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_type ty ON ty.oid = a.atttypid
      LEFT JOIN pg_collation co ON co.oid = a.attcollation
      LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace)
  SELECT CASE WHEN EXISTS (SELECT 1 FROM cols WHERE attnum IS NULL) THEN NULL ELSE (
    SELECT jsonb_agg(jsonb_build_object(
             'ordinal', occ.o,
             'columns', (SELECT jsonb_agg(jsonb_build_object(
                                  'name', c.name, 'col', format('c%s_%s', c.o, c.attnum),
                                  'type', c.type, 'attnum', c.attnum) ORDER BY c.attnum)
                           FROM cols c WHERE c.o = occ.o))
           ORDER BY occ.o)
      FROM occ) END
$fn$;

-- As in 0026, and: a transform whose join fans out is kept by group recompute (its
-- classification says why), and its key map is its sources' shadow (see above): columns
-- `o` (the occurrence) and c<ordinal>_<attnum>, indexed per occurrence on its key, its
-- join columns and its GROUP BY columns. spec.shadow lists the columns.
CREATE OR REPLACE FUNCTION @schema@._make_key_map(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  map_sql text := quote_ident(@schema_literal@) || '.' || quote_ident('map_' || transform_id);
  state_sql text := quote_ident(@schema_literal@) || '.' || quote_ident('groups_' || transform_id);
  kind text;
  is_delta boolean;
  src jsonb;
  groups text;
  shadow jsonb;
  occ jsonb;
  idx text;
  fanned text;
BEGIN
  -- A whole-row read is recorded in the catalog's spec (the caller's may predate it).
  spec := spec || jsonb_build_object('whole_row',
    coalesce((spec->>'whole_row')::boolean, false)
    OR coalesce((SELECT (t.spec->>'whole_row')::boolean FROM @schema@.transforms t WHERE t.id = transform_id), false));
  kind := @schema@._key_map_kind(spec);
  IF kind = 'shadow' THEN
    shadow := @schema@._shadow_columns(spec);
    IF shadow IS NULL THEN
      kind := 'groups';
    END IF;
  END IF;
  classified := classified - 'remap';
  is_delta := classified->>'mode' = 'delta';
  IF is_delta AND jsonb_array_length(spec->'sources') > 1 AND @schema@._join_fans_out(spec) THEN
    SELECT quote_ident(s->>'alias') INTO fanned FROM jsonb_array_elements(spec->'sources') s
     WHERE (s->>'ordinal')::int > 0 AND NOT @schema@._joined_on_key(spec, s, s)
     ORDER BY (s->>'ordinal')::int DESC LIMIT 1;
    classified := classified || jsonb_build_object('mode', 'group', 'reason', format(
      'the join can multiply rows (%s is not joined on its whole key): a delta would need each join row''s inputs, so groups are recomputed from the sources',
      coalesce(fanned, 'a joined source')));
    is_delta := false;
  END IF;
  IF is_delta THEN
    kind := 'groups';
  END IF;
  UPDATE @schema@.transforms t
     SET delta = classified,
         spec = (t.spec - 'shadow') || jsonb_build_object('key_map', kind)
                || CASE WHEN kind = 'shadow' THEN jsonb_build_object('shadow', shadow) ELSE '{}' END
   WHERE t.id = transform_id;
  -- A group state table left by a transform of the same id in a dumped database.
  EXECUTE 'DROP TABLE IF EXISTS ' || state_sql;
  IF kind IS NULL THEN
    RETURN;
  END IF;
  IF kind = 'shadow' THEN
    EXECUTE 'CREATE TABLE ' || map_sql || ' (o smallint NOT NULL, ' || (
      SELECT string_agg(quote_ident(c->>'col') || ' ' || (c->>'type'), ', ' ORDER BY (x->>'ordinal')::int, (c->>'attnum')::int)
        FROM jsonb_array_elements(shadow) x, jsonb_array_elements(x->'columns') c) || ')';
    FOR occ IN SELECT value FROM jsonb_array_elements(shadow) LOOP
      src := spec->'sources'->((occ->>'ordinal')::int);
      FOR idx IN
        -- Its key; each column a join condition equates; each bare GROUP BY column.
        SELECT DISTINCT cols FROM (
          SELECT (SELECT string_agg(quote_ident(c->>'col'), ', ' ORDER BY k.o)
                    FROM jsonb_array_elements_text(src->'key_columns') WITH ORDINALITY AS k(name, o)
                    JOIN jsonb_array_elements(occ->'columns') c ON c->>'name' = k.name) AS cols
          UNION ALL
          SELECT quote_ident(format('c%s_%s', occ->>'ordinal', side.attnum))
            FROM jsonb_array_elements(coalesce(spec->'joins', '[]')) e
            CROSS JOIN LATERAL (VALUES ((e->>'left')::int, (e->>'left_attnum')::int),
                                       ((e->>'right')::int, (e->>'right_attnum')::int)) AS side(o, attnum)
           WHERE side.o = (occ->>'ordinal')::int
          UNION ALL
          SELECT quote_ident(format('c%s_%s', occ->>'ordinal', g->'plain'->>'attnum'))
            FROM jsonb_array_elements(coalesce(spec->'groups', '[]')) g
           WHERE jsonb_typeof(g->'plain') = 'object'
             AND (g->'plain'->>'source')::int = (occ->>'ordinal')::int) x
         WHERE cols IS NOT NULL
      LOOP
        EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || idx || ') WHERE o = ' || (occ->>'ordinal');
      END LOOP;
    END LOOP;
    RETURN;
  END IF;
  EXECUTE 'CREATE TABLE ' || map_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT (s->>'ordinal')::int AS o1, k.o AS o2,
             quote_ident(format('k%s_%s', s->>'ordinal', k.o)) || ' ' || k.t AS col
        FROM jsonb_array_elements(spec->'sources') s,
             jsonb_array_elements_text(s->'key_types') WITH ORDINALITY AS k(t, o)
      UNION ALL
      SELECT 1000000, g.o, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '')
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)
      UNION ALL
      SELECT 2000000, 0, 'passes boolean NOT NULL' WHERE kind = 'groups'
      UNION ALL
      SELECT 3000000, i.o, quote_ident(format('i%s', i.o)) || ' ' || (i.v->>'type')
                            || coalesce(' COLLATE ' || (i.v->>'collation'), '')
        FROM jsonb_array_elements(CASE WHEN is_delta THEN classified->'inputs' ELSE '[]' END)
             WITH ORDINALITY AS i(v, o)) c) || ')';
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') LOOP
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || (
      SELECT string_agg(quote_ident(format('k%s_%s', src->>'ordinal', k.o)), ', ' ORDER BY k.o)
        FROM jsonb_array_elements_text(src->'key_types') WITH ORDINALITY AS k(t, o)) || ')';
  END LOOP;
  IF NOT is_delta THEN
    RETURN;
  END IF;
  groups := (SELECT string_agg(quote_ident('g' || o), ', ' ORDER BY o)
               FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS x(g, o));
  -- A rescan reads a group's rows from the key map.
  IF groups IS NOT NULL AND EXISTS (
       SELECT 1 FROM jsonb_array_elements(classified->'aggs') a
        WHERE a->>'kind' IN ('min', 'max')
           OR (a->>'kind' IN ('sum_numeric', 'avg_numeric') AND a->>'scale' IS NULL)) THEN
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || groups || ')';
  END IF;
  EXECUTE 'CREATE TABLE ' || state_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT 0 AS o1, g.o AS o2, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '') AS col
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)
      UNION ALL
      SELECT 1, 0, 'n bigint NOT NULL'
      UNION ALL
      SELECT 2, a.o * 10 + p.o, quote_ident(format('a%s_%s', a.o, p.part)) || ' ' || p.type
        FROM jsonb_array_elements(classified->'aggs') WITH ORDINALITY AS a(v, o)
        CROSS JOIN LATERAL (
          SELECT * FROM (VALUES
            (1, 'c', 'bigint', true),
            (2, 's', CASE WHEN a.v->>'kind' = 'sum_int' THEN 'bigint' ELSE 'numeric' END,
                     a.v->>'kind' IN ('sum_int', 'sum_int8', 'avg_int', 'sum_numeric', 'avg_numeric')),
            (3, 'nan', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (4, 'pinf', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (5, 'ninf', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (6, 'ms', 'int', a.v->>'kind' IN ('sum_numeric', 'avg_numeric') AND a.v->>'scale' IS NULL),
            (7, 'msc', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric') AND a.v->>'scale' IS NULL),
            (8, 'm', (a.v->>'type') || coalesce(' COLLATE ' || (a.v->>'collation'), ''), a.v->>'kind' IN ('min', 'max')),
            (9, 'b', 'bigint', a.v->>'kind' IN ('bool_and', 'bool_or'))
          ) AS parts(o, part, type, used)
          WHERE used AND (a.v->>'kind' <> 'count' OR part = 'c')) p) c) || ')';
  EXECUTE 'CREATE UNIQUE INDEX ON ' || state_sql
    || coalesce(' (' || groups || ') NULLS NOT DISTINCT', ' ((true))');
END
$fn$;

-- As in 0026, and a transform waiting for its next build to get its key map remade
-- (`remap`, below) says so.
CREATE OR REPLACE FUNCTION @schema@._maintenance(aggregates boolean, delta jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE
    WHEN NOT aggregates THEN jsonb_build_object(
      'mode', 'rows', 'reason', 'each changed key''s target rows are re-derived', 'aggregates', '[]'::jsonb)
    WHEN delta IS NULL THEN jsonb_build_object(
      'mode', 'group', 'reason', 'each changed group is recomputed from its rows', 'aggregates', '[]'::jsonb)
    ELSE (
      WITH d AS (
        SELECT delta->>'mode' = 'delta' AND NOT coalesce((delta->>'pending')::boolean, false) AS kept)
      SELECT jsonb_build_object(
        'mode', CASE WHEN d.kept THEN 'delta' ELSE 'group' END,
        'reason', CASE WHEN coalesce((delta->>'remap')::boolean, false)
                       THEN 'groups are recomputed from their rows until the next build, which keeps the key map per source row (its join fans out; defined before trellis-pg did; requestBackfill() rebuilds it)'
                       WHEN coalesce((delta->>'pending')::boolean, false)
                       THEN (delta->>'reason') || ': kept by delta from its next build (defined before trellis-pg kept aggregates by delta; requestBackfill() rebuilds it)'
                       ELSE delta->>'reason' END,
        'aggregates', coalesce((
          SELECT jsonb_agg(jsonb_build_object(
                   'call', a->>'call',
                   'how', CASE WHEN NOT d.kept THEN 'recompute'
                               WHEN a->>'kind' IN ('min', 'max')
                                    OR (a->>'kind' IN ('sum_numeric', 'avg_numeric') AND a->>'scale' IS NULL)
                               THEN 'delta+rescan'
                               ELSE 'delta' END,
                   'why', coalesce(a->>'why', CASE WHEN NOT d.kept THEN
                     format('another part of the definition needs the group''s rows (%s)', delta->>'reason') END))
                 ORDER BY o)
            FROM jsonb_array_elements(delta->'aggs') WITH ORDINALITY AS x(a, o)), '[]'))
        FROM d)
  END
$fn$;

-- Transforms defined before this migration whose key map would now be a shadow (a GROUP
-- BY over a join that fans out), or that are kept by delta over such a join: their map
-- stays as it is, and groups are recomputed from their rows through it (the way it has
-- always supported), until their next build remakes it (_switch_to_delta, at the start
-- of a build, remakes the map of a transform whose classification is pending). Filling a
-- shadow here would be a rebuild's work inside this migration.
DO $migrate$
DECLARE
  t record;
BEGIN
  FOR t IN SELECT * FROM @schema@.transforms
            WHERE aggregates AND delta IS NOT NULL
              AND jsonb_array_length(spec->'sources') > 1
              AND NOT coalesce((spec->>'whole_row')::boolean, false)
              AND coalesce(spec->>'key_map', '') <> 'shadow'
  LOOP
    BEGIN
      IF @schema@._join_fans_out(t.spec)
         AND (jsonb_array_length(coalesce(t.spec->'groups', '[]')) > 0 OR t.delta->>'mode' = 'delta') THEN
        UPDATE @schema@.transforms
           SET delta = delta || '{"pending": true, "remap": true}'
         WHERE id = t.id;
      END IF;
    EXCEPTION WHEN OTHERS THEN
      -- A definition its sources no longer hold: it stays as it is (RESUME rebinds it).
      NULL;
    END;
  END LOOP;
END
$migrate$;
