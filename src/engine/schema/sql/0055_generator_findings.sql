-- Two engine bugs the differential tests' view SQL found (issue #24, item 4; test/
-- view-sql-regressions.test.ts keeps each minimised):
--
-- 1. A top-N's rank filter in brackets was not seen. `WHERE (dt.rn <= 1) AND (…)`, as
--    pg_get_viewdef() writes every condition, was refused ("the statement reading dt must
--    filter it with WHERE rn <= k"): _topn_bound (0045) split the WHERE at its top-level
--    ANDs and read each conjunct bare. It now reads the conjuncts as _semi_conjuncts (0048)
--    splits them, brackets taken off, so `(rn <= 2)` and `((a) AND (rn = 1))` are read.
--
-- 2. A UNION branch other than the first selecting one column twice (`… UNION ALL SELECT
--    b.id, b.id FROM b`) was refused: valid SQL (the union's columns take the first
--    branch's names), but _define_union (0041) checks each branch alone, as a view, under
--    its own output names, and a view cannot have two columns named `id`. The names a
--    later branch gives its columns mean nothing to the union, and each branch's part is
--    defined under the union's names anyway: the branches after the first are now checked
--    with each unnamed item (but bare labels, which that check reads) named
--    `trellis#c<n>`, and the union returned as written (for rendering).
--
-- 3. A semi- or anti-join as a term of an OR, in brackets (`WHERE ((EXISTS (SELECT …)) OR
--    (x > 1))`, pg_get_viewdef()'s form again) was refused as "inside an AND or another
--    expression under an OR": _semi_or_terms (0044) gave each term with its brackets, and
--    a term in brackets is no EXISTS, IN or NOT IN to the shape it is read by. Each term now
--    comes without the brackets around the whole of it.
--
-- 4. A source column renamed that a DISTINCT ON reads in its DISTINCT ON expressions or
--    ORDER BY (and nowhere else) stopped the transform (`capture_failure`: "its definition
--    no longer holds") instead of being followed: _rename_in_ast (0030) renames the
--    SELECT list, WHERE, GROUP BY, HAVING and ON, and the stored AST of a DISTINCT ON
--    keeps its DISTINCT ON and ORDER BY as written (0045), which it did not rename.
--
-- Renamed here and wrapped:
--   _topn_bound (0045)     -> _topn_bound_before_parens
--   _define_union (0041)   -> _define_union_before_twice
--   _semi_or_terms (0044)  -> _semi_or_terms_before_parens
--   _rename_in_ast (0030)  -> _rename_in_ast_before_distinct_on
-- No other function is replaced.

ALTER FUNCTION @schema@._topn_bound(text, text, text) RENAME TO _topn_bound_before_parens;

CREATE FUNCTION @schema@._topn_bound(where_ text, alias text, rn text)
RETURNS int LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  c text;
  n int;
  best int;
BEGIN
  IF where_ IS NULL THEN
    RETURN NULL;
  END IF;
  FOREACH c IN ARRAY @schema@._semi_conjuncts(where_) LOOP
    n := @schema@._topn_bound_before_parens(c, alias, rn);
    IF n IS NOT NULL AND (best IS NULL OR n < best) THEN
      best := n;
    END IF;
  END LOOP;
  RETURN best;
END
$fn$;

ALTER FUNCTION @schema@._define_union(jsonb, text, text, jsonb) RENAME TO _define_union_before_twice;

CREATE FUNCTION @schema@._define_union(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  branches jsonb := '[]';
  branch jsonb;
  b bigint;
  res jsonb;
BEGIN
  FOR branch, b IN SELECT x, o FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS y(x, o) LOOP
    IF b > 1 AND jsonb_typeof(branch->'select') = 'array' THEN
      branch := branch || jsonb_build_object('select', (
        SELECT jsonb_agg(CASE WHEN i->>'bare_label' IS NULL
                              THEN i || jsonb_build_object('name', 'trellis#c' || n)
                              ELSE i END ORDER BY n)
          FROM jsonb_array_elements(branch->'select') WITH ORDINALITY AS z(i, n)));
    END IF;
    branches := branches || jsonb_build_array(branch);
  END LOOP;
  res := @schema@._define_union_before_twice(
    jsonb_set(ast, '{union,branches}', branches), root, path, scope);
  IF res->'ast' ? 'union' THEN
    res := jsonb_set(res, '{ast,union}', ast->'union');
  END IF;
  RETURN res;
END
$fn$;

ALTER FUNCTION @schema@._semi_or_terms(text) RENAME TO _semi_or_terms_before_parens;

CREATE FUNCTION @schema@._semi_or_terms(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  terms text[] := @schema@._semi_or_terms_before_parens(cond);
  res text[] := '{}';
  t text;
  toks @schema@.grammar_token[];
  n int;
BEGIN
  IF terms IS NULL THEN
    RETURN NULL;
  END IF;
  FOREACH t IN ARRAY terms LOOP
    LOOP
      toks := @schema@.grammar_tokenize(t);
      n := array_length(toks, 1) - 1;  -- the last token before eof
      EXIT WHEN NOT (n >= 2 AND toks[1].kind = 'punct' AND toks[1].text = '('
                     AND @schema@._closing_token(toks, 1) = n);
      t := @schema@.grammar_text(toks, 2, n);
    END LOOP;
    res := res || t;
  END LOOP;
  RETURN res;
END
$fn$;

ALTER FUNCTION @schema@._rename_in_ast(jsonb, int, text, text) RENAME TO _rename_in_ast_before_distinct_on;

CREATE FUNCTION @schema@._rename_in_ast(ast jsonb, ordinal int, old_name text, new_name text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  src jsonb := CASE WHEN ordinal = 0 THEN ast->'from' ELSE ast->'joins'->(ordinal - 1) END;
  alias text := coalesce(src->>'alias', src->>'name');
BEGIN
  IF ast ? 'distinct_on' THEN
    ast := ast || jsonb_build_object(
      'distinct_on', (SELECT coalesce(jsonb_agg(to_jsonb(@schema@._rename_in_expression(e, alias, old_name, new_name)) ORDER BY n), '[]')
                        FROM jsonb_array_elements_text(ast->'distinct_on') WITH ORDINALITY AS x(e, n)),
      'order_by', (SELECT coalesce(jsonb_agg(o || jsonb_build_object('expr', @schema@._rename_in_expression(o->>'expr', alias, old_name, new_name)) ORDER BY n), '[]')
                     FROM jsonb_array_elements(ast->'order_by') WITH ORDINALITY AS x(o, n)));
  END IF;
  RETURN @schema@._rename_in_ast_before_distinct_on(ast, ordinal, old_name, new_name);
END
$fn$;
