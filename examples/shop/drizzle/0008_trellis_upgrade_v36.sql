-- Written by `trellis generate upgrade` (trellis-pg 0.2.0).
-- trellis-pg: upgrade the Trellis catalog schema "trellis" from version 31 to version 36.
-- Only the migrations after version 31, each version-guarded and locked: safe to run again,
-- and beside Trellis.migrate(). A database below version 31 is refused with what to run.
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
  IF installed < 31 THEN
    RAISE EXCEPTION 'the Trellis schema % is at version %, and this migration upgrades it from version 31 to 36', 'trellis', installed
      USING ERRCODE = 'TRI01',
            HINT = 'run the migrations that bring it to version 31 first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)';
  END IF;
  SELECT max(version) INTO newer FROM "trellis".migrations WHERE version > 36 AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (36): upgrade trellis-pg',
      'trellis', newer USING ERRCODE = 'TRI01';
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 32) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (32, 'no_change', false);
    EXECUTE $trellis_m32$-- Schema version 32 changes nothing: the number was set aside for a change of the build
-- (ADR 0050) that turned out to need no migration. Kept so versions stay contiguous.
SELECT 1;
$trellis_m32$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 33) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (33, 'source_shadows', false);
    EXECUTE $trellis_m33$-- Key maps that stay proportional to the sources (issue #22 item 4, ADR 0051).
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
CREATE FUNCTION "trellis"._joined_on_key(spec jsonb, s jsonb, keyed jsonb)
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
CREATE FUNCTION "trellis"._join_fans_out(spec jsonb)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH unkeyed AS (
    SELECT s FROM jsonb_array_elements(spec->'sources') s
     WHERE (s->>'ordinal')::int > 0 AND NOT "trellis"._joined_on_key(spec, s, s))
  SELECT (SELECT count(*) FROM unkeyed) > 1
      OR coalesce((SELECT bool_or(NOT "trellis"._joined_on_key(spec, u.s, spec->'sources'->0))
                     FROM unkeyed u), false)
$fn$;

-- As in 0026, and a GROUP BY over a join that fans out keeps source shadows ('shadow'),
-- unless it reads a whole row (a row of a shadow is not of its table's type).
CREATE OR REPLACE FUNCTION "trellis"._key_map_kind(spec jsonb)
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT CASE
    WHEN jsonb_array_length(coalesce(spec->'groups', '[]')) > 0
         AND jsonb_array_length(spec->'sources') > 1
         AND NOT coalesce((spec->>'whole_row')::boolean, false)
         AND "trellis"._join_fans_out(spec)
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
CREATE FUNCTION "trellis"._shadow_columns(spec jsonb)
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
CREATE OR REPLACE FUNCTION "trellis"._make_key_map(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  map_sql text := quote_ident('trellis') || '.' || quote_ident('map_' || transform_id);
  state_sql text := quote_ident('trellis') || '.' || quote_ident('groups_' || transform_id);
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
    OR coalesce((SELECT (t.spec->>'whole_row')::boolean FROM "trellis".transforms t WHERE t.id = transform_id), false));
  kind := "trellis"._key_map_kind(spec);
  IF kind = 'shadow' THEN
    shadow := "trellis"._shadow_columns(spec);
    IF shadow IS NULL THEN
      kind := 'groups';
    END IF;
  END IF;
  classified := classified - 'remap';
  is_delta := classified->>'mode' = 'delta';
  IF is_delta AND jsonb_array_length(spec->'sources') > 1 AND "trellis"._join_fans_out(spec) THEN
    SELECT quote_ident(s->>'alias') INTO fanned FROM jsonb_array_elements(spec->'sources') s
     WHERE (s->>'ordinal')::int > 0 AND NOT "trellis"._joined_on_key(spec, s, s)
     ORDER BY (s->>'ordinal')::int DESC LIMIT 1;
    classified := classified || jsonb_build_object('mode', 'group', 'reason', format(
      'the join can multiply rows (%s is not joined on its whole key): a delta would need each join row''s inputs, so groups are recomputed from the sources',
      coalesce(fanned, 'a joined source')));
    is_delta := false;
  END IF;
  IF is_delta THEN
    kind := 'groups';
  END IF;
  UPDATE "trellis".transforms t
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
CREATE OR REPLACE FUNCTION "trellis"._maintenance(aggregates boolean, delta jsonb)
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
  FOR t IN SELECT * FROM "trellis".transforms
            WHERE aggregates AND delta IS NOT NULL
              AND jsonb_array_length(spec->'sources') > 1
              AND NOT coalesce((spec->>'whole_row')::boolean, false)
              AND coalesce(spec->>'key_map', '') <> 'shadow'
  LOOP
    BEGIN
      IF "trellis"._join_fans_out(t.spec)
         AND (jsonb_array_length(coalesce(t.spec->'groups', '[]')) > 0 OR t.delta->>'mode' = 'delta') THEN
        UPDATE "trellis".transforms
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
$trellis_m33$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 34) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (34, 'history', false);
    EXECUTE $trellis_m34$-- The operations page shows time, not only now (issue #23 items 8 and 6, ADR 0054).
--
-- Each transform's lag and the changed keys its drain applied, sampled by the elected
-- staging worker every ten seconds and kept for an hour: the page's charts are drawn from
-- these rows, whichever process serves the page (a web process runs no worker). A
-- backfill's rate and the time it has left come from its keys done over the last minute of
-- samples. And each source index gap offers the statement for a migration's transaction
-- (CREATE INDEX) beside the one for psql (CREATE INDEX CONCURRENTLY).

-- Changed keys the drain applied to the transform in all (each page's or range's
-- re-derived keys, a key changed twice counting twice), as drain loops record their time.
ALTER TABLE "trellis".drain_time ADD COLUMN keys bigint NOT NULL DEFAULT 0;

-- _drained (0031) with the keys applied: ids[i] took secs[i] seconds and applied keys[i]
-- changed keys. The two-argument form stays for processes of the previous version.
CREATE FUNCTION "trellis"._drained(ids int[], secs float8[], keys bigint[])
RETURNS void LANGUAGE sql AS $fn$
  INSERT INTO "trellis".drain_time AS d (transform_id, seconds, recent, keys, at)
  SELECT x.id, sum(x.s), sum(x.s), sum(x.k), clock_timestamp()
    FROM unnest(ids, secs, keys) AS x(id, s, k)
   WHERE EXISTS (SELECT 1 FROM "trellis".transforms t WHERE t.id = x.id)
   GROUP BY x.id
   ORDER BY x.id
  ON CONFLICT (transform_id) DO UPDATE
    SET seconds = d.seconds + excluded.seconds,
        recent = d.recent * exp(-greatest(extract(epoch FROM excluded.at - d.at), 0) / 60)
                 + excluded.recent,
        keys = d.keys + excluded.keys,
        at = excluded.at
$fn$;

-- One row per transform per sample (every ten seconds, by the elected staging worker),
-- none older than an hour:
--   lag_seconds, lag_segments   status().lag at `at`
--   keys                        drain_time.keys at `at` (the rate is the difference)
--   backfill_done               status().backfill.keysDone, while it backfills
CREATE TABLE "trellis".samples (
  transform_id int NOT NULL REFERENCES "trellis".transforms (id) ON DELETE CASCADE,
  at timestamptz NOT NULL,
  lag_seconds float8 NOT NULL,
  lag_segments bigint NOT NULL,
  keys bigint NOT NULL,
  backfill_done bigint,
  PRIMARY KEY (transform_id, at)
);
CREATE INDEX samples_at ON "trellis".samples (at);

-- A build's keys done, as status().backfill.keysDone reports them (0022: a build filling
-- chunks has done what its chunks left to fill do not hold); null unless backfilling.
CREATE FUNCTION "trellis"._keys_built(p "trellis".pipeline)
RETURNS bigint LANGUAGE sql STABLE AS $fn$
  SELECT CASE WHEN p.phase <> 'backfilling' THEN NULL
              WHEN p.backfill_stage = 'chunks'
              THEN greatest(p.backfill_total - (
                     SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                      WHERE c.transform_id = p.transform_id), 0)
              ELSE p.backfill_done END
$fn$;

-- Takes a sample of every transform and forgets those older than an hour. Returns how
-- many transforms it sampled.
CREATE FUNCTION "trellis"._sample()
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  n int;
BEGIN
  INSERT INTO "trellis".samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
  SELECT t.id, clock_timestamp(), coalesce(l.seconds, 0), coalesce(l.segments, 0),
         coalesce(d.keys, 0), "trellis"._keys_built(p)
    FROM "trellis".transforms t
    JOIN "trellis".pipeline p ON p.transform_id = t.id
    LEFT JOIN "trellis".drain_time d ON d.transform_id = t.id
    LEFT JOIN LATERAL (
      SELECT count(*) AS segments,
             extract(epoch FROM clock_timestamp() - min(k.at))::float8 AS seconds
        FROM "trellis".ticks k WHERE k.seq > p.cursor_tick) l ON p.cursor_tick IS NOT NULL
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS n = ROW_COUNT;
  DELETE FROM "trellis".samples WHERE at < clock_timestamp() - interval '1 hour';
  RETURN n;
END
$fn$;

-- The last hour of every transform, for the operations page's charts (the handle's
-- history()): {target, samples: [{at, lagSeconds, lagSegments, keysPerSecond,
-- backfillDone}]}, oldest first. keysPerSecond is the changed keys applied between the
-- sample before and this one, per second (null for the first).
CREATE FUNCTION "trellis".history()
RETURNS SETOF jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object('target', t.target_name, 'samples', coalesce((
           SELECT jsonb_agg(jsonb_build_object(
                    'at', x.at, 'lagSeconds', round(x.lag_seconds::numeric, 3),
                    'lagSegments', x.lag_segments,
                    'keysPerSecond', round(x.rate::numeric, 3),
                    'backfillDone', x.backfill_done) ORDER BY x.at)
             FROM (SELECT s.*,
                          greatest(s.keys - lag(s.keys) OVER w, 0)
                          / nullif(extract(epoch FROM s.at - lag(s.at) OVER w), 0)::float8 AS rate
                     FROM "trellis".samples s
                    WHERE s.transform_id = t.id AND s.at >= clock_timestamp() - interval '1 hour'
                   WINDOW w AS (ORDER BY s.at)) x), '[]'))
    FROM "trellis".transforms t
   ORDER BY t.target_name
$fn$;

-- status().backfill with the build's pace: `rate` (keys a second, over the last minute of
-- samples, or since the build started while it has none that old) and `etaSeconds` (the
-- keys it has left at that rate; null while it knows no total or makes no progress). Both
-- null once the build is over.
CREATE FUNCTION "trellis"._backfill_pace(backfill jsonb, transform_id int, building boolean)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  done float8 := (backfill->>'keysDone')::float8;
  total float8 := (backfill->>'keysTotal')::float8;
  started timestamptz := (backfill->>'startedAt')::timestamptz;
  s "trellis".samples;
  rate float8;
  seconds float8;
BEGIN
  IF backfill IS NULL THEN
    RETURN NULL;
  END IF;
  IF building THEN
    -- The oldest sample of this build in the last minute, at least two seconds old.
    SELECT * INTO s FROM "trellis".samples x
     WHERE x.transform_id = _backfill_pace.transform_id AND x.backfill_done IS NOT NULL
       AND x.at >= started AND x.at >= clock_timestamp() - interval '1 minute'
       AND x.at <= clock_timestamp() - interval '2 seconds'
     ORDER BY x.at LIMIT 1;
    IF FOUND THEN
      seconds := extract(epoch FROM clock_timestamp() - s.at);
      rate := greatest(done - s.backfill_done, 0) / seconds;
    ELSE
      -- No sample of this build yet: its pace since it started, from its first moment (a
      -- build of a few seconds would otherwise show none before it is over).
      seconds := extract(epoch FROM clock_timestamp() - started);
      IF seconds > 0 THEN
        rate := done / seconds;
      END IF;
    END IF;
  END IF;
  RETURN backfill || jsonb_build_object(
    'rate', round(rate::numeric, 3),
    'etaSeconds', CASE WHEN rate > 0 AND total IS NOT NULL
                       THEN round((greatest(total - done, 0) / rate)::numeric, 1) END);
END
$fn$;

-- As in 0031, with the build's pace (backfill.rate, backfill.etaSeconds: _backfill_pace)
-- and each source index gap's statement for a migration's transaction (fixInMigration).
CREATE OR REPLACE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := "trellis".workers();
  -- 0029: the catalog is another database's (restored or cloned), not rebound yet.
  restored text := "trellis"._restore_reason();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
     WHERE src.transform_id = t.id
       AND uc.name = ANY (src.read_columns)
       AND (uc.paused_at IS NOT NULL OR u.paused_at IS NOT NULL)
     ORDER BY 1));
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'node', c.node, 'since', c.since,
           'keysRemaining', CASE WHEN c.keys_total IS NOT NULL
                                 THEN greatest(c.keys_total - c.keys_done, 0) END)
         ORDER BY c.since, c.node), '[]')
    INTO correcting
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
     WHERE u.paused_at IS NOT NULL OR pu.phase <> 'live');

  lifecycle := CASE WHEN t.paused_at IS NOT NULL THEN 'paused' ELSE p.phase END;
  -- Rows that came or went without DML are being re-derived: a build, of a part of it.
  IF lifecycle IN ('live', 'catching_up') AND jsonb_array_length(correcting) > 0 THEN
    lifecycle := 'backfilling';
  END IF;
  -- A live transform reading a paused upstream column, or reading a target that is still
  -- being built, is not keeping up with its sources.
  IF lifecycle = 'live' AND (jsonb_array_length(paused_upstream) > 0 OR upstream_behind) THEN
    lifecycle := 'catching_up';
  END IF;

  -- 0029: a target of a database restored or cloned is not live until it was rebuilt here.
  IF restored IS NOT NULL AND lifecycle <> 'paused' THEN
    lifecycle := 'unverified';
  END IF;

  IF p.cursor_tick IS NOT NULL THEN
    SELECT count(*), extract(epoch FROM clock_timestamp() - min(k.at))::float8
      INTO lag_segments, lag_seconds
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.widened_at IS NOT NULL AND ts.read_columns && src.widen_columns
     ORDER BY ts.ordinal LIMIT 1;
  END IF;
  -- WAL capture published a source and waits out the transactions that began before
  -- (they could write it unpublished) before a backfill reads it (ADR 0023).
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'publish', 'table', src.qualified, 'lockMode', 'none',
             'since', src.wal_since, 'attempts', NULL)
           || "trellis"._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix',
               -- 0034: the same statement for a migration's transaction (no CONCURRENTLY).
               'fixInMigration', regexp_replace(g->>'fix', '^CREATE INDEX CONCURRENTLY ', 'CREATE INDEX '))), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
    'correcting', correcting,
    'captureFailure', CASE WHEN t.capture_failure IS NOT NULL THEN jsonb_build_object(
        'kind', t.capture_failure->'kind', 'error', t.capture_failure->'error',
        'columns', t.capture_failure->'columns',
        'detectedAt', (t.capture_failure->>'detected_at')::timestamptz) END,
    'captureWait', wait,
    'buildFailure', CASE WHEN p.build_attempts > 0 AND p.build_error IS NOT NULL
                          AND p.build_next_at IS NOT NULL THEN jsonb_build_object(
        'attempts', p.build_attempts, 'error', p.build_error,
        'nextAttemptAt', p.build_next_at) END,
    'drainFailure', drain,
    -- 0034: with the build's pace (rate, etaSeconds).
    'backfill', "trellis"._backfill_pace(CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        -- 0028: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END, t.id, p.phase = 'backfilling'),
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0031: the drain time spent on it, and its share of the drain's recent time.
    'drain', "trellis"._drain_share(t.id),
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', CASE WHEN restored IS NOT NULL THEN jsonb_build_object(
        'kind', 'staging_worker',
        'reason', restored || ': the staging worker rebinds its tables by name and rebuilds every transform when it starts')
      ELSE "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                upstream_behind OR jsonb_array_length(paused_upstream) > 0) END,
    -- 0029: the last restore (or clone) recognised, or the one not rebound yet.
    'restored', CASE WHEN restored IS NOT NULL THEN jsonb_build_object('reason', restored, 'detectedAt', NULL)
                     ELSE (SELECT jsonb_build_object('reason', c.restored->>'reason',
                                                     'detectedAt', (c.restored->>'detectedAt')::timestamptz)
                             FROM "trellis".config c WHERE c.restored IS NOT NULL) END);
END
$fn$;

$trellis_m34$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 35) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (35, 'redefine', false);
    EXECUTE $trellis_m35$-- Redefinition in place (issue #25 item 1, ADR 0055):
--
--   ALTER TRANSFORM target AS SELECT ...             (the AS form of ADR 0049, a view's SQL)
--   ALTER TRANSFORM target AS FROM ... SELECT ...    (the FROM-first form's body)
--
-- changes a definition while the target keeps serving reads. The new definition is built as
-- a hidden transform (a "shadow": its target a table "redefine#<id>" in the catalog schema,
-- its transforms row marked `redefines`), by the build and catch-up machinery every
-- transform goes through, while the old transform keeps maintaining the target. Once the
-- shadow is live, the staging worker switches (_redefine_switch, in one short transaction):
-- the target is altered in place to the new definition's columns (ALTER TABLE ADD, DROP,
-- ALTER TYPE; the key constraint replaced when the key changes), its rows made the shadow's
-- by a diff (rows gone deleted, rows new or changed written), the shadow's catalog rows
-- (definition, plan, cursor, key map and group states) made the transform's, the old
-- transform's removed and the shadow table dropped. The table keeps its OID, grants, the
-- app's indexes, comments, views and foreign keys. What Postgres would drop with a column
-- (a view over it, an index or a foreign key on it) refuses the redefinition, naming it.

-- On a shadow: the transform it redefines. On a transform: its redefinition (building, the
-- last switch, or why the last one was given up).
ALTER TABLE "trellis".transforms ADD COLUMN redefines int;
ALTER TABLE "trellis".transforms ADD COLUMN redefinition jsonb;
CREATE UNIQUE INDEX transforms_redefines ON "trellis".transforms (redefines) WHERE redefines IS NOT NULL;

-- grammar_parse_from_first: 0024's parse_statement (renamed by 0028), with ALTER TRANSFORM t AS.
CREATE OR REPLACE FUNCTION "trellis".grammar_parse_from_first(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(statement);
  t "trellis".grammar_token := toks[1];
  i int;
  e int;
  start int;
  sch text;
  nm text;
  alias text;
  col text;
  jt text;
  expected text;
  target jsonb;
  from_ jsonb;
  joins jsonb := '[]';
  items jsonb := '[]';
  group_by jsonb := '[]';
  where_ text;
  having_ text;
  wsi boolean := false;
  wrs boolean := false;
  label text;
  label_expr text;
  last "trellis".grammar_token;
  before "trellis".grammar_token;
BEGIN
  IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
    PERFORM "trellis".grammar_fail(format(
      'empty statement: expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      "trellis".grammar_describe(t)), t.pos);
  END IF;
  IF t.kind <> 'word' OR t.value NOT IN ('transform', 'pause', 'resume', 'drop', 'alter') THEN
    PERFORM "trellis".grammar_fail(format(
      'expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      "trellis".grammar_describe(t)), t.pos);
  END IF;

  IF t.value IN ('pause', 'resume') THEN
    IF NOT "trellis".grammar_kw(toks[2], 'transform') THEN
      PERFORM "trellis".grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    nm := "trellis".grammar_name(toks[3], 'a transform name', true);
    i := 4;
    IF toks[i].kind = 'punct' AND toks[i].text = '.' THEN
      col := "trellis".grammar_name(toks[i + 1], 'a column name after "."', false);
      i := i + 2;
      expected := 'end of statement';
    ELSE
      expected := '"." and a column name, or end of statement';
    END IF;
    PERFORM "trellis".grammar_end(toks, i, expected);
    RETURN jsonb_build_object('kind', t.value, 'transform', nm, 'column', col);
  END IF;

  IF t.value IN ('drop', 'alter') THEN
    IF NOT "trellis".grammar_kw(toks[2], 'transform') THEN
      PERFORM "trellis".grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM "trellis".grammar_qualified(toks, 3, 'a transform name') q;
    -- A qualified target keeps its schema (the engine refuses one that is not its target
    -- schema); the key is there only then, so unqualified statements have the plain shape.
    target := jsonb_build_object('transform', nm)
      || CASE WHEN sch IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('schema', sch) END;
    IF t.value = 'drop' THEN
      PERFORM "trellis".grammar_end(toks, i, 'end of statement');
      RETURN jsonb_build_object('kind', 'drop') || target;
    END IF;
    t := toks[i];
    -- 0035: ALTER TRANSFORM t AS SELECT ... (a view's SQL, 0028) | AS FROM ... SELECT ...
    -- (the FROM-first form's body): a redefinition. The rest is read by parse_statement as
    -- the TRANSFORM statement it would be (TRANSFORM t AS SELECT ... | TRANSFORM t FROM ...),
    -- with ALTER (and, before FROM, AS) blanked out so every position it reports stays
    -- where it was in this statement.
    IF "trellis".grammar_kw(t, 'as') THEN
      IF NOT ("trellis".grammar_kw(toks[i + 1], 'select') OR "trellis".grammar_kw(toks[i + 1], 'from')) THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1, 'SELECT or FROM after AS');
      END IF;
      from_ := "trellis".parse_statement(overlay(
        CASE WHEN "trellis".grammar_kw(toks[i + 1], 'from')
             THEN overlay(statement PLACING repeat(' ', char_length(t.text)) FROM t.pos FOR char_length(t.text))
             ELSE statement END
        PLACING repeat(' ', char_length(toks[1].text)) FROM toks[1].pos FOR char_length(toks[1].text)));
      RETURN jsonb_build_object('kind', 'redefine', 'definition', from_) || target;
    END IF;
    IF "trellis".grammar_kw(t, 'add') THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'an expression after ADD COLUMN');
      END IF;
      IF NOT "trellis".grammar_kw(toks[e], 'as') THEN
        PERFORM "trellis".grammar_unexpected(toks, e, 'AS and the new column''s name');
      END IF;
      nm := "trellis".grammar_name(toks[e + 1], 'a column name after AS', false);
      PERFORM "trellis".grammar_end(toks, e + 2, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_add_column',
        'expr', "trellis".grammar_text(toks, i, e), 'name', nm) || target;
    ELSIF "trellis".grammar_kw(t, 'drop') THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      nm := "trellis".grammar_name(toks[i], 'a column name', true);
      PERFORM "trellis".grammar_end(toks, i + 1, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_drop_column', 'name', nm) || target;
    ELSIF "trellis".grammar_kw(t, 'set') OR "trellis".grammar_kw(t, 'reset') THEN
      IF toks[i + 1].kind = 'punct' AND toks[i + 1].text = '(' THEN
        RETURN "trellis".grammar_settings(toks, i + 1, t.value = 'set') || target;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i + 1], 'without') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1,
          'WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or "(" and settings');
      END IF;
      IF "trellis".grammar_kw(toks[i + 2], 'row') THEN
        IF NOT "trellis".grammar_kw(toks[i + 3], 'security') THEN
          PERFORM "trellis".grammar_unexpected(toks, i + 3, 'SECURITY');
        END IF;
        PERFORM "trellis".grammar_end(toks, i + 4, 'end of statement');
        RETURN jsonb_build_object('kind', 'alter_without_row_security',
          'value', t.value = 'set') || target;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i + 2], 'source') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'SOURCE INDEX or ROW SECURITY');
      END IF;
      IF NOT "trellis".grammar_kw(toks[i + 3], 'index') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 3, 'INDEX');
      END IF;
      PERFORM "trellis".grammar_end(toks, i + 4, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_without_source_index',
        'value', t.value = 'set') || target;
    END IF;
    PERFORM "trellis".grammar_unexpected(toks, i, 'ADD, DROP, SET, RESET or AS');
  END IF;

  -- TRANSFORM target FROM source [[AS] alias] {join} SELECT ... [WHERE] [GROUP BY] [HAVING]
  --   [WITHOUT SOURCE INDEX]
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM "trellis".grammar_qualified(toks, 2, 'a transform name') q;
  target := jsonb_build_object('schema', sch, 'name', nm);
  IF NOT "trellis".grammar_kw(toks[i], 'from') THEN
    PERFORM "trellis".grammar_unexpected(toks, i, 'FROM');
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM "trellis".grammar_qualified(toks, i + 1, 'a source table name') q;
  SELECT q.alias, q.next INTO alias, i FROM "trellis".grammar_alias(toks, i) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias);

  LOOP
    t := toks[i];
    IF "trellis".grammar_kw(t, 'join') THEN
      jt := 'inner';
      i := i + 1;
    ELSIF "trellis".grammar_kw(t, 'inner') THEN
      IF NOT "trellis".grammar_kw(toks[i + 1], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1, 'JOIN after INNER');
      END IF;
      jt := 'inner';
      i := i + 2;
    ELSIF "trellis".grammar_kw(t, 'left') AND coalesce(toks[i + 1].text, '') <> '(' THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'outer') THEN
        i := i + 1;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'JOIN after LEFT');
      END IF;
      jt := 'left';
      i := i + 1;
    ELSE
      EXIT;
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM "trellis".grammar_qualified(toks, i, 'a table name after JOIN') q;
    SELECT q.alias, q.next INTO alias, i FROM "trellis".grammar_alias(toks, i) q;
    IF NOT "trellis".grammar_kw(toks[i], 'on') THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'ON and a join condition', 'join');
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', "trellis".grammar_text(toks, i, e)));
    i := e;
  END LOOP;

  IF NOT "trellis".grammar_kw(toks[i], 'select') THEN
    PERFORM "trellis".grammar_unexpected(toks, i,
      CASE WHEN jsonb_array_length(joins) = 0 AND alias IS NULL THEN 'an alias, JOIN or SELECT'
        ELSE 'JOIN or SELECT' END,
      'join');
  END IF;
  i := i + 1;
  IF "trellis".grammar_kw(toks[i], 'distinct') THEN
    PERFORM "trellis".grammar_fail(format(
      'SELECT DISTINCT is not supported: use GROUP BY (expected a select item, found %s)',
      "trellis".grammar_describe(toks[i])), toks[i].pos);
  END IF;
  IF "trellis".grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  LOOP
    start := i;
    e := "trellis".grammar_scan(toks, i);
    IF e = start THEN
      PERFORM "trellis".grammar_unexpected(toks, e, 'a select item', 'select');
    END IF;
    IF (e = start + 1 AND toks[start].text = '*')
      OR (e >= start + 2 AND toks[e - 1].text = '*' AND toks[e - 2].kind = 'punct'
          AND toks[e - 2].text = '.') THEN
      PERFORM "trellis".grammar_fail(format(
        'name each column: SELECT * is not supported (expected an expression, found %s)',
        "trellis".grammar_describe(toks[e - 1])), toks[start].pos);
    END IF;
    nm := NULL;
    label := NULL;
    label_expr := NULL;
    IF "trellis".grammar_kw(toks[e], 'as') THEN
      nm := "trellis".grammar_name(toks[e + 1], 'a column name after AS', false);
      i := e + 2;
    ELSE
      i := e;
      IF e >= start + 2 THEN
        last := toks[e - 1];
        before := toks[e - 2];
        IF (last.kind = 'ident'
            OR (last.kind = 'word' AND "trellis".grammar_keyword_class(last.value) IS NULL))
          AND before.kind <> 'op'
          AND NOT (before.kind = 'punct' AND before.text IN ('.', '::')) THEN
          label := "trellis".grammar_name(last, 'a column name', false);
          label_expr := "trellis".grammar_text(toks, start, e - 1);
        END IF;
      END IF;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', "trellis".grammar_text(toks, start, e), 'name', nm, 'bare_label', label,
      'label_expr', label_expr, 'position', toks[start].pos));
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;
  expected := '",", WHERE, GROUP BY, HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';

  IF "trellis".grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'group') THEN
    IF NOT "trellis".grammar_kw(toks[i + 1], 'by') THEN
      PERFORM "trellis".grammar_unexpected(toks, i + 1, 'BY after GROUP');
    END IF;
    i := i + 2;
    IF "trellis".grammar_kw(toks[i], 'all') THEN
      PERFORM "trellis".grammar_fail(format(
        'GROUP BY ALL is not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    IF "trellis".grammar_kw(toks[i], 'distinct') THEN
      PERFORM "trellis".grammar_fail(format(
        'grouping sets are not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    LOOP
      IF (("trellis".grammar_kw(toks[i], 'rollup') OR "trellis".grammar_kw(toks[i], 'cube'))
          AND toks[i + 1].text = '(')
        OR ("trellis".grammar_kw(toks[i], 'grouping') AND "trellis".grammar_kw(toks[i + 1], 'sets'))
        OR (toks[i].text = '(' AND toks[i + 1].text = ')')
      THEN
        PERFORM "trellis".grammar_fail(format(
          'grouping sets are not supported: expected a GROUP BY expression, found %s',
          "trellis".grammar_describe(toks[i])), toks[i].pos);
      END IF;
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'a GROUP BY expression');
      END IF;
      group_by := group_by || jsonb_build_array("trellis".grammar_text(toks, i, e));
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'having') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  -- WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY, each at most once, in either order.
  WHILE "trellis".grammar_kw(toks[i], 'without') LOOP
    IF "trellis".grammar_kw(toks[i + 1], 'source') AND NOT wsi THEN
      IF NOT "trellis".grammar_kw(toks[i + 2], 'index') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'INDEX after WITHOUT SOURCE');
      END IF;
      wsi := true;
    ELSIF "trellis".grammar_kw(toks[i + 1], 'row') AND NOT wrs THEN
      IF NOT "trellis".grammar_kw(toks[i + 2], 'security') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'SECURITY after WITHOUT ROW');
      END IF;
      wrs := true;
    ELSE
      PERFORM "trellis".grammar_unexpected(toks, i + 1, CASE
        WHEN wsi THEN 'ROW SECURITY after WITHOUT' WHEN wrs THEN 'SOURCE INDEX after WITHOUT'
        ELSE 'SOURCE INDEX or ROW SECURITY after WITHOUT' END);
    END IF;
    i := i + 3;
    expected := CASE WHEN wsi AND wrs THEN 'end of statement'
      WHEN wsi THEN 'WITHOUT ROW SECURITY or end of statement'
      ELSE 'WITHOUT SOURCE INDEX or end of statement' END;
  END LOOP;

  PERFORM "trellis".grammar_end(toks, i, expected,
    CASE WHEN where_ IS NULL AND having_ IS NULL AND jsonb_array_length(group_by) = 0
      THEN 'select' END);
  RETURN jsonb_build_object(
    'kind', 'transform', 'target', target, 'from', from_, 'joins', joins, 'select', items,
    'where', where_, 'group_by', group_by, 'having', having_, 'without_source_index', wsi)
    -- Only when written: the AST of a statement without it is as it was before 0024.
    || CASE WHEN wrs THEN jsonb_build_object('without_row_security', true) ELSE '{}' END;
END
$fn$;

-- grammar_render_from_first: 0024's render_statement (renamed by 0028), with ALTER TRANSFORM t AS.
CREATE OR REPLACE FUNCTION "trellis".grammar_render_from_first(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  kind text := ast ->> 'kind';
  res text;
  j jsonb;
  target text;
BEGIN
  IF kind = 'transform' THEN
    res := 'TRANSFORM '
      || "trellis".grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
      || ' FROM '
      || "trellis".grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
      || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '');
    FOR j IN SELECT value FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) LOOP
      res := res
        || CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
        || "trellis".grammar_render_name(j ->> 'schema', j ->> 'name')
        || coalesce(' AS ' || quote_ident(j ->> 'alias'), '')
        || ' ON ' || (j ->> 'on');
    END LOOP;
    res := res || ' SELECT ' || (
      SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
        ', ' ORDER BY ordinality)
      FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY);
    res := res
      || coalesce(' WHERE ' || (ast ->> 'where'), '')
      || coalesce(' GROUP BY ' || (
        SELECT string_agg(value, ', ' ORDER BY ordinality)
        FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '')
      || coalesce(' HAVING ' || (ast ->> 'having'), '')
      || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX'
           ELSE '' END
      || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY'
           ELSE '' END;
  ELSIF kind = 'redefine' THEN
    -- 0035: ALTER TRANSFORM t AS <the definition's body>, in the form it was written in.
    target := 'TRANSFORM ' || "trellis".grammar_render_name(ast ->> 'schema', ast ->> 'transform');
    res := "trellis".render_statement(ast -> 'definition');
    res := CASE WHEN ast -> 'definition' ->> 'form' = 'as' THEN 'ALTER ' || res
                ELSE 'ALTER ' || target || ' AS' || substr(res, char_length(
                       'TRANSFORM ' || "trellis".grammar_render_name(ast -> 'definition' -> 'target' ->> 'schema',
                                                                 ast -> 'definition' -> 'target' ->> 'name')) + 1) END;
  ELSIF kind IN ('pause', 'resume') THEN
    res := upper(kind) || ' TRANSFORM ' || quote_ident(ast ->> 'transform')
      || coalesce('.' || quote_ident(ast ->> 'column'), '');
  ELSIF kind IN ('drop', 'alter_add_column', 'alter_drop_column', 'alter_without_source_index',
                 'alter_without_row_security', 'alter_set_settings', 'alter_reset_settings')
  THEN
    target := "trellis".grammar_render_name(ast ->> 'schema', ast ->> 'transform');
    res := CASE kind
      WHEN 'drop' THEN 'DROP TRANSFORM ' || target
      WHEN 'alter_add_column' THEN 'ALTER TRANSFORM ' || target || ' ADD COLUMN '
        || (ast ->> 'expr') || ' AS ' || quote_ident(ast ->> 'name')
      WHEN 'alter_drop_column' THEN 'ALTER TRANSFORM ' || target || ' DROP COLUMN '
        || quote_ident(ast ->> 'name')
      WHEN 'alter_set_settings' THEN 'ALTER TRANSFORM ' || target || ' SET (' || (
        SELECT string_agg(s.key || ' = ' || quote_literal(s.value), ', ' ORDER BY o)
          FROM jsonb_array_elements(ast -> 'settings') WITH ORDINALITY AS x(v, o),
               LATERAL (SELECT v ->> 'name' AS key, v ->> 'value' AS value) s) || ')'
      WHEN 'alter_reset_settings' THEN 'ALTER TRANSFORM ' || target || ' RESET (' || (
        SELECT string_agg(v, ', ' ORDER BY o)
          FROM jsonb_array_elements_text(ast -> 'names') WITH ORDINALITY AS x(v, o)) || ')'
      ELSE 'ALTER TRANSFORM ' || target
        || CASE WHEN (ast ->> 'value')::boolean THEN ' SET' ELSE ' RESET' END
        || CASE kind WHEN 'alter_without_row_security' THEN ' WITHOUT ROW SECURITY'
                     ELSE ' WITHOUT SOURCE INDEX' END
    END;
  END IF;
  IF res IS NULL THEN
    RAISE EXCEPTION 'render_statement: not a statement AST: %', left(ast::text, 200)
      USING ERRCODE = '22023';
  END IF;
  RETURN res;
END
$fn$;

-- _apply, as in 0024, with ALTER TRANSFORM t AS (redefine); and no other ALTER of a
-- transform while a redefinition of it is being built (it would be lost at the switch).
CREATE OR REPLACE FUNCTION "trellis"._apply(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  ast jsonb;
  previous jsonb;
  result jsonb;
BEGIN
  IF statement IS NULL THEN
    PERFORM "trellis"._fail('TRP01', 'the statement is NULL');
  END IF;
  ast := "trellis".parse_statement(statement);
  IF transform_only AND ast->>'kind' <> 'transform' THEN
    PERFORM "trellis"._fail('TRV01', format(
      'define() takes a TRANSFORM statement, not %s: use apply() for it', upper(split_part(ast->>'kind', '_', 1))));
  END IF;
  PERFORM pg_advisory_xact_lock(1953653104, hashtext('trellis'));
  IF ast->>'kind' LIKE 'alter\_%' AND EXISTS (
       SELECT 1 FROM "trellis".transforms s WHERE s.redefines = ("trellis"._transform_named(ast)).id) THEN
    PERFORM "trellis"._fail('TRC01', format(
      'transform %I is being redefined (ALTER TRANSFORM %I AS ...): alter it once the redefinition is done, or redefine it again with the change',
      ast->>'transform', ast->>'transform'));
  END IF;
  CASE ast->>'kind'
    WHEN 'transform' THEN RETURN "trellis"._define(ast, statement);
    WHEN 'pause' THEN RETURN "trellis"._pause(ast);
    WHEN 'resume' THEN RETURN "trellis"._resume(ast);
    WHEN 'drop' THEN RETURN "trellis"._drop(ast);
    WHEN 'redefine' THEN RETURN "trellis"._redefine(ast);
    WHEN 'alter_add_column' THEN
      previous := "trellis"._enter_settings(("trellis"._transform_named(ast)).settings);
      result := "trellis"._alter_add_column(ast);
      PERFORM "trellis"._leave_settings(previous);
      RETURN result;
    WHEN 'alter_drop_column' THEN RETURN "trellis"._alter_drop_column(ast);
    WHEN 'alter_without_source_index' THEN RETURN "trellis"._alter_without_source_index(ast);
    WHEN 'alter_without_row_security' THEN RETURN "trellis"._alter_without_row_security(ast);
    WHEN 'alter_set_settings', 'alter_reset_settings' THEN RETURN "trellis"._alter_settings(ast);
  END CASE;
  PERFORM "trellis"._fail('TRP01', format('unknown statement kind %s', ast->>'kind'));
  RETURN NULL;
END
$fn$;

-- definitions(), as in 0026, without the shadows of redefinitions being built (they are
-- not the app's transforms: a dump must not define them).
CREATE OR REPLACE FUNCTION "trellis".definitions()
RETURNS SETOF jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object(
           'target', t.target_name,
           'targetSchema', t.target_schema,
           'statement', t.statement,
           'sources', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'table', s.source_schema || '.' || s.source_name, 'alias', s.alias,
                      'join', s.join_type, 'keyColumns', to_jsonb(s.key_columns))
                    ORDER BY s.ordinal)
               FROM "trellis".transform_sources s WHERE s.transform_id = t.id), '[]'),
           'columns', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'type', c.type, 'expression', c.expression,
                      'key', c.is_key, 'implicit', c.implicit)
                    ORDER BY c.ordinal)
               FROM "trellis".transform_columns c WHERE c.transform_id = t.id), '[]'),
           'options', jsonb_build_object(
             'withoutSourceIndex', t.without_source_index,
             'withoutRowSecurity', coalesce((t.spec->'ast'->>'without_row_security')::boolean, false)),
           'settings', t.settings,
           'aggregates', t.aggregates,
           'maintenance', "trellis"._maintenance(t.aggregates, t.delta),
           'createdAt', t.created_at,
           'updatedAt', t.updated_at)
    FROM "trellis".transforms t
   WHERE t.redefines IS NULL
   ORDER BY t.target_name
$fn$;

-- A shadow goes with the transform it redefines (DROP TRANSFORM, a redefinition replaced
-- by another), and its table and key map with it.
CREATE FUNCTION "trellis"._drop_redefinition()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF OLD.redefines IS NULL THEN
    DELETE FROM "trellis".transforms s WHERE s.redefines = OLD.id;
  ELSE
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = OLD.target_oid) THEN
      EXECUTE 'DROP TABLE ' || OLD.target_oid::regclass::text;
    END IF;
    EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || OLD.id);
  END IF;
  RETURN OLD;
END
$fn$;
CREATE TRIGGER drop_redefinition BEFORE DELETE ON "trellis".transforms
  FOR EACH ROW EXECUTE FUNCTION "trellis"._drop_redefinition();

-- The objects of the app's that depend on column `attnum` of target `rel` (views, indexes,
-- constraints, foreign keys of other tables, triggers, policies, statistics), each named;
-- not the engine's own: the key's constraint (or a grand total's index) and the indexes it
-- made on joined tables' keys, which a switch replaces itself. `kinds` narrows the list
-- to some catalogs (pg_rewrite for views and rules, say).
CREATE FUNCTION "trellis"._column_dependants(t "trellis".transforms, attnum int, kinds regclass[] DEFAULT NULL)
RETURNS text[] LANGUAGE sql STABLE AS $fn$
  WITH engine_constraints AS (
    SELECT c.oid, c.conindid FROM pg_constraint c
     WHERE c.conrelid = t.target_oid AND c.contype IN ('p', 'u')
       AND ARRAY(SELECT a.attname::text FROM unnest(c.conkey) k(n)
                   JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY 1)
           = ARRAY(SELECT x FROM jsonb_array_elements_text(t.spec->'key') x ORDER BY 1)
    -- Postgres 18 records a column's NOT NULL as a constraint of its own (contype 'n'): it
    -- is the column's, and goes with it.
    UNION ALL
    SELECT c.oid, c.conindid FROM pg_constraint c
     WHERE c.conrelid = t.target_oid AND c.contype = 'n'),
  engine_indexes AS (
    SELECT conindid AS oid FROM engine_constraints
    UNION
    SELECT i.indexrelid FROM pg_index i
     WHERE i.indrelid = t.target_oid AND NOT i.indisunique AND i.indexprs IS NULL AND i.indpred IS NULL
       AND ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o)
           IN (SELECT ARRAY(SELECT jsonb_array_elements_text(s->'target_key_columns'))
                 FROM jsonb_array_elements(t.spec->'sources') s
                WHERE (s->>'ordinal')::int > 0 AND jsonb_typeof(s->'target_key_columns') = 'array'))
  SELECT coalesce(array_agg(DISTINCT what ORDER BY what), '{}') FROM (
    SELECT CASE
             WHEN d.classid = 'pg_rewrite'::regclass THEN
               (SELECT CASE WHEN c.relkind = 'm' THEN 'materialized view ' ELSE 'view ' END || c.oid::regclass::text
                  FROM pg_rewrite w JOIN pg_class c ON c.oid = w.ev_class WHERE w.oid = d.objid)
             ELSE pg_describe_object(d.classid, d.objid, 0) END AS what
      FROM pg_depend d
     WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = t.target_oid
       AND d.refobjsubid = attnum AND d.deptype IN ('n', 'a')
       AND (kinds IS NULL OR d.classid = ANY (kinds))
       AND NOT (d.classid = 'pg_class'::regclass AND d.objid IN (SELECT oid FROM engine_indexes))
       AND NOT (d.classid = 'pg_constraint'::regclass AND d.objid IN (SELECT oid FROM engine_constraints))
       -- a view's own rule on its own columns, a sequence owned by the column
       AND NOT (d.classid = 'pg_class'::regclass AND d.objid = t.target_oid)) x
   WHERE what IS NOT NULL
$fn$;

-- What switching transform `t` to the definition `spec` does to its target, and what it
-- cannot do (refused): {changes: [sentence...], refused: [sentence...], key_changed,
-- columns: [{name, action: add | drop | retype | replace, type, from}]}. Column by name:
-- one the new definition lacks is dropped, a new one added, one whose type or collation
-- changes is retyped in place (ALTER COLUMN ... TYPE, with the cast from the old type), or
-- dropped and added again where there is no such cast. Refused, naming them: the app's
-- objects on a column that would be dropped (Postgres would drop an index, a constraint,
-- a trigger with it, and refuses for a view or a foreign key), views and policies over a
-- column that would be retyped (Postgres refuses), foreign keys referencing a key that
-- changes, and transforms reading a column that would be dropped.
CREATE FUNCTION "trellis"._redefine_plan(t "trellis".transforms, spec jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  changes text[] := '{}';
  refused text[] := '{}';
  columns jsonb := '[]';
  key_changed boolean;
  r record;
  deps text[];
  castable boolean;
  action text;
BEGIN
  key_changed := (t.spec->'key') IS DISTINCT FROM (spec->'key')
    OR coalesce((t.spec->>'key_nullable')::boolean, false) IS DISTINCT FROM coalesce((spec->>'key_nullable')::boolean, false);
  IF key_changed THEN
    deps := ARRAY(SELECT format('foreign key %I of %s', c.conname, c.conrelid::regclass)
                    FROM pg_constraint c WHERE c.confrelid = t.target_oid AND c.contype = 'f' ORDER BY 1);
    IF cardinality(deps) > 0 THEN
      refused := refused || format('its key would change from (%s) to (%s), and %s reference%s it',
        (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k),
        (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(spec->'key') k),
        array_to_string(deps, ', '), CASE WHEN cardinality(deps) = 1 THEN 's' ELSE '' END);
    ELSE
      changes := changes || format('key changed from (%s) to (%s): the key constraint replaced, every row written again',
        coalesce((SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k), ''),
        coalesce((SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(spec->'key') k), ''));
    END IF;
  END IF;
  FOR r IN
    SELECT coalesce(o.name, nn.n->>'name') AS name, o.type AS old_type, o.collation_name AS old_coll,
           nn.n->>'type' AS new_type, nn.n->>'collation' AS new_coll, a.attnum::int AS attnum,
           o.name IS NULL AS added, nn.n IS NULL AS dropped, coalesce(nn.o, 1000 + o.ordinal) AS o
      FROM (SELECT c.name::text AS name, c.type, c.collation_name, c.ordinal FROM "trellis".transform_columns c
             WHERE c.transform_id = t.id) o
      FULL JOIN jsonb_array_elements(spec->'columns') WITH ORDINALITY AS nn(n, o) ON nn.n->>'name' = o.name
      LEFT JOIN pg_attribute a ON a.attrelid = t.target_oid AND a.attname = coalesce(o.name, nn.n->>'name')
                              AND NOT a.attisdropped
     ORDER BY 9
  LOOP
    action := NULL;
    IF r.added THEN
      action := 'add';
      changes := changes || format('column %I added (%s)', r.name, r.new_type);
    ELSIF r.dropped THEN
      action := 'drop';
    ELSIF r.old_type IS DISTINCT FROM r.new_type OR r.old_coll IS DISTINCT FROM r.new_coll THEN
      BEGIN
        EXECUTE format('SELECT NULL::%s::%s', r.old_type, r.new_type);
        castable := true;
      EXCEPTION WHEN OTHERS THEN
        castable := false;
      END;
      action := CASE WHEN castable THEN 'retype' ELSE 'replace' END;
    END IF;
    CONTINUE WHEN action IS NULL;
    columns := columns || jsonb_build_object('name', r.name, 'action', action, 'type', r.new_type,
                                             'collation', r.new_coll, 'from', r.old_type);
    IF action = 'add' THEN
      CONTINUE;
    END IF;
    IF r.attnum IS NULL THEN
      CONTINUE;
    END IF;
    -- Transforms reading the column (chains).
    deps := ARRAY(SELECT DISTINCT format('transform %I', x.target_name)
                    FROM "trellis".transform_sources ts JOIN "trellis".transforms x ON x.id = ts.transform_id
                   WHERE ts.source_oid = t.target_oid AND x.id <> t.id AND x.redefines IS DISTINCT FROM t.id
                     AND r.name = ANY (ts.read_columns::text[])
                   ORDER BY 1);
    IF action IN ('drop', 'replace') THEN
      deps := deps || "trellis"._column_dependants(t, r.attnum);
      IF cardinality(deps) > 0 THEN
        refused := refused || format('column %I would be dropped%s, and %s depend%s on it',
          r.name, CASE WHEN action = 'replace' THEN format(' and added again (there is no cast from %s to %s)', r.old_type, r.new_type) ELSE '' END,
          array_to_string(deps, ', '), CASE WHEN cardinality(deps) = 1 THEN 's' ELSE '' END);
      ELSE
        changes := changes || CASE WHEN action = 'drop' THEN format('column %I dropped', r.name)
          ELSE format('column %I dropped and added again as %s (there is no cast from %s)', r.name, r.new_type, r.old_type) END;
      END IF;
    ELSE
      -- Postgres refuses to retype a column a view, a rule or a policy reads.
      deps := "trellis"._column_dependants(t, r.attnum, ARRAY['pg_rewrite'::regclass, 'pg_policy'::regclass]);
      IF cardinality(deps) > 0 THEN
        refused := refused || format('column %I would change type from %s to %s, which Postgres refuses while %s read%s it',
          r.name, r.old_type, r.new_type, array_to_string(deps, ', '), CASE WHEN cardinality(deps) = 1 THEN 's' ELSE '' END);
      ELSE
        deps := "trellis"._column_dependants(t, r.attnum);
        changes := changes || format('column %I retyped from %s to %s%s', r.name, r.old_type,
          r.new_type || coalesce(' COLLATE ' || r.new_coll, ''),
          CASE WHEN cardinality(deps) > 0 THEN format(' (%s rebuilt or checked again)', array_to_string(deps, ', ')) ELSE '' END);
        -- A transform reading it follows the new type (ADR 0047) or the switch is refused.
        FOR action IN SELECT DISTINCT x.target_name FROM "trellis".transform_sources ts
                        JOIN "trellis".transforms x ON x.id = ts.transform_id
                       WHERE ts.source_oid = t.target_oid AND x.id <> t.id AND x.redefines IS DISTINCT FROM t.id
                         AND r.name = ANY (ts.read_columns::text[]) ORDER BY 1 LOOP
          changes := changes || format('transform %I reads column %I: its definition follows the new type and its target is re-derived', action, r.name);
        END LOOP;
      END IF;
    END IF;
  END LOOP;
  RETURN jsonb_build_object('changes', to_jsonb(changes), 'refused', to_jsonb(refused),
                            'key_changed', key_changed, 'columns', columns);
END
$fn$;

-- ALTER TRANSFORM t AS <definition>: the definition analysed as a fresh TRANSFORM of that
-- name would be (under this session's search_path and settings, as a definition is), the
-- switch planned (refused at once when it would be: see _redefine_plan), and the shadow
-- defined, for the staging worker to build and switch to. A redefinition already being
-- built is replaced; one to the definition in force is none (and ends one being built).
CREATE FUNCTION "trellis"._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  def jsonb := ast->'definition';
  cat name := 'trellis';
  shadow_name text := 'redefine#' || t.id;
  spec jsonb;
  normalised text;
  plan jsonb;
  v_oid oid;
  new_id int;
BEGIN
  IF t.redefines IS NOT NULL THEN
    PERFORM "trellis"._fail('TRN01', format('there is no transform named %I', t.target_name));
  END IF;
  -- A switch to a redefinition being replaced finishes first (it holds these rows, taken
  -- in the drain's order): the transform is then the one it switched to.
  PERFORM 1 FROM "trellis".pipeline px
   WHERE px.transform_id = t.id
      OR px.transform_id IN (SELECT y.id FROM "trellis".transforms y WHERE y.redefines = t.id)
   ORDER BY px.transform_id FOR UPDATE;
  IF NOT EXISTS (SELECT 1 FROM "trellis".transforms y WHERE y.id = t.id) THEN
    PERFORM "trellis"._fail('TRT01', format(
      'transform %I was switched to another definition while this statement waited: apply it again', t.target_name));
  END IF;
  def := jsonb_set(def, '{target}', jsonb_build_object('schema', NULL, 'name', t.target_name));
  spec := "trellis"._analyze_transform(def);
  spec := jsonb_set(spec, '{ast,target}', jsonb_build_object('schema', NULL, 'name', t.target_name));
  spec := spec || jsonb_build_object(
    'whole_row', "trellis"._check_definition(spec),
    'key_map', "trellis"._key_map_kind(spec));
  normalised := "trellis".render_statement(spec->'ast');
  DELETE FROM "trellis".transforms s WHERE s.redefines = t.id;
  IF normalised = t.statement THEN
    UPDATE "trellis".transforms x SET redefinition = NULL WHERE x.id = t.id AND x.redefinition->>'state' = 'building';
    RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
  END IF;
  plan := "trellis"._redefine_plan(t, spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    PERFORM "trellis"._fail('TRC01', format('transform %I cannot be redefined in place: %s', t.target_name,
      (SELECT string_agg(x, '; ') FROM jsonb_array_elements_text(plan->'refused') x)),
      'drop or change those objects first (or DROP TRANSFORM and define it again)');
  END IF;

  v_oid := "trellis"._create_target(cat, shadow_name, spec);
  INSERT INTO "trellis".transforms (target_schema, target_name, target_oid, statement, spec,
                                   aggregates, without_source_index, search_path, redefines)
  VALUES (cat, shadow_name, v_oid, normalised, spec,
          (spec->>'aggregates')::boolean, coalesce((def->>'without_source_index')::boolean, false),
          array_to_string(ARRAY(SELECT quote_ident(s) FROM unnest(current_schemas(false)) AS s), ', '),
          t.id)
  RETURNING id INTO new_id;
  PERFORM "trellis"._register(new_id, spec);
  PERFORM "trellis"._record_read_attrs(new_id);
  PERFORM "trellis"._create_key_map(new_id, spec);
  INSERT INTO "trellis".transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  SELECT new_id, o::int - 1, c->>'name', c->>'expression', c->>'type', c->>'collation',
         (c->>'is_key')::boolean, (c->>'implicit')::boolean, c->'reads'
    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o);
  UPDATE "trellis".transforms x
     SET redefinition = jsonb_build_object('state', 'building', 'statement', normalised,
                                           'since', now(), 'changes', plan->'changes')
   WHERE x.id = t.id;
  RETURN jsonb_build_object('kind', 'redefining', 'target', t.target_name, 'changes', plan->'changes');
END
$fn$;

-- A redefinition given up (its shadow paused, or the switch refused): the shadow goes, the
-- transform keeps its definition and says why (redefinition.state 'failed').
CREATE FUNCTION "trellis"._redefine_abandon(shadow_id int, reason text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  s "trellis".transforms;
BEGIN
  SELECT * INTO s FROM "trellis".transforms x WHERE x.id = shadow_id AND x.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  DELETE FROM "trellis".transforms x WHERE x.id = s.id;
  UPDATE "trellis".transforms x
     SET redefinition = jsonb_build_object('state', 'failed', 'statement', s.statement,
                                           'error', reason, 'at', now())
   WHERE x.id = s.redefines;
END
$fn$;

-- The switch (the staging worker calls it, in a transaction of its own, once the shadow is
-- live). Locks in the drain's order (page slots, pipeline rows, then tables), of the
-- transform, its shadow and every transform reading the target (a chain), so no drain
-- applies to any of them meanwhile; then the target: ACCESS EXCLUSIVE when its columns,
-- key or the engine's indexes change (ALTER TABLE takes it anyway), EXCLUSIVE otherwise (the
-- app's reads go on, seeing the rows as they were until the switch commits). The caller
-- sets a short lock_timeout: a switch waiting on a long reader is tried again, not queued
-- in front of every other reader. Returns {switched, target, changes, deleted, written,
-- lockMs} (switched false, with why, when the shadow is not ready); raises TRC01 when the
-- switch is refused (_redefine_plan, or a reading transform that cannot follow).
CREATE FUNCTION "trellis"._redefine_switch(shadow_id int)
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
                                           'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2))
   WHERE y.id = s.id;
  EXECUTE 'DROP TABLE ' || shadow_rel;
  RETURN jsonb_build_object('switched', true, 'target', t.target_name, 'changes', plan->'changes',
                            'deleted', deleted, 'written', written,
                            'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2));
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;

-- As in 0034, with the transform's last redefinition (redefinition): a redefinition
-- being built, or given up, is said by status(), not only by the logs.
CREATE OR REPLACE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := "trellis".workers();
  -- 0029: the catalog is another database's (restored or cloned), not rebound yet.
  restored text := "trellis"._restore_reason();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
     WHERE src.transform_id = t.id
       AND uc.name = ANY (src.read_columns)
       AND (uc.paused_at IS NOT NULL OR u.paused_at IS NOT NULL)
     ORDER BY 1));
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'node', c.node, 'since', c.since,
           'keysRemaining', CASE WHEN c.keys_total IS NOT NULL
                                 THEN greatest(c.keys_total - c.keys_done, 0) END)
         ORDER BY c.since, c.node), '[]')
    INTO correcting
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
     WHERE u.paused_at IS NOT NULL OR pu.phase <> 'live');

  lifecycle := CASE WHEN t.paused_at IS NOT NULL THEN 'paused' ELSE p.phase END;
  -- Rows that came or went without DML are being re-derived: a build, of a part of it.
  IF lifecycle IN ('live', 'catching_up') AND jsonb_array_length(correcting) > 0 THEN
    lifecycle := 'backfilling';
  END IF;
  -- A live transform reading a paused upstream column, or reading a target that is still
  -- being built, is not keeping up with its sources.
  IF lifecycle = 'live' AND (jsonb_array_length(paused_upstream) > 0 OR upstream_behind) THEN
    lifecycle := 'catching_up';
  END IF;

  -- 0029: a target of a database restored or cloned is not live until it was rebuilt here.
  IF restored IS NOT NULL AND lifecycle <> 'paused' THEN
    lifecycle := 'unverified';
  END IF;

  IF p.cursor_tick IS NOT NULL THEN
    SELECT count(*), extract(epoch FROM clock_timestamp() - min(k.at))::float8
      INTO lag_segments, lag_seconds
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.widened_at IS NOT NULL AND ts.read_columns && src.widen_columns
     ORDER BY ts.ordinal LIMIT 1;
  END IF;
  -- WAL capture published a source and waits out the transactions that began before
  -- (they could write it unpublished) before a backfill reads it (ADR 0023).
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'publish', 'table', src.qualified, 'lockMode', 'none',
             'since', src.wal_since, 'attempts', NULL)
           || "trellis"._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix',
               -- 0034: the same statement for a migration's transaction (no CONCURRENTLY).
               'fixInMigration', regexp_replace(g->>'fix', '^CREATE INDEX CONCURRENTLY ', 'CREATE INDEX '))), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
    'correcting', correcting,
    'captureFailure', CASE WHEN t.capture_failure IS NOT NULL THEN jsonb_build_object(
        'kind', t.capture_failure->'kind', 'error', t.capture_failure->'error',
        'columns', t.capture_failure->'columns',
        'detectedAt', (t.capture_failure->>'detected_at')::timestamptz) END,
    'captureWait', wait,
    'buildFailure', CASE WHEN p.build_attempts > 0 AND p.build_error IS NOT NULL
                          AND p.build_next_at IS NOT NULL THEN jsonb_build_object(
        'attempts', p.build_attempts, 'error', p.build_error,
        'nextAttemptAt', p.build_next_at) END,
    'drainFailure', drain,
    -- 0034: with the build's pace (rate, etaSeconds).
    'backfill', "trellis"._backfill_pace(CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        -- 0028: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END, t.id, p.phase = 'backfilling'),
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0031: the drain time spent on it, and its share of the drain's recent time.
    'drain', "trellis"._drain_share(t.id),
    -- 0035: the last ALTER TRANSFORM ... AS: being built, switched, or given up and why.
    'redefinition', CASE WHEN t.redefinition IS NOT NULL THEN jsonb_build_object(
        'state', t.redefinition->'state', 'statement', t.redefinition->'statement',
        'changes', coalesce(t.redefinition->'changes', '[]'),
        'error', t.redefinition->'error', 'lockMs', t.redefinition->'lockMs',
        'since', t.redefinition->'since', 'at', t.redefinition->'at') END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', CASE WHEN restored IS NOT NULL THEN jsonb_build_object(
        'kind', 'staging_worker',
        'reason', restored || ': the staging worker rebinds its tables by name and rebuilds every transform when it starts')
      ELSE "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                upstream_behind OR jsonb_array_length(paused_upstream) > 0) END,
    -- 0029: the last restore (or clone) recognised, or the one not rebound yet.
    'restored', CASE WHEN restored IS NOT NULL THEN jsonb_build_object('reason', restored, 'detectedAt', NULL)
                     ELSE (SELECT jsonb_build_object('reason', c.restored->>'reason',
                                                     'detectedAt', (c.restored->>'detectedAt')::timestamptz)
                             FROM "trellis".config c WHERE c.restored IS NOT NULL) END);
END
$fn$;

$trellis_m35$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 36) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (36, 'view_subqueries', false);
    EXECUTE $trellis_m36$-- Subqueries in FROM and non-recursive WITH in a view's SQL (issue #26, item 1, second
-- slice; ADR 0056):
--
--   TRANSFORM name AS [WITH cte [(column {, column})] AS [[NOT] MATERIALIZED] (<select>) {, ...}]
--     SELECT ... FROM { table | cte | (<select>) [AS] alias [(column {, column})] } ...
--
-- Each derived table and each WITH query becomes a hidden part: a transform of its own,
-- whose target lives in the target schema as "trellis#<target>#<name>" (nested ones as
-- "trellis#<target>#<outer>.<name>"), maintained as any chain is; the statement around it
-- reads that target as a source. A WITH query referenced twice is one part. The user sees
-- one transform: definitions() lists the parts under it (parts), not as transforms of
-- their own, shows the statement as written (normalised), and DROP TRANSFORM drops them.
--
-- Renamed here and wrapped (so whichever migration wrote them last stays in force for
-- statements without parts): _define -> _define_one, _drop -> _drop_one.
-- Replaced (their latest bodies copied, each change marked "0036"): grammar_parse_view
-- (0028; now a wrapper of a four-argument form taking the WITH queries in scope),
-- render_statement (0028), definitions() (0026). A trigger on transforms (follow_part)
-- carries a part's definition changed in place into its transform's statement.

ALTER FUNCTION "trellis"._define(jsonb, text) RENAME TO _define_one;
ALTER FUNCTION "trellis"._drop(jsonb) RENAME TO _drop_one;

-- A part's transform: the transform whose statement it is a subquery or WITH query of
-- (NULL for the transforms users define), and its name there (the WITH query's name, or
-- the derived table's alias; "outer.inner" when nested).
ALTER TABLE "trellis".transforms ADD COLUMN part_of int;
ALTER TABLE "trellis".transforms ADD COLUMN part_name text;
CREATE INDEX transforms_by_part_of ON "trellis".transforms (part_of) WHERE part_of IS NOT NULL;

-- A subquery in parentheses starting at token i (the "("), parsed as a view's SELECT with
-- the WITH queries `ctes` in scope: (its AST, the token after its ")").
CREATE FUNCTION "trellis".grammar_subselect(
  toks "trellis".grammar_token[], i int, ctes jsonb, OUT ast jsonb, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  sub "trellis".grammar_token[];
BEGIN
  LOOP
    IF toks[k].kind = 'eof' THEN
      PERFORM "trellis".grammar_fail(format(
        'unbalanced brackets: expected ")" to close "(" (character %s), found end of statement',
        toks[i].pos), toks[k].pos);
    END IF;
    IF toks[k].kind = 'punct' AND toks[k].text = '(' THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text = ')' THEN
      d := d - 1;
      EXIT WHEN d = 0;
    END IF;
    k := k + 1;
  END LOOP;
  sub := toks[i + 1 : k - 1] || ROW('eof', '', '', toks[k].pos)::"trellis".grammar_token;
  ast := "trellis".grammar_parse_view(sub, 1, NULL, ctes);
  IF coalesce((ast ->> 'without_source_index')::boolean, false)
     OR coalesce((ast ->> 'without_row_security')::boolean, false) THEN
    PERFORM "trellis".grammar_refuse(
      'WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY go at the end of the statement, not inside a subquery',
      toks[i].pos);
  END IF;
  next := k + 1;
END
$fn$;

-- A parenthesised list of column names at token i: (the names, the token after ")").
CREATE FUNCTION "trellis".grammar_name_list(
  toks "trellis".grammar_token[], i int, what text, OUT names jsonb, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  names := '[]';
  next := i + 1;
  LOOP
    names := names || to_jsonb("trellis".grammar_name(toks[next], what, false));
    next := next + 1;
    EXIT WHEN NOT (toks[next].kind = 'punct' AND toks[next].text = ',');
    next := next + 1;
  END LOOP;
  IF NOT (toks[next].kind = 'punct' AND toks[next].text = ')') THEN
    PERFORM "trellis".grammar_unexpected(toks, next, '"," or ")"');
  END IF;
  next := next + 1;
END
$fn$;

-- An item of a view's FROM clause at token i: a table (as grammar_view_table reads it), a
-- WITH query in scope (`ctes`, by its bare name), or a derived table: (SELECT ...) [AS]
-- alias [(columns)]. For the last two, `part` is the source's part marker and `derived`
-- the derived table's part ({name, kind, columns, ast}).
CREATE FUNCTION "trellis".grammar_view_item(
  toks "trellis".grammar_token[], i int, what text, ctes jsonb,
  OUT schema_name text, OUT rel_name text, OUT alias text, OUT part jsonb, OUT derived jsonb,
  OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  sub jsonb;
  cols jsonb;
BEGIN
  IF toks[i].kind = 'punct' AND toks[i].text = '('
     AND ("trellis".grammar_kw(toks[i + 1], 'select') OR "trellis".grammar_kw(toks[i + 1], 'with')) THEN
    SELECT q.ast, q.next INTO sub, next FROM "trellis".grammar_subselect(toks, i, ctes) q;
    SELECT q.alias, q.next INTO alias, next FROM "trellis".grammar_alias(toks, next) q;
    IF alias IS NULL THEN
      PERFORM "trellis".grammar_refuse('a subquery in FROM needs an alias: write (SELECT ...) AS name',
        toks[i].pos);
    END IF;
    IF toks[next].kind = 'punct' AND toks[next].text = '(' THEN
      SELECT q.names, q.next INTO cols, next
        FROM "trellis".grammar_name_list(toks, next, 'a column name') q;
    END IF;
    rel_name := alias;
    part := jsonb_build_object('part', alias, 'part_kind', 'derived');
    derived := jsonb_build_object('name', alias, 'kind', 'derived', 'columns', coalesce(cols, '[]'),
                                  'ast', sub, 'position', toks[i].pos);
    RETURN;
  END IF;
  IF toks[i].kind = 'punct' AND toks[i].text = '(' AND "trellis".grammar_kw(toks[i + 1], 'values') THEN
    PERFORM "trellis".grammar_refuse('VALUES in FROM is not supported: write a table', toks[i].pos);
  END IF;
  -- A WITH query in scope: a bare name (no schema) naming one.
  IF ctes <> '{}' AND (toks[i].kind = 'ident'
       OR (toks[i].kind = 'word' AND "trellis".grammar_keyword_class(toks[i].value) IS NULL))
     AND NOT (toks[i + 1].kind = 'punct' AND toks[i + 1].text = '.')
     AND ctes ? toks[i].value THEN
    rel_name := toks[i].value;
    SELECT q.alias, q.next INTO alias, next FROM "trellis".grammar_alias(toks, i + 1) q;
    IF toks[next].kind = 'punct' AND toks[next].text = '(' THEN
      PERFORM "trellis".grammar_refuse('column aliases after a WITH query''s alias are not supported yet',
        toks[next].pos);
    END IF;
    part := jsonb_build_object('part', rel_name, 'part_kind', 'cte');
    RETURN;
  END IF;
  SELECT q.schema_name, q.rel_name, q.alias, q.next INTO schema_name, rel_name, alias, next
    FROM "trellis".grammar_view_table(toks, i, what) q;
END
$fn$;

-- 0036: grammar_parse_view (0028) with the WITH queries in scope (`ctes`, a JSON object
-- whose keys are their names). As in 0028, with these changes, each marked "0036": a
-- leading WITH (not RECURSIVE) is read into parts; FROM and JOIN items are read by
-- grammar_view_item (derived tables and WITH queries become parts, marked on the item);
-- the AST carries `parts` when it has any.
CREATE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token := toks[i];
  e int;
  start int;
  sch text;
  nm text;
  alias text;
  jt text;
  expected text;
  from_ jsonb;
  joins jsonb := '[]';
  items jsonb := '[]';
  group_by jsonb := '[]';
  where_ text;
  having_ text;
  distinct_ boolean := false;
  wsi boolean := false;
  wrs boolean := false;
  label text;
  label_expr text;
  last "trellis".grammar_token;
  before "trellis".grammar_token;
  -- 0036
  parts jsonb := '[]';
  cte_name text;
  cte_cols jsonb;
  cte_pos int;
  sub jsonb;
  part jsonb;
  derived jsonb;
BEGIN
  IF "trellis".grammar_kw(t, 'with') THEN
    IF "trellis".grammar_kw(toks[i + 1], 'recursive') THEN
      PERFORM "trellis".grammar_refuse('a recursive WITH clause (WITH RECURSIVE) is not supported', t.pos);
    END IF;
    -- 0036: WITH name [(columns)] AS [[NOT] MATERIALIZED] (<select>) {, ...}: each a part,
    -- in scope for the queries after it and for the SELECT.
    i := i + 1;
    LOOP
      cte_pos := toks[i].pos;
      cte_name := "trellis".grammar_name(toks[i], 'a WITH query name', true);
      i := i + 1;
      cte_cols := NULL;
      IF toks[i].kind = 'punct' AND toks[i].text = '(' THEN
        SELECT q.names, q.next INTO cte_cols, i
          FROM "trellis".grammar_name_list(toks, i, 'a column name') q;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i], 'as') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'AS and the WITH query in parentheses');
      END IF;
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'not') AND "trellis".grammar_kw(toks[i + 1], 'materialized') THEN
        i := i + 2;
      ELSIF "trellis".grammar_kw(toks[i], 'materialized') THEN
        i := i + 1;
      END IF;
      IF NOT (toks[i].kind = 'punct' AND toks[i].text = '(') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, '"(" and the WITH query');
      END IF;
      IF NOT ("trellis".grammar_kw(toks[i + 1], 'select') OR "trellis".grammar_kw(toks[i + 1], 'with')) THEN
        PERFORM "trellis".grammar_refuse(
          'a WITH query that is not a SELECT (INSERT, UPDATE, DELETE, VALUES) is not supported',
          toks[i + 1].pos);
      END IF;
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(parts) p WHERE p->>'name' = cte_name) THEN
        PERFORM "trellis".grammar_fail(format('WITH query name %s is given more than once', cte_name),
          cte_pos);
      END IF;
      SELECT q.ast, q.next INTO sub, i FROM "trellis".grammar_subselect(toks, i, ctes) q;
      parts := parts || jsonb_build_array(jsonb_build_object(
        'name', cte_name, 'kind', 'cte', 'columns', coalesce(cte_cols, '[]'), 'ast', sub,
        'position', cte_pos));
      ctes := ctes || jsonb_build_object(cte_name, true);
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    t := toks[i];
    IF NOT "trellis".grammar_kw(t, 'select') THEN
      PERFORM "trellis".grammar_unexpected(toks, i, '",", or SELECT after the WITH queries');
    END IF;
  ELSIF t.kind = 'punct' AND t.text = '(' THEN
    PERFORM "trellis".grammar_refuse(
      'a SELECT in parentheses is not supported yet: write it without them', t.pos);
  ELSIF "trellis".grammar_kw(t, 'values') OR "trellis".grammar_kw(t, 'table') THEN
    PERFORM "trellis".grammar_refuse(format('%s is not supported: write a SELECT', upper(t.value)),
      t.pos);
  ELSIF NOT "trellis".grammar_kw(t, 'select') THEN
    PERFORM "trellis".grammar_unexpected(toks, i, 'SELECT after AS');
  END IF;
  i := i + 1;
  IF "trellis".grammar_kw(toks[i], 'distinct') THEN
    IF "trellis".grammar_kw(toks[i + 1], 'on') THEN
      PERFORM "trellis".grammar_refuse('DISTINCT ON is not supported yet', toks[i].pos);
    END IF;
    distinct_ := true;
    i := i + 1;
  ELSIF "trellis".grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  -- The SELECT list, as in the FROM-first form (0024).
  LOOP
    start := i;
    e := "trellis".grammar_scan(toks, i);
    IF e = start THEN
      PERFORM "trellis".grammar_view_clause(toks, e);
      PERFORM "trellis".grammar_unexpected(toks, e, 'a select item');
    END IF;
    IF (e = start + 1 AND toks[start].text = '*')
      OR (e >= start + 2 AND toks[e - 1].text = '*' AND toks[e - 2].kind = 'punct'
          AND toks[e - 2].text = '.') THEN
      PERFORM "trellis".grammar_fail(format(
        'name each column: SELECT * is not supported (expected an expression, found %s)',
        "trellis".grammar_describe(toks[e - 1])), toks[start].pos);
    END IF;
    nm := NULL;
    label := NULL;
    label_expr := NULL;
    IF "trellis".grammar_kw(toks[e], 'as') THEN
      nm := "trellis".grammar_name(toks[e + 1], 'a column name after AS', false);
      i := e + 2;
    ELSE
      i := e;
      IF e >= start + 2 THEN
        last := toks[e - 1];
        before := toks[e - 2];
        IF (last.kind = 'ident'
            OR (last.kind = 'word' AND "trellis".grammar_keyword_class(last.value) IS NULL))
          AND before.kind <> 'op'
          AND NOT (before.kind = 'punct' AND before.text IN ('.', '::')) THEN
          label := "trellis".grammar_name(last, 'a column name', false);
          label_expr := "trellis".grammar_text(toks, start, e - 1);
        END IF;
      END IF;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', "trellis".grammar_text(toks, start, e), 'name', nm, 'bare_label', label,
      'label_expr', label_expr, 'position', toks[start].pos));
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;

  IF NOT "trellis".grammar_kw(toks[i], 'from') THEN
    PERFORM "trellis".grammar_view_clause(toks, i);
    PERFORM "trellis".grammar_unexpected(toks, i, '",", or FROM and the tables');
  END IF;
  -- 0036: a table, a WITH query or a derived table.
  SELECT q.schema_name, q.rel_name, q.alias, q.part, q.derived, q.next
    INTO sch, nm, alias, part, derived, i
    FROM "trellis".grammar_view_item(toks, i + 1, 'a source table name', ctes) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias) || coalesce(part, '{}');
  IF derived IS NOT NULL THEN
    parts := parts || jsonb_build_array(derived);
  END IF;

  LOOP
    t := toks[i];
    IF t.kind = 'punct' AND t.text = ',' THEN
      PERFORM "trellis".grammar_refuse(
        'a comma-separated FROM list (FROM a, b) is not supported yet: write JOIN ... ON', t.pos);
    ELSIF t.kind = 'word' AND t.value IN ('right', 'full')
      AND ("trellis".grammar_kw(toks[i + 1], 'join') OR "trellis".grammar_kw(toks[i + 1], 'outer')) THEN
      PERFORM "trellis".grammar_refuse(format('a %s JOIN is not supported yet', upper(t.value)), t.pos);
    ELSIF "trellis".grammar_kw(t, 'cross') AND "trellis".grammar_kw(toks[i + 1], 'join') THEN
      PERFORM "trellis".grammar_refuse('CROSS JOIN is not supported yet', t.pos);
    ELSIF "trellis".grammar_kw(t, 'natural') THEN
      PERFORM "trellis".grammar_refuse('NATURAL JOIN is not supported yet: write JOIN ... ON', t.pos);
    ELSIF "trellis".grammar_kw(t, 'join') THEN
      jt := 'inner';
      i := i + 1;
    ELSIF "trellis".grammar_kw(t, 'inner') THEN
      IF NOT "trellis".grammar_kw(toks[i + 1], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1, 'JOIN after INNER');
      END IF;
      jt := 'inner';
      i := i + 2;
    ELSIF "trellis".grammar_kw(t, 'left') AND coalesce(toks[i + 1].text, '') <> '(' THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'outer') THEN
        i := i + 1;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'JOIN after LEFT');
      END IF;
      jt := 'left';
      i := i + 1;
    ELSE
      EXIT;
    END IF;
    -- 0036: a table, a WITH query or a derived table.
    SELECT q.schema_name, q.rel_name, q.alias, q.part, q.derived, q.next
      INTO sch, nm, alias, part, derived, i
      FROM "trellis".grammar_view_item(toks, i, 'a table name after JOIN', ctes) q;
    IF derived IS NOT NULL THEN
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(parts) p
                  WHERE p->>'kind' = 'derived' AND p->>'name' = derived->>'name') THEN
        PERFORM "trellis".grammar_fail(format('table name %s is given more than once', derived->>'name'),
          (derived->>'position')::int);
      END IF;
      parts := parts || jsonb_build_array(derived);
    END IF;
    IF "trellis".grammar_kw(toks[i], 'using') THEN
      PERFORM "trellis".grammar_refuse('JOIN ... USING is not supported yet: write ON', toks[i].pos);
    END IF;
    IF NOT "trellis".grammar_kw(toks[i], 'on') THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'ON and a join condition');
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', "trellis".grammar_text(toks, i, e)) || coalesce(part, '{}'));
    i := e;
  END LOOP;
  expected := 'JOIN, WHERE, GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';

  IF "trellis".grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'group') AND "trellis".grammar_kw(toks[i + 1], 'by') THEN
    IF distinct_ THEN
      PERFORM "trellis".grammar_refuse('SELECT DISTINCT with GROUP BY is not supported yet', toks[i].pos);
    END IF;
    i := i + 2;
    IF "trellis".grammar_kw(toks[i], 'all') THEN
      PERFORM "trellis".grammar_fail(format(
        'GROUP BY ALL is not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    IF "trellis".grammar_kw(toks[i], 'distinct') THEN
      PERFORM "trellis".grammar_fail(format(
        'grouping sets are not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    LOOP
      IF (("trellis".grammar_kw(toks[i], 'rollup') OR "trellis".grammar_kw(toks[i], 'cube'))
          AND toks[i + 1].text = '(')
        OR ("trellis".grammar_kw(toks[i], 'grouping') AND "trellis".grammar_kw(toks[i + 1], 'sets'))
        OR (toks[i].text = '(' AND toks[i + 1].text = ')')
      THEN
        PERFORM "trellis".grammar_fail(format(
          'grouping sets are not supported: expected a GROUP BY expression, found %s',
          "trellis".grammar_describe(toks[i])), toks[i].pos);
      END IF;
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'a GROUP BY expression');
      END IF;
      group_by := group_by || jsonb_build_array("trellis".grammar_text(toks, i, e));
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'having') THEN
    IF distinct_ THEN
      PERFORM "trellis".grammar_refuse('SELECT DISTINCT with HAVING is not supported yet', toks[i].pos);
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  -- A set operation or a WINDOW clause here is refused by name before ORDER BY is read.
  PERFORM "trellis".grammar_view_clause(toks, i);

  -- ORDER BY: read, and dropped (a table has no order; ADR 0049). Its expressions are not
  -- checked: they never run.
  IF "trellis".grammar_kw(toks[i], 'order') AND "trellis".grammar_kw(toks[i + 1], 'by') THEN
    i := i + 2;
    LOOP
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'an ORDER BY expression');
      END IF;
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  PERFORM "trellis".grammar_view_clause(toks, i);

  -- WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY, each at most once, in either order.
  WHILE "trellis".grammar_kw(toks[i], 'without') LOOP
    IF "trellis".grammar_kw(toks[i + 1], 'source') AND NOT wsi THEN
      IF NOT "trellis".grammar_kw(toks[i + 2], 'index') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'INDEX after WITHOUT SOURCE');
      END IF;
      wsi := true;
    ELSIF "trellis".grammar_kw(toks[i + 1], 'row') AND NOT wrs THEN
      IF NOT "trellis".grammar_kw(toks[i + 2], 'security') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'SECURITY after WITHOUT ROW');
      END IF;
      wrs := true;
    ELSE
      PERFORM "trellis".grammar_unexpected(toks, i + 1, CASE
        WHEN wsi THEN 'ROW SECURITY after WITHOUT' WHEN wrs THEN 'SOURCE INDEX after WITHOUT'
        ELSE 'SOURCE INDEX or ROW SECURITY after WITHOUT' END);
    END IF;
    i := i + 3;
    expected := CASE WHEN wsi AND wrs THEN 'end of statement'
      WHEN wsi THEN 'WITHOUT ROW SECURITY or end of statement'
      ELSE 'WITHOUT SOURCE INDEX or end of statement' END;
  END LOOP;

  PERFORM "trellis".grammar_end(toks, i, expected);
  RETURN jsonb_build_object(
    'kind', 'transform', 'form', 'as', 'target', target, 'from', from_, 'joins', joins,
    'select', items, 'where', where_, 'group_by', group_by, 'having', having_,
    'without_source_index', wsi)
    || CASE WHEN distinct_ THEN jsonb_build_object('distinct', true) ELSE '{}' END
    || CASE WHEN wrs THEN jsonb_build_object('without_row_security', true) ELSE '{}' END
    -- 0036
    || CASE WHEN jsonb_array_length(parts) > 0 THEN jsonb_build_object('parts', parts) ELSE '{}' END;
END
$fn$;

-- 0028's three-argument form: the statement's own SELECT, no WITH query in scope.
CREATE OR REPLACE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb
) RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT "trellis".grammar_parse_view(toks, i, target, '{}'::jsonb)
$fn$;

-- A FROM or JOIN item of a view's AST as written: a table, a WITH query by its name, or a
-- derived table in parentheses (found among the AST's parts).
CREATE FUNCTION "trellis"._render_view_item(ast jsonb, item jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  p jsonb;
BEGIN
  IF item->>'part_kind' = 'derived' THEN
    SELECT x INTO p FROM jsonb_array_elements(ast->'parts') x
     WHERE x->>'kind' = 'derived' AND x->>'name' = item->>'part';
    RETURN '(' || "trellis"._render_view_select(p->'ast') || ') AS ' || quote_ident(p->>'name')
      || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o)
                             FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o)) || ')', '');
  ELSIF item->>'part_kind' = 'cte' THEN
    RETURN quote_ident(item->>'part')
      || CASE WHEN coalesce((item->>'alias_implicit')::boolean, false) THEN ''
              ELSE coalesce(' AS ' || quote_ident(item->>'alias'), '') END;
  END IF;
  RETURN "trellis".grammar_render_name(item->>'schema', item->>'name')
    || coalesce(' AS ' || quote_ident(item->>'alias'), '');
END
$fn$;

-- A view's SELECT (an AS form AST, with parts) as written, normalised: its WITH queries,
-- derived tables in place, no target, no trailing options. Also what Postgres is asked to
-- check the statement as a whole.
CREATE FUNCTION "trellis"._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  is_distinct boolean := coalesce((ast ->> 'distinct')::boolean, false);
  with_ text;
BEGIN
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  RETURN coalesce(with_, '')
    || 'SELECT ' || CASE WHEN is_distinct THEN 'DISTINCT ' ELSE '' END || (
         SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
                           ', ' ORDER BY ordinality)
           FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY)
    || ' FROM ' || "trellis"._render_view_item(ast, ast->'from')
    || coalesce((
         SELECT string_agg(
                  CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
                  || "trellis"._render_view_item(ast, j) || ' ON ' || (j ->> 'on'), '' ORDER BY o)
           FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '')
    || coalesce(' WHERE ' || (ast ->> 'where'), '')
    || CASE WHEN is_distinct THEN '' ELSE coalesce(' GROUP BY ' || (
         SELECT string_agg(value, ', ' ORDER BY ordinality)
           FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '') END
    || coalesce(' HAVING ' || (ast ->> 'having'), '');
END
$fn$;

-- 0036: render_statement as in 0028, and a view's SQL with parts (WITH queries, derived
-- tables) rendered as it was written, by _render_view_select.
CREATE OR REPLACE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  is_distinct boolean := coalesce((ast ->> 'distinct')::boolean, false);
  target text;
  select_ text;
  from_ text;
  rest text;
BEGIN
  IF ast ->> 'kind' IS DISTINCT FROM 'transform'
     OR (ast ->> 'form' IS DISTINCT FROM 'as' AND NOT is_distinct) THEN
    RETURN "trellis".grammar_render_from_first(ast);
  END IF;
  target := "trellis".grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name');
  -- 0036: a statement with parts.
  IF jsonb_array_length(coalesce(ast -> 'parts', '[]')) > 0 THEN
    RETURN 'TRANSFORM ' || target || ' AS ' || "trellis"._render_view_select(ast)
      || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
      || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  END IF;
  select_ := 'SELECT ' || CASE WHEN is_distinct THEN 'DISTINCT ' ELSE '' END || (
    SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
      ', ' ORDER BY ordinality)
    FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY);
  from_ := 'FROM '
    || "trellis".grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
    || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '')
    || coalesce((
      SELECT string_agg(
               CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
               || "trellis".grammar_render_name(j ->> 'schema', j ->> 'name')
               || coalesce(' AS ' || quote_ident(j ->> 'alias'), '')
               || ' ON ' || (j ->> 'on'), '' ORDER BY o)
        FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '');
  rest := coalesce(' WHERE ' || (ast ->> 'where'), '')
    -- SELECT DISTINCT's GROUP BY is the engine's (filled in by _analyze_transform).
    || CASE WHEN is_distinct THEN '' ELSE coalesce(' GROUP BY ' || (
         SELECT string_agg(value, ', ' ORDER BY ordinality)
           FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '') END
    || coalesce(' HAVING ' || (ast ->> 'having'), '')
    || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  RETURN 'TRANSFORM ' || target || CASE WHEN ast ->> 'form' = 'as'
    THEN ' AS ' || select_ || ' ' || from_ ELSE ' ' || from_ || ' ' || select_ END || rest;
END
$fn$;

-- A FROM or JOIN item naming a part, bound to the part's hidden target (in `scope`:
-- "<kind>:<name>" -> target name); any other item as it is. A WITH query written without
-- an alias is read under its own name.
CREATE FUNCTION "trellis"._bind_part_item(item jsonb, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  hidden text;
BEGIN
  IF item->>'part' IS NULL THEN
    RETURN item;
  END IF;
  hidden := scope->>((item->>'part_kind') || ':' || (item->>'part'));
  IF hidden IS NULL THEN
    PERFORM "trellis"._fail('TRV01', format('the %s %I is not in scope here',
      CASE item->>'part_kind' WHEN 'cte' THEN 'WITH query' ELSE 'subquery' END, item->>'part'));
  END IF;
  RETURN item || jsonb_build_object(
    'schema', (SELECT c.target_schema FROM "trellis".config c)::text, 'name', hidden,
    'alias', coalesce(item->>'alias', item->>'part'),
    'alias_implicit', item->>'alias' IS NULL);
END
$fn$;

-- Whether an expression is one call of count() (with or without FILTER), which is never
-- NULL: a part's column so made is declared NOT NULL, so that a GROUP BY of it around the
-- part (an aggregate over an aggregate, TPC-H Q13's c_count) is a key that is never NULL.
CREATE FUNCTION "trellis"._is_count_call(expr text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(expr);
  n int := array_length(toks, 1);
  close_at int;
BEGIN
  IF NOT ("trellis".grammar_kw(toks[1], 'count') AND toks[2].kind = 'punct' AND toks[2].text = '(') THEN
    RETURN false;
  END IF;
  close_at := "trellis"._closing_token(toks, 2);
  IF close_at IS NULL THEN
    RETURN false;
  END IF;
  IF "trellis".grammar_kw(toks[close_at + 1], 'filter') THEN
    close_at := "trellis"._closing_token(toks, close_at + 2);
  END IF;
  RETURN close_at IS NOT NULL AND toks[close_at + 1].kind = 'eof' AND close_at + 1 = n;
EXCEPTION WHEN SQLSTATE 'TRP01' THEN
  RETURN false;
END
$fn$;

-- Defines the parts of a view's AST (its WITH queries, then its derived tables, each
-- after the parts inside it) as hidden transforms of `root`, and returns
-- {ast: the AST with its FROM and JOIN items bound to their targets, ids: [part ids]}.
-- `path` prefixes the parts' names (nested ones), `scope` holds the WITH queries of the
-- enclosing queries.
CREATE FUNCTION "trellis"._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
  part jsonb;
  sub jsonb;
  res jsonb;
  ids jsonb := '[]';
  hidden text;
  what text;
  cols jsonb;
  item jsonb;
  info jsonb;
  spec jsonb;
  part_id int;
  k int;
BEGIN
  FOR part IN SELECT value FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) LOOP
    what := CASE part->>'kind' WHEN 'cte' THEN format('WITH query %I', part->>'name')
                               ELSE format('subquery %I in FROM', part->>'name') END;
    hidden := 'trellis#' || root || '#' || path || (part->>'name');
    IF octet_length(hidden) > 63 THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the %s is kept in a hidden target named %s, longer than 63 bytes: give it, or the transform, a shorter name',
        what, hidden));
    END IF;
    -- A table of that reserved name that no transform keeps is a part's target loaded
    -- from a schema dump (restore_definition defines the statement again): the part makes
    -- its own, and builds it.
    IF to_regclass(quote_ident(tschema) || '.' || quote_ident(hidden)) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM "trellis".transforms t
                        WHERE t.target_schema = tschema AND t.target_name = hidden) THEN
      EXECUTE format('DROP TABLE %I.%I', tschema, hidden);
    END IF;
    res := "trellis"._define_parts(part->'ast', root, path || (part->>'name') || '.', scope);
    ids := ids || (res->'ids');
    sub := res->'ast';
    -- Column aliases name the part's columns, in order; Postgres refuses more of them than
    -- columns (the statement was checked whole before this).
    cols := coalesce(part->'columns', '[]');
    IF jsonb_array_length(cols) > jsonb_array_length(sub->'select') THEN
      PERFORM "trellis"._fail('TRV01', format('the %s has %s columns available but %s columns specified',
        what, jsonb_array_length(sub->'select'), jsonb_array_length(cols)));
    END IF;
    FOR k IN 0 .. jsonb_array_length(cols) - 1 LOOP
      item := sub->'select'->k;
      -- A bare label (`count(*) n`) gives way to the alias: the expression without it, when
      -- Postgres reads it as a label (as _distinct_groups decides it).
      IF item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL THEN
        info := "trellis"._analyze_query('SELECT ' || (item->>'expr') || ' FROM ' || "trellis"._view_from_sql(sub),
          format('in the %s, SELECT item %s (%s)', what, k + 1, item->>'expr'));
        IF info->'columns'->0->>'name' = item->>'bare_label' THEN
          item := item || jsonb_build_object('expr', item->>'label_expr');
        END IF;
      END IF;
      item := item || jsonb_build_object('name', cols->>k, 'bare_label', NULL, 'label_expr', NULL);
      sub := jsonb_set(sub, ARRAY['select', k::text], item);
    END LOOP;
    sub := sub || jsonb_build_object('target', jsonb_build_object('schema', NULL, 'name', hidden),
                                     'without_source_index', coalesce((ast->>'without_source_index')::boolean, false))
               || CASE WHEN (ast->>'without_row_security')::boolean
                       THEN jsonb_build_object('without_row_security', true) ELSE '{}' END;
    PERFORM "trellis"._define_one(sub, NULL);
    SELECT t.id, t.spec INTO part_id, spec FROM "trellis".transforms t
     WHERE t.target_schema = tschema AND t.target_name = hidden;
    -- Its count() columns are never NULL: declared so, a GROUP BY of one around it is a key.
    IF (spec->>'aggregates')::boolean THEN
      FOR item IN SELECT c FROM jsonb_array_elements(spec->'columns') c
                   WHERE NOT (c->>'is_key')::boolean AND c->>'type' = 'bigint'
                     AND "trellis"._is_count_call(c->>'expression') LOOP
        EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET NOT NULL', tschema, hidden, item->>'name');
        -- Recorded in its spec too: a target made again from it (a halt's repair) says so.
        UPDATE "trellis".transforms t
           SET spec = jsonb_set(t.spec, '{columns}', (
                 SELECT jsonb_agg(CASE WHEN c->>'name' = item->>'name'
                                       THEN c || '{"notnull": true}' ELSE c END ORDER BY o)
                   FROM jsonb_array_elements(t.spec->'columns') WITH ORDINALITY AS x(c, o)))
         WHERE t.id = part_id;
      END LOOP;
    END IF;
    -- The statement around it reads the part's target as a source: by a key that is
    -- never NULL (a primary key).
    IF jsonb_array_length(spec->'key') = 0 THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the %s aggregates without GROUP BY (one row, no key): a subquery of one row is not supported yet (a scalar subquery is a later slice)',
        what));
    END IF;
    IF (spec->>'key_nullable')::boolean THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the %s is keyed by (%s), which can be NULL (a LEFT JOIN''s side, or a GROUP BY of a column that is not NOT NULL): the statement around a subquery reads its rows by a key that is never NULL. Group by columns declared NOT NULL (or filter the NULLs out and coalesce the column)',
        what, (SELECT string_agg(k2, ', ') FROM jsonb_array_elements_text(spec->'key') k2)));
    END IF;
    UPDATE "trellis".transforms SET part_name = path || (part->>'name') WHERE id = part_id;
    ids := ids || to_jsonb(part_id);
    scope := scope || jsonb_build_object((part->>'kind') || ':' || (part->>'name'), hidden);
  END LOOP;
  ast := jsonb_set(ast, '{from}', "trellis"._bind_part_item(ast->'from', scope));
  ast := jsonb_set(ast, '{joins}', coalesce((
    SELECT jsonb_agg("trellis"._bind_part_item(j, scope) ORDER BY o)
      FROM jsonb_array_elements(coalesce(ast->'joins', '[]')) WITH ORDINALITY AS x(j, o)), '[]'));
  RETURN jsonb_build_object('ast', ast, 'ids', ids);
END
$fn$;

-- Refuses a subquery in the expressions of a view's SELECT with parts (as written, its
-- WITH queries in scope), naming the clause it is in, as _refuse_view_sql (0028) does for a
-- statement without parts.
CREATE FUNCTION "trellis"._refuse_view_sublinks(ast jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  base jsonb := ast || jsonb_build_object(
    'select', jsonb_build_array(jsonb_build_object('expr', '1', 'name', 'x')),
    'where', NULL, 'group_by', '[]'::jsonb, 'having', NULL, 'distinct', false);
  grouped jsonb;
  clause text;
BEGIN
  IF NOT coalesce(("trellis"._view_parse("trellis"._render_view_select(ast)) ->> 'has_sublinks')::boolean, false) THEN
    RETURN;
  END IF;
  grouped := base || jsonb_build_object('group_by', coalesce(ast->'group_by', '[]'));
  clause := CASE
    WHEN ("trellis"._view_parse("trellis"._render_view_select(base)) ->> 'has_sublinks')::boolean
      THEN 'a join condition (ON)'
    WHEN ast->>'where' IS NOT NULL AND ("trellis"._view_parse("trellis"._render_view_select(
        base || jsonb_build_object('where', ast->>'where'))) ->> 'has_sublinks')::boolean
      THEN 'WHERE'
    WHEN jsonb_array_length(coalesce(ast->'group_by', '[]')) > 0
      AND ("trellis"._view_parse("trellis"._render_view_select(grouped)) ->> 'has_sublinks')::boolean
      THEN 'GROUP BY'
    WHEN ast->>'having' IS NOT NULL AND ("trellis"._view_parse("trellis"._render_view_select(
        grouped || jsonb_build_object('having', ast->>'having'))) ->> 'has_sublinks')::boolean
      THEN 'HAVING'
    ELSE 'the SELECT list' END;
  PERFORM "trellis"._fail('TRV01', format('a subquery in %s is not supported yet', clause));
END
$fn$;

-- TRANSFORM: a statement with parts (derived tables, WITH queries) is checked whole by
-- Postgres, its parts defined as hidden transforms, then the statement around them, which
-- reads their targets; every other statement as before (_define_one). Names starting
-- with trellis# are the engine's own.
CREATE FUNCTION "trellis"._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
  tname text := ast->'target'->>'name';
  res jsonb;
  result jsonb;
BEGIN
  IF starts_with(tname, 'trellis#') THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): choose another target name',
      tname));
  END IF;
  IF jsonb_array_length(coalesce(ast->'parts', '[]')) = 0 THEN
    RETURN "trellis"._define_one(ast, statement);
  END IF;
  IF EXISTS (SELECT 1 FROM "trellis".transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM "trellis"._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  -- Postgres reads the statement as written first: names, column aliases, scopes.
  PERFORM "trellis"._analyze_query("trellis"._render_view_select(ast), 'in the definition');
  PERFORM "trellis"._refuse_view_sublinks(ast);
  res := "trellis"._define_parts(ast, tname, '', '{}');
  result := "trellis"._define_one(res->'ast', statement);
  UPDATE "trellis".transforms p SET part_of = t.id
    FROM "trellis".transforms t
   WHERE t.target_schema = tschema AND t.target_name = tname
     AND p.id IN (SELECT (x)::int FROM jsonb_array_elements_text(res->'ids') x);
  RETURN result;
END
$fn$;

-- DROP TRANSFORM: the transform, then its parts (the last defined first: a part may read
-- an earlier one). A part is dropped only with its transform.
CREATE FUNCTION "trellis"._drop(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  parts text[];
  p text;
  result jsonb;
BEGIN
  IF t.part_of IS NOT NULL THEN
    PERFORM "trellis"._fail('TRC01', format(
      '%I is part of transform %I (its %s): DROP TRANSFORM %I drops it', t.target_name,
      (SELECT o.target_name FROM "trellis".transforms o WHERE o.id = t.part_of), t.part_name,
      (SELECT o.target_name FROM "trellis".transforms o WHERE o.id = t.part_of)));
  END IF;
  parts := ARRAY(SELECT x.target_name FROM "trellis".transforms x WHERE x.part_of = t.id ORDER BY x.id DESC);
  result := "trellis"._drop_one(ast);
  FOREACH p IN ARRAY parts LOOP
    PERFORM "trellis"._drop_one(jsonb_build_object('kind', 'drop', 'transform', p));
  END LOOP;
  RETURN result;
END
$fn$;

-- 0036: definitions() as in 0026, without the parts of a transform as transforms of their
-- own: each transform with parts lists them (parts: [{name, target, statement, key,
-- maintenance, sourceIndexGaps}], in the order they were defined).
CREATE OR REPLACE FUNCTION "trellis".definitions()
RETURNS SETOF jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object(
           'target', t.target_name,
           'targetSchema', t.target_schema,
           'statement', t.statement,
           'sources', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'table', s.source_schema || '.' || s.source_name, 'alias', s.alias,
                      'join', s.join_type, 'keyColumns', to_jsonb(s.key_columns))
                    ORDER BY s.ordinal)
               FROM "trellis".transform_sources s WHERE s.transform_id = t.id), '[]'),
           'columns', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'type', c.type, 'expression', c.expression,
                      'key', c.is_key, 'implicit', c.implicit)
                    ORDER BY c.ordinal)
               FROM "trellis".transform_columns c WHERE c.transform_id = t.id), '[]'),
           'options', jsonb_build_object(
             'withoutSourceIndex', t.without_source_index,
             'withoutRowSecurity', coalesce((t.spec->'ast'->>'without_row_security')::boolean, false)),
           'settings', t.settings,
           'aggregates', t.aggregates,
           'maintenance', "trellis"._maintenance(t.aggregates, t.delta),
           'createdAt', t.created_at,
           'updatedAt', t.updated_at)
         -- 0036
         || CASE WHEN EXISTS (SELECT 1 FROM "trellis".transforms p WHERE p.part_of = t.id)
              THEN jsonb_build_object('parts', (
                SELECT jsonb_agg(jsonb_build_object(
                         'name', p.part_name, 'target', p.target_name, 'statement', p.statement,
                         'key', to_jsonb(ARRAY(SELECT c.name::text FROM "trellis".transform_columns c
                                                WHERE c.transform_id = p.id AND c.is_key ORDER BY c.ordinal)),
                         'maintenance', "trellis"._maintenance(p.aggregates, p.delta),
                         -- The source indexes its changes are found by, as status() shows a
                         -- transform's: a part has no status() of its own in the lists.
                         'sourceIndexGaps', (
                           SELECT coalesce(jsonb_agg(jsonb_build_object(
                                    'table', g->'table', 'columns', g->'columns', 'role', g->'role',
                                    'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
                             FROM jsonb_array_elements("trellis".source_index_gaps(p.id)) g))
                       ORDER BY p.id)
                  FROM "trellis".transforms p WHERE p.part_of = t.id))
              ELSE '{}'::jsonb END
    FROM "trellis".transforms t
   -- 0035: a redefinition being built is not a transform of its own either.
   WHERE t.part_of IS NULL AND t.redefines IS NULL
   ORDER BY t.target_name
$fn$;

-- A part's definition changed in place (a source or column rename followed, ADR 0047; a
-- RESUME that bound it again): the transform's own statement shows the part as it is now.
-- The part's AST (its parts inside it kept as the transform records them) replaces the
-- one the transform recorded for it, and the statement is rendered again.
CREATE FUNCTION "trellis"._follow_part()
RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
  root "trellis".transforms;
  nm text;
  idx int;
  path text[] := ARRAY['ast'];
  cur jsonb;
  new_ast jsonb;
  new_spec jsonb;
BEGIN
  SELECT * INTO root FROM "trellis".transforms WHERE id = NEW.part_of;
  IF NOT FOUND OR NEW.part_name IS NULL THEN
    RETURN NULL;
  END IF;
  FOREACH nm IN ARRAY string_to_array(NEW.part_name, '.') LOOP
    SELECT o::int - 1 INTO idx
      FROM jsonb_array_elements(coalesce(root.spec #> (path || 'parts'::text), '[]')) WITH ORDINALITY AS x(p, o)
     WHERE p->>'name' = nm LIMIT 1;
    IF idx IS NULL THEN
      RETURN NULL;
    END IF;
    path := path || ARRAY['parts', idx::text, 'ast'];
  END LOOP;
  cur := root.spec #> path;
  new_ast := (NEW.spec->'ast') - 'target' - 'without_source_index' - 'without_row_security' - 'parts'
    || CASE WHEN cur ? 'parts' THEN jsonb_build_object('parts', cur->'parts') ELSE '{}' END;
  IF new_ast = cur THEN
    RETURN NULL;
  END IF;
  new_spec := jsonb_set(root.spec, path, new_ast);
  UPDATE "trellis".transforms
     SET spec = new_spec, statement = "trellis".render_statement(new_spec->'ast'), updated_at = now()
   WHERE id = root.id;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER follow_part AFTER UPDATE OF spec ON "trellis".transforms
  FOR EACH ROW WHEN (NEW.part_of IS NOT NULL AND NEW.spec IS DISTINCT FROM OLD.spec)
  EXECUTE FUNCTION "trellis"._follow_part();

-- ALTER TRANSFORM ... AS (0035) redefines a transform through one shadow transform; a
-- statement with parts is several. Until redefinitions build parts too, a statement with
-- parts, or a transform that has some (or is one), is refused by name: DROP TRANSFORM and
-- TRANSFORM again (or change the parts' sources) instead.
ALTER FUNCTION "trellis"._redefine(jsonb) RENAME TO _redefine_one;

CREATE FUNCTION "trellis"._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
BEGIN
  IF t.part_of IS NOT NULL THEN
    PERFORM "trellis"._fail('TRC01', format(
      '%I is part of transform %I (its %s): ALTER TRANSFORM %I AS redefines the whole statement',
      t.target_name, (SELECT o.target_name FROM "trellis".transforms o WHERE o.id = t.part_of),
      t.part_name, (SELECT o.target_name FROM "trellis".transforms o WHERE o.id = t.part_of)));
  END IF;
  IF jsonb_array_length(coalesce(ast->'definition'->'parts', '[]')) > 0
     OR EXISTS (SELECT 1 FROM "trellis".transforms p WHERE p.part_of = t.id) THEN
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I cannot be redefined in place to or from a statement with subqueries in FROM or WITH queries yet',
      t.target_name), 'DROP TRANSFORM it and define it again');
  END IF;
  RETURN "trellis"._redefine_one(ast);
END
$fn$;
$trellis_m36$;
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
