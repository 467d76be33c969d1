-- Aggregates kept by delta over a join that fans out (issue #22 item 1; ADR 0067).
--
-- A GROUP BY over a join that multiplies rows keeps a shadow of its sources as its key map
-- (0033, ADR 0051), and was kept by group recompute whatever its aggregates: a delta needed
-- each join row's old inputs, which a shadow does not keep per join row. They are now
-- computed from it by the delta rule of a join (drain/shadow-sql.ts, shadowSignedRows):
-- each changed occurrence's old rows (the shadow's, signed -1) and new rows (the source's,
-- +1) joined with the occurrences before it as they are after the change and those after
-- it as they were before. Such a transform, when every aggregate has an exact delta
-- (0026), keeps both the shadow and the group state table of ADR 0044 (groups_<id>).
--
-- An inner join only: a LEFT JOIN's NULL-extended rows are not a sum of its sources' rows
-- (a row losing its last match gains one), so a fan-out join with a LEFT JOIN keeps the
-- group recompute, and its classification says why.
--
-- Renamed here and wrapped: _make_key_map -> _make_key_map_before_fanout (every case but
-- the one above goes straight through to it). The group state table's creation, which
-- 0033's _make_key_map does inline, is a function of its own here (_create_group_states),
-- with the same columns.

ALTER FUNCTION @schema@._make_key_map(int, jsonb, jsonb) RENAME TO _make_key_map_before_fanout;

-- The group state table of a transform kept by delta (as 0026 and 0033 make it): the
-- groups g1..gn, the row count n, each aggregate's state parts a<n>_<part>; unique on the
-- groups (NULLs not distinct).
CREATE FUNCTION @schema@._create_group_states(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  state_sql text := quote_ident(@schema_literal@) || '.' || quote_ident('groups_' || transform_id);
  groups text;
BEGIN
  groups := (SELECT string_agg(quote_ident('g' || o), ', ' ORDER BY o)
               FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS x(g, o));
  EXECUTE 'DROP TABLE IF EXISTS ' || state_sql;
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

-- As before (0033), and a GROUP BY over an inner join that fans out, every aggregate of
-- which has an exact delta, keeps its sources' shadow (as 0033 makes it) and a group state
-- table: kept by delta. Over a LEFT JOIN that fans out, the group recompute, saying why.
CREATE FUNCTION @schema@._make_key_map(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  whole_row boolean;
  left_join boolean;
  fanned text;
BEGIN
  whole_row := coalesce((spec->>'whole_row')::boolean, false)
    OR coalesce((SELECT (t.spec->>'whole_row')::boolean FROM @schema@.transforms t WHERE t.id = transform_id), false);
  IF classified->>'mode' IS DISTINCT FROM 'delta'
     OR jsonb_array_length(coalesce(spec->'groups', '[]')) = 0
     OR jsonb_array_length(spec->'sources') < 2
     OR whole_row
     OR NOT @schema@._join_fans_out(spec)
     OR @schema@._shadow_columns(spec) IS NULL THEN
    PERFORM @schema@._make_key_map_before_fanout(transform_id, spec, classified);
    RETURN;
  END IF;
  left_join := EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s WHERE s->>'join_type' = 'left');
  IF left_join THEN
    SELECT quote_ident(s->>'alias') INTO fanned FROM jsonb_array_elements(spec->'sources') s
     WHERE (s->>'ordinal')::int > 0 AND NOT @schema@._joined_on_key(spec, s, s)
     ORDER BY (s->>'ordinal')::int DESC LIMIT 1;
    PERFORM @schema@._make_key_map_before_fanout(transform_id, spec, classified || jsonb_build_object(
      'mode', 'group', 'reason', format(
        'the join can multiply rows (%s is not joined on its whole key) and has a LEFT JOIN, whose NULL-extended rows have no delta: groups are recomputed from the sources',
        coalesce(fanned, 'a joined source'))));
    RETURN;
  END IF;
  -- The shadow, as 0033 makes it for a transform kept by group recompute.
  PERFORM @schema@._make_key_map_before_fanout(transform_id, spec,
    classified || '{"mode": "group", "reason": "made by _make_key_map"}');
  UPDATE @schema@.transforms
     SET delta = (classified - 'remap') || jsonb_build_object('fan_out', true, 'reason',
           (classified->>'reason') || '; the join can multiply rows, so a change''s join rows are signed from the sources'' shadow (ADR 0067)')
   WHERE id = transform_id;
  PERFORM @schema@._create_group_states(transform_id, spec, classified);
END
$fn$;

-- Transforms defined before this migration over an inner join that fans out, whose
-- aggregates all have an exact delta (0033 recorded them as kept by group recompute, their
-- classification kept under its reason): recorded as pending, so that their next build
-- (_switch_to_delta) gives them their group states and keeps them by delta. Until then they
-- keep their shadow and the group recompute.
UPDATE @schema@.transforms t
   SET delta = t.delta || jsonb_build_object(
         'mode', 'delta', 'reason', 'every aggregate has an exact delta', 'pending', true)
 WHERE t.aggregates
   AND t.delta->>'mode' = 'group'
   AND t.delta->>'reason' LIKE 'the join can multiply rows (%'
   AND NOT coalesce((t.delta->>'remap')::boolean, false)
   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(t.delta->'aggs') a WHERE NOT (a->>'delta')::boolean)
   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(t.spec->'sources') s WHERE s->>'join_type' = 'left');
