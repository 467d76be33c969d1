-- Top-N per partition written with a WITH query (issue #26): the ranking SELECT as a WITH
-- query, read by the statement that filters its rank,
--
--   WITH r AS (SELECT id, team, rank() OVER (PARTITION BY team ORDER BY score DESC) AS rk FROM t)
--   SELECT id, team, rk FROM r WHERE rk <= 3
--
-- was refused ("a window function is kept only as top-N per partition: SELECT ... FROM
-- (SELECT ...) AS s WHERE rk <= k"), though it is the derived-table form Postgres itself
-- inlines a WITH query read once into. A WITH query ranking its rows is now kept as that
-- derived table is (ADR 0065): when the statement reads it exactly once, in the FROM or a
-- join of the SELECT whose WHERE bounds the rank. Read more than once, or from another
-- level (a subquery, another WITH query), it is refused as before: each reading would need
-- its own bound.
--
-- Wrapped (the pattern of 0039-0041): `_topn_bind` (0045) is renamed `_topn_bind_before_cte`;
-- the new function of the old name marks such a WITH query as a ranking derived table for
-- the delegate (which reads k from the WHERE and rewrites it), then gives it back its kind.
-- The delegate's recursion calls `_topn_bind` by name: every level goes through here.

ALTER FUNCTION @schema@._topn_bind(jsonb, boolean) RENAME TO _topn_bind_before_cte;

-- How many FROM or join items anywhere in `ast` read the relation `name` without a schema
-- (a WITH query's name).
CREATE FUNCTION @schema@._cte_readers(ast jsonb, name text)
RETURNS int LANGUAGE sql IMMUTABLE AS $fn$
  SELECT count(*)::int
    FROM jsonb_path_query(ast, 'strict $.** ? (@.name == $n && @.schema == null && exists (@.alias))',
                          jsonb_build_object('n', name)) r
$fn$;

CREATE FUNCTION @schema@._topn_bind(ast jsonb, ranked boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  here jsonb;
  marked jsonb;
  res jsonb;
BEGIN
  IF ast IS NULL OR jsonb_typeof(ast) <> 'object' OR NOT ast ? 'parts' THEN
    RETURN @schema@._topn_bind_before_cte(ast, ranked);
  END IF;
  -- This level's FROM and joins.
  here := jsonb_build_array(ast -> 'from') || coalesce(ast -> 'joins', '[]');
  -- Each such WITH query's name, and the name its reader calls it by (its alias, if any).
  SELECT jsonb_object_agg(p ->> 'name', (
           SELECT coalesce(r ->> 'alias', r ->> 'name') FROM jsonb_array_elements(here) r
            WHERE r ->> 'name' = p ->> 'name' AND r ->> 'schema' IS NULL LIMIT 1))
    INTO marked
    FROM jsonb_array_elements(ast -> 'parts') p
   WHERE p ->> 'kind' = 'cte' AND p -> 'ast' ? 'window'
     AND @schema@._cte_readers(ast, p ->> 'name') = 1
     AND @schema@._cte_readers(here, p ->> 'name') = 1;
  IF marked IS NULL THEN
    RETURN @schema@._topn_bind_before_cte(ast, ranked);
  END IF;
  -- For the delegate, a ranking derived table named as its reader calls it (the delegate
  -- reads k from the WHERE by that name); given back its kind and name after.
  res := @schema@._topn_bind_before_cte(ast || jsonb_build_object('parts', (
    SELECT jsonb_agg(CASE WHEN p ->> 'kind' = 'cte' AND marked ? (p ->> 'name')
                          THEN p || jsonb_build_object('kind', 'derived', 'name', marked ->> (p ->> 'name'),
                                                       'trellis#cte', p ->> 'name')
                          ELSE p END ORDER BY o)
      FROM jsonb_array_elements(ast -> 'parts') WITH ORDINALITY AS x(p, o))), ranked);
  RETURN res || jsonb_build_object('parts', (
    SELECT jsonb_agg(CASE WHEN p ? 'trellis#cte'
                          THEN (p - 'trellis#cte') || jsonb_build_object('kind', 'cte', 'name', p ->> 'trellis#cte')
                          ELSE p END ORDER BY o)
      FROM jsonb_array_elements(res -> 'parts') WITH ORDINALITY AS x(p, o)));
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
