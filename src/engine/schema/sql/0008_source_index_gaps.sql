-- Source indexes a transform's re-derivation needs and lacks. The drain finds the rows a
-- change touches through join conditions (both sides of each equality) and, for GROUP BY,
-- the rows of a group through its bare-column GROUP BY expressions: without an index
-- leading with one of those columns, each lookup reads the whole table. Trellis never
-- creates indexes on user tables: it reports the gap and the statement that closes it.
CREATE FUNCTION @schema@.source_index_gaps(p_transform_id int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH t AS (SELECT * FROM @schema@.transforms WHERE id = p_transform_id),
  sides AS (
    SELECT (e->>'left')::int AS src, (e->>'left_attnum')::int AS attnum,
           CASE WHEN (e->>'left')::int = (e->>'join')::int THEN 'join_joined' ELSE 'join_from' END AS role
      FROM t, jsonb_array_elements(coalesce(t.spec->'joins', '[]')) e
    UNION
    SELECT (e->>'right')::int, (e->>'right_attnum')::int,
           CASE WHEN (e->>'right')::int = (e->>'join')::int THEN 'join_joined' ELSE 'join_from' END
      FROM t, jsonb_array_elements(coalesce(t.spec->'joins', '[]')) e
    UNION
    SELECT (g->'plain'->>'source')::int, (g->'plain'->>'attnum')::int, 'group_by'
      FROM t, jsonb_array_elements(coalesce(t.spec->'groups', '[]')) g
     WHERE jsonb_typeof(g->'plain') = 'object'),
  needs AS (
    SELECT src, role, array_agg(attnum ORDER BY attnum) AS attnums FROM sides GROUP BY src, role)
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'table', ts.source_schema || '.' || ts.source_name,
           'columns', to_jsonb(cols.names),
           'role', n.role,
           'opted_out', t.without_source_index,
           'fix', format('CREATE INDEX CONCURRENTLY ON %I.%I (%s)', ts.source_schema, ts.source_name,
                         (SELECT string_agg(quote_ident(c), ', ') FROM unnest(cols.names) c)))
         ORDER BY ts.ordinal, n.role), '[]')
    FROM needs n
    CROSS JOIN t
    JOIN @schema@.transform_sources ts ON ts.transform_id = t.id AND ts.ordinal = n.src
    CROSS JOIN LATERAL (
      SELECT array_agg(a.attname::text ORDER BY a.attnum) AS names
        FROM pg_attribute a WHERE a.attrelid = ts.source_oid AND a.attnum = ANY (n.attnums)) cols
   WHERE NOT EXISTS (
     SELECT 1 FROM pg_index i
      WHERE i.indrelid = ts.source_oid AND i.indisvalid AND i.indkey[0] = ANY (n.attnums))
$fn$;
