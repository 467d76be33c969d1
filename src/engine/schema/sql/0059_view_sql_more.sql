-- More of a view's SQL (issue #26; ADR 0073).
--
-- 1. Top-N over a subquery or a WITH query: a ranking derived table whose FROM reads a
--    part (`SELECT ... FROM (SELECT ..., row_number() OVER (PARTITION BY g ORDER BY v) AS rn
--    FROM (SELECT ... FROM t JOIN u ...) AS s) AS x WHERE rn <= 3`, or `FROM w` for a WITH
--    query w). ADR 0065's rewrite ranks a row by its source's key, and a part's key is
--    known only once the part is defined. So the rewrite waits: _topn_rewrite_window, given
--    a ranking block over a part not yet defined, marks it `topn_pending` (k) and leaves it
--    as written; _define_parts, reaching such a block, defines the parts inside it first
--    (binding its FROM and JOIN items to their hidden targets, which then have a primary
--    key), then rewrites it (the bound items read as tables) and defines the part of each
--    partition's top k. Nothing new runs in the drain: the ranking reads the part's target
--    as a chain reads a target.
--
-- Renamed and wrapped (statements without these forms go straight through):
-- _topn_rewrite_window (0058) -> _topn_rewrite_window_before_sqlmore, _define_parts (0046)
-- -> _define_parts_before_sqlmore.

ALTER FUNCTION @schema@._topn_rewrite_window(jsonb, int) RENAME TO _topn_rewrite_window_before_sqlmore;
ALTER FUNCTION @schema@._define_parts(jsonb, text, text, jsonb) RENAME TO _define_parts_before_sqlmore;

-- A ranking block (ADR 0065): over a part not yet bound to its target, marked to be
-- rewritten once its parts are defined (_define_parts); over bound parts, their items read
-- as the tables they are bound to; otherwise as before.
CREATE FUNCTION @schema@._topn_rewrite_window(pa jsonb, k int)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  items jsonb := jsonb_build_array(pa -> 'from') || coalesce(pa -> 'joins', '[]');
BEGIN
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(items) i
              WHERE i ->> 'part' IS NOT NULL AND i ->> 'schema' IS NULL) THEN
    RETURN pa || jsonb_build_object('topn_pending', k);
  END IF;
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(items) i WHERE i ->> 'part' IS NOT NULL) THEN
    pa := pa || jsonb_build_object(
      'from', (pa -> 'from') - 'part' - 'part_kind' - 'alias_implicit',
      'joins', coalesce((SELECT jsonb_agg(j - 'part' - 'part_kind' - 'alias_implicit' ORDER BY o)
                           FROM jsonb_array_elements(coalesce(pa -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '[]'));
  END IF;
  RETURN @schema@._topn_rewrite_window_before_sqlmore(pa, k);
END
$fn$;

-- The partition columns of a ranking block over parts (bound to their targets) that are a
-- part's column copied from a NOT NULL column of a table on no LEFT JOIN's side: declared
-- NOT NULL on the part's target (and in its spec, as 0036 does for count() columns), so the
-- part of each partition's top k, grouped by them, has a key that is never NULL.
CREATE FUNCTION @schema@._topn_part_partition_not_null(pa jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  e text;
  t @schema@.grammar_token[];
  al text;
  col text;
  item jsonb;
  tr @schema@.transforms;
  c jsonb;
  src jsonb;
BEGIN
  FOR e IN SELECT x FROM jsonb_array_elements_text(coalesce(pa -> 'window' -> 'partition', '[]')) x LOOP
    t := @schema@.grammar_tokenize(e);
    IF t[1].kind IN ('word', 'ident') AND t[2].kind = 'eof' THEN
      al := NULL; col := t[1].value;
    ELSIF t[1].kind IN ('word', 'ident') AND t[2].kind = 'punct' AND t[2].text = '.'
          AND t[3].kind IN ('word', 'ident') AND t[4].kind = 'eof' THEN
      al := t[1].value; col := t[3].value;
    ELSE
      CONTINUE;
    END IF;
    FOR item IN SELECT i FROM jsonb_array_elements(jsonb_build_array(pa -> 'from') || coalesce(pa -> 'joins', '[]')) i
                 WHERE i ->> 'part' IS NOT NULL AND i ->> 'schema' IS NOT NULL
                   AND (al IS NULL OR coalesce(i ->> 'alias', i ->> 'part') = al) LOOP
      SELECT * INTO tr FROM @schema@.transforms x
       WHERE x.target_schema = item ->> 'schema' AND x.target_name = item ->> 'name';
      CONTINUE WHEN tr.id IS NULL;
      SELECT x INTO c FROM jsonb_array_elements(tr.spec -> 'columns') x WHERE x ->> 'name' = col;
      CONTINUE WHEN c IS NULL OR coalesce((c ->> 'notnull')::boolean, false)
                    OR c -> 'plain' IS NULL OR jsonb_typeof(c -> 'plain') <> 'object';
      src := tr.spec -> 'sources' -> ((c -> 'plain' ->> 'source')::int);
      CONTINUE WHEN coalesce(src ->> 'join_type', 'inner') = 'left';
      CONTINUE WHEN NOT coalesce((SELECT a.attnotnull FROM pg_attribute a
                                   WHERE a.attrelid = (src ->> 'oid')::oid
                                     AND a.attnum = (c -> 'plain' ->> 'attnum')::int), false);
      EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET NOT NULL', tr.target_schema, tr.target_name, col);
      UPDATE @schema@.transforms x
         SET spec = jsonb_set(x.spec, '{columns}', (
               SELECT jsonb_agg(CASE WHEN y ->> 'name' = col THEN y || '{"notnull": true}' ELSE y END ORDER BY o)
                 FROM jsonb_array_elements(x.spec -> 'columns') WITH ORDINALITY AS z(y, o)))
       WHERE x.id = tr.id;
    END LOOP;
  END LOOP;
END
$fn$;

-- A part's definition: a ranking block waiting for its parts (topn_pending) gets them
-- defined, then is rewritten as top-N (its items bound) and the part of its top k defined;
-- everything else as before.
CREATE FUNCTION @schema@._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  k int;
  r1 jsonb;
  r2 jsonb;
  bound jsonb;
  rewritten jsonb;
  p jsonb;
BEGIN
  IF NOT ast ? 'topn_pending' THEN
    RETURN @schema@._define_parts_before_sqlmore(ast, root, path, scope);
  END IF;
  k := (ast ->> 'topn_pending')::int;
  r1 := @schema@._define_parts_before_sqlmore(ast - 'topn_pending', root, path, scope);
  -- Its own parts, now defined, are in scope for the part of its top k (which reads them).
  FOR p IN SELECT x FROM jsonb_array_elements(coalesce(ast -> 'parts', '[]')) x LOOP
    scope := scope || jsonb_build_object((p ->> 'kind') || ':' || (p ->> 'name'),
                                         'trellis#' || root || '#' || path || (p ->> 'name'));
  END LOOP;
  bound := (r1 -> 'ast') || jsonb_build_object('parts', '[]'::jsonb);
  PERFORM @schema@._topn_part_partition_not_null(bound);
  rewritten := @schema@._topn_rewrite_window(bound, k);
  -- Shown as written (its subqueries in place, not bound).
  rewritten := rewritten || jsonb_build_object('topn_written', ast - 'topn_pending');
  r2 := @schema@._define_parts_before_sqlmore(rewritten, root, path, scope);
  RETURN jsonb_build_object('ast', r2 -> 'ast', 'ids', (r1 -> 'ids') || (r2 -> 'ids'));
END
$fn$;
