-- NOT IN and <> ALL over values that can be NULL, uncorrelated EXISTS and NOT EXISTS, and
-- these subquery predicates under an OR (issue #26, item 1; ADR 0057, addendum "NULLs, one
-- fact per statement, OR").
--
--   x NOT IN (SELECT s FROM S WHERE ...)   (x <> ALL (...) likewise), x or s nullable:
--     TRUE iff S is empty, or x IS NOT NULL and no s = x and S holds no NULL. Compiled to
--     ADR 0057's anti-join part (keyed by s, LEFT JOINed on s = x) plus up to two
--     existence parts, LEFT JOINed on the correlation columns (if any):
--       "nulls#n"   the rows of S whose s IS NULL       (only if s can be NULL)
--       "values#n"  the rows of S whose s IS NOT NULL   (only if x can be NULL)
--     and the condition
--       anti.key IS NULL AND nulls.key IS NULL AND ((x) IS NOT NULL OR values.key IS NULL)
--   [NOT] EXISTS (SELECT ... FROM S WHERE <no reference to the outer query>):
--     an existence part, `key IS [NOT] NULL`.
--
-- An existence part is a GROUP BY of the correlation columns (never NULL, ADR 0057), or,
-- uncorrelated, of the constant-valued `(1 IS NULL)` (Postgres refuses a bare constant in
-- GROUP BY): at most one row per correlation key, which appears when the first row of S
-- (of that key) does and leaves with the last. A change to S reaches the statement only
-- when such a row appears or leaves; uncorrelated, that re-derives every row of the
-- statement (the join matches them all), as a one-row part's change does (ADR 0058).
--
-- Under OR: a top-level AND-ed condition that is an OR of terms (in brackets or not), each
-- either free of subqueries or one of the forms above, gets each form's condition in its
-- place (the parts LEFT JOINed, the row kept or not by the OR). Each such condition is
-- TRUE exactly when the predicate is, and FALSE otherwise (where SQL would say NULL):
-- under AND and OR at the top of WHERE the two filter the same rows.
--
-- Replaced (its latest body, 0039's, copied; each change marked "0044"): _semi_rewrite.
-- New: _semi_exists_part, _semi_or_terms, _semi_shape_operand.

-- An existence part over the subquery `sub` (after its own rewrite): its rows passing `kept`
-- (the subquery's own conditions and any added here), one per value of the correlation
-- columns `corr` ([{inner, outer}]), or, with none, at most one row (a constant-valued key).
-- {part, join}: the part under `alias`, LEFT JOINed on the correlation equalities.
CREATE FUNCTION @schema@._semi_exists_part(sub jsonb, kept text[], corr jsonb, alias text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  sel jsonb := '[]';
  gb jsonb := '[]';
  on_ text;
BEGIN
  FOR k IN 0 .. jsonb_array_length(corr) - 1 LOOP
    sel := sel || jsonb_build_array(jsonb_build_object('expr', corr->k->>'inner', 'name', 'key#' || (k + 1)));
    gb := gb || to_jsonb(corr->k->>'inner');
    kept := kept || ('(' || (corr->k->>'inner') || ') IS NOT NULL');
  END LOOP;
  IF jsonb_array_length(corr) = 0 THEN
    sel := jsonb_build_array(jsonb_build_object('expr', '(1 IS NULL)', 'name', 'key#1'));
    gb := '["(1 IS NULL)"]';
    on_ := format('%I.%I IS NOT NULL', alias, 'key#1');
  ELSE
    on_ := (SELECT string_agg(format('%I.%I = (%s)', alias, 'key#' || o, x->>'outer'), ' AND ' ORDER BY o)
              FROM jsonb_array_elements(corr) WITH ORDINALITY AS y(x, o));
  END IF;
  RETURN jsonb_build_object(
    'part', jsonb_build_object('name', alias, 'kind', 'derived', 'columns', '[]'::jsonb, 'semi', true,
      'ast', sub || jsonb_build_object(
        'select', sel, 'where', CASE WHEN cardinality(kept) > 0 THEN array_to_string(kept, ' AND ') END,
        'group_by', gb, 'having', NULL, 'semi_key', true)),
    'join', jsonb_build_object(
      'type', 'left', 'schema', NULL, 'name', alias, 'alias', alias, 'on', on_,
      'part', alias, 'part_kind', 'derived', 'semi', true));
END
$fn$;

-- _semi_shape, and NULL when the outer expression it found for an IN form is not one
-- operand (`a OR x IN (...)`, `a AND x IN (...)`, `a = x IN (...)`: IN binds tighter than
-- those, so the operand is x, not what is before IN).
CREATE FUNCTION @schema@._semi_shape_operand(cond text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  shape jsonb := @schema@._semi_shape(cond);
  toks @schema@.grammar_token[];
  d int := 0;
BEGIN
  IF shape IS NULL OR shape->>'expr' IS NULL THEN
    RETURN shape;
  END IF;
  toks := @schema@.grammar_tokenize(shape->>'expr');
  FOR k IN 1 .. array_length(toks, 1) LOOP
    IF (toks[k].kind = 'punct' AND toks[k].text IN ('(', '[')) OR @schema@.grammar_kw(toks[k], 'case') THEN
      d := d + 1;
    ELSIF (toks[k].kind = 'punct' AND toks[k].text IN (')', ']')) OR @schema@.grammar_kw(toks[k], 'end') THEN
      d := d - 1;
    ELSIF d = 0 AND ((toks[k].kind = 'word' AND toks[k].value IN (
                        'and', 'or', 'not', 'is', 'isnull', 'notnull', 'between', 'like', 'ilike',
                        'similar', 'in'))
                     OR (toks[k].kind = 'op' AND toks[k].text IN ('=', '<>', '!=', '<', '>', '<=', '>='))) THEN
      RETURN NULL;
    END IF;
  END LOOP;
  RETURN shape;
END
$fn$;

-- The terms of a condition that is an OR at its top (in brackets or not), as their texts;
-- NULL when it is not one.
CREATE FUNCTION @schema@._semi_or_terms(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(cond);
  n int := array_length(toks, 1);  -- the eof token
  a int := 1;
  b int;
  d int := 0;
  start int;
  res text[] := '{}';
BEGIN
  b := n;  -- exclusive
  WHILE b - a >= 2 AND toks[a].kind = 'punct' AND toks[a].text = '('
        AND @schema@._closing_token(toks, a) = b - 1 LOOP
    a := a + 1;
    b := b - 1;
  END LOOP;
  start := a;
  FOR k IN a .. b - 1 LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND @schema@.grammar_kw(toks[k], 'or') THEN
      IF k = start THEN
        RETURN NULL;
      END IF;
      res := res || @schema@.grammar_text(toks, start, k);
      start := k + 1;
    END IF;
  END LOOP;
  IF cardinality(res) = 0 OR start >= b THEN
    RETURN NULL;
  END IF;
  RETURN res || @schema@.grammar_text(toks, start, b);
END
$fn$;

-- Rewrites the semi- and anti-joins at the top of a view's WHERE (and, first, those of its
-- parts) into hidden parts read through LEFT JOINs: see the head of 0039 and ADR 0057.
-- `outer_ctes`: the WITH query parts of the statements around it (for Postgres to read its
-- expressions). Returns the AST unchanged when it holds none.
-- 0044: (as 0039's) and NOT IN over nullable values, uncorrelated EXISTS, and the forms as
-- terms of an OR AND-ed at the top of WHERE: see the head of this file.
CREATE OR REPLACE FUNCTION @schema@._semi_rewrite(ast jsonb, outer_ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  conjuncts text[];
  kept text[] := '{}';
  conds text[] := '{}';
  c text;
  shape jsonb;
  sub jsonb;
  sub_conj text[];
  sub_kept text[];
  keys jsonb;        -- [{inner, outer}]
  nes jsonb;         -- [{inner, outer}]: inner <> outer
  item jsonb;
  expr text;
  toks @schema@.grammar_token[];
  eq int;
  d int;
  lhs text;
  rhs text;
  alias text;
  n int := 0;
  ctes jsonb;
  scope_ctes jsonb;
  on_ text;
  sel jsonb;
  part_where text;
  k int;
  p jsonb;
  parts jsonb := '[]';
  joins jsonb;
  found boolean := false;
  seen jsonb;
  -- 0044
  work jsonb := '[]';    -- [{text, shape, grp, term}]: the forms to compile, in order
  grps jsonb := '[]';    -- per OR: its terms' texts (a form's replaced by its condition)
  terms text[];
  w jsonb;
  cond text;
  made jsonb;
  base_kept text[];
  nullable_inner boolean;
  nullable_outer boolean;
  corr jsonb;
  extra text;
BEGIN
  -- The parts inside first (a derived table or WITH query with a semi-join of its own).
  scope_ctes := outer_ctes || coalesce((SELECT jsonb_agg(x) FROM jsonb_array_elements(ast->'parts') x
                                          WHERE x->>'kind' = 'cte'), '[]');
  seen := outer_ctes;
  FOR p IN SELECT value FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) LOOP
    -- A WITH query sees those before it; a derived table every one of the statement's.
    parts := parts || jsonb_build_array(p || jsonb_build_object('ast', @schema@._semi_rewrite(p->'ast',
      CASE WHEN p->>'kind' = 'cte' THEN seen ELSE scope_ctes END)));
    IF p->>'kind' = 'cte' THEN
      seen := seen || jsonb_build_array(p);
    END IF;
  END LOOP;
  IF jsonb_array_length(parts) > 0 THEN
    ast := ast || jsonb_build_object('parts', parts);
  END IF;
  IF ast->>'where' IS NULL
     OR NOT @schema@._semi_has_sublink(@schema@.grammar_tokenize(ast->>'where')) THEN
    RETURN ast;
  END IF;
  ctes := coalesce((SELECT jsonb_object_agg(x->>'name', true) FROM jsonb_array_elements(scope_ctes) x), '{}');
  conjuncts := @schema@._semi_conjuncts(ast->>'where');
  joins := coalesce(ast->'joins', '[]');
  -- 0044: the forms to compile: AND-ed at the top, or terms of an OR AND-ed at the top.
  FOREACH c IN ARRAY conjuncts LOOP
    toks := @schema@.grammar_tokenize(c);
    IF NOT @schema@._semi_has_sublink(toks) THEN
      kept := kept || ('(' || c || ')');
      CONTINUE;
    END IF;
    terms := @schema@._semi_or_terms(c);
    shape := CASE WHEN terms IS NULL THEN @schema@._semi_shape_operand(c) END;
    IF shape IS NOT NULL THEN
      work := work || jsonb_build_array(jsonb_build_object('text', c, 'shape', shape));
      CONTINUE;
    END IF;
    IF terms IS NOT NULL AND NOT EXISTS (
         SELECT 1 FROM unnest(terms) t
          WHERE @schema@._semi_shape_operand(t) IS NULL AND @schema@._semi_has_sublink(@schema@.grammar_tokenize(t))) THEN
      FOR k IN 1 .. cardinality(terms) LOOP
        IF @schema@._semi_shape_operand(terms[k]) IS NOT NULL THEN
          work := work || jsonb_build_array(jsonb_build_object(
            'text', terms[k], 'shape', @schema@._semi_shape_operand(terms[k]),
            'grp', jsonb_array_length(grps), 'term', k - 1));
        END IF;
      END LOOP;
      grps := grps || jsonb_build_array(to_jsonb(ARRAY(SELECT '(' || t || ')' FROM unnest(terms) t)));
      CONTINUE;
    END IF;
    PERFORM @schema@._fail('TRV01', format(
      'a subquery in WHERE as EXISTS, IN, = ANY or <> ALL is supported only as a condition AND-ed at the top of WHERE or as a term of an OR so AND-ed, not inside %s (%s): write it as its own AND-ed condition, or as a term of an OR',
      CASE WHEN terms IS NOT NULL THEN 'an AND or another expression under an OR'
           WHEN EXISTS (SELECT 1 FROM unnest(toks) t WHERE @schema@.grammar_kw(t, 'or'))
             THEN 'an OR inside another expression (NOT, CASE, a comparison)'
           ELSE 'another expression (NOT, CASE, a comparison)' END, c));
  END LOOP;
  FOR w IN SELECT value FROM jsonb_array_elements(work) LOOP
    c := w->>'text';
    shape := w->'shape';
    found := true;
    n := n + 1;
    alias := replace(shape->>'kind', '_', '-') || '#' || n;
    sub := @schema@._semi_parse_sub(shape->>'sub', shape->>'kind' IN ('exists', 'not_exists'), ctes);
    -- GROUP BY: IN over the groups of its one selected expression (TPC-H Q18), kept with
    -- its HAVING: the part groups by it (and the correlation columns: the groups of a
    -- correlated subquery are those of its rows for one outer value).
    IF (jsonb_array_length(coalesce(sub->'group_by', '[]')) > 0 OR sub->>'having' IS NOT NULL)
       AND NOT (shape->>'kind' IN ('in', 'not_in') AND jsonb_array_length(sub->'select') = 1
                AND jsonb_array_length(coalesce(sub->'group_by', '[]')) = 1
                AND @schema@._semi_norm(sub->'group_by'->>0) IN (
                      @schema@._semi_norm(sub->'select'->0->>'expr'),
                      @schema@._semi_norm(coalesce(sub->'select'->0->>'label_expr', '')))) THEN
      PERFORM @schema@._fail('TRV01', format(
        'the subquery of %s (%s) has GROUP BY or HAVING: supported only for IN over the groups of the one expression it selects (SELECT x ... GROUP BY x HAVING ...)',
        shape->>'written', c));
    END IF;
    -- Its own semi-joins first, then what it reads.
    sub := @schema@._semi_rewrite(sub - 'distinct', scope_ctes);
    IF (@schema@._semi_probe(sub, scope_ctes, NULL, NULL)) IS NULL THEN
      PERFORM @schema@._fail('TRV01', format(
        'the subquery of %s (%s) reads a WITH query of a statement around it, or is otherwise not readable alone: not supported yet',
        shape->>'written', c));
    END IF;
    keys := '[]';
    nes := '[]';
    IF shape->>'kind' IN ('in', 'not_in') THEN
      IF jsonb_array_length(sub->'select') <> 1 THEN
        PERFORM @schema@._fail('TRV01', format(
          'the subquery of %s (%s) selects %s columns: write one (a row compared with IN is not supported yet)',
          shape->>'written', c, jsonb_array_length(sub->'select')));
      END IF;
      item := sub->'select'->0;
      expr := CASE WHEN item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL
                   THEN item->>'label_expr' ELSE item->>'expr' END;
      IF jsonb_array_length(coalesce(sub->'group_by', '[]')) = 0
         AND coalesce((@schema@._semi_probe(sub, scope_ctes, expr, NULL)->>'has_aggs')::boolean, true) THEN
        PERFORM @schema@._fail('TRV01', format(
          'the subquery of %s (%s) aggregates without GROUP BY (one row): a subquery of one row is not supported yet (scalar subqueries are a later slice)',
          shape->>'written', c));
      END IF;
      keys := keys || jsonb_build_array(jsonb_build_object('inner', expr, 'outer', shape->>'expr'));
    END IF;
    -- The subquery's conditions: its own (kept in the part), and those reading the statement
    -- around it (correlation), each an equality inner = outer (or inner <> outer).
    sub_conj := CASE WHEN sub->>'where' IS NULL THEN '{}' ELSE @schema@._semi_conjuncts(sub->>'where') END;
    sub_kept := '{}';
    FOREACH expr IN ARRAY sub_conj LOOP
      IF @schema@._semi_probe(sub, scope_ctes, NULL, expr) IS NOT NULL THEN
        sub_kept := sub_kept || ('(' || expr || ')');
        CONTINUE;
      END IF;
      toks := @schema@.grammar_tokenize(expr);
      eq := NULL;
      d := 0;
      FOR k IN 1 .. array_length(toks, 1) LOOP
        IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
          d := d + 1;
        ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
          d := d - 1;
        ELSIF d = 0 AND toks[k].kind = 'op' AND toks[k].text IN ('=', '<>', '!=') THEN
          IF eq IS NOT NULL THEN
            eq := -1;
          ELSE
            eq := k;
          END IF;
        END IF;
      END LOOP;
      lhs := NULL;
      IF eq > 1 THEN
        lhs := @schema@.grammar_text(toks, 1, eq);
        rhs := @schema@.grammar_text(toks, eq + 1, array_length(toks, 1));
        IF @schema@._semi_probe(sub, scope_ctes, lhs, NULL) IS NOT NULL
           AND @schema@._semi_probe(sub, scope_ctes, rhs, NULL) IS NULL
           AND @schema@._semi_probe(ast, outer_ctes, rhs, NULL) IS NOT NULL THEN
          NULL;
        ELSIF @schema@._semi_probe(sub, scope_ctes, rhs, NULL) IS NOT NULL
           AND @schema@._semi_probe(sub, scope_ctes, lhs, NULL) IS NULL
           AND @schema@._semi_probe(ast, outer_ctes, lhs, NULL) IS NOT NULL THEN
          expr := lhs;
          lhs := rhs;
          rhs := expr;
        ELSE
          lhs := NULL;
        END IF;
      END IF;
      IF lhs IS NULL THEN
        PERFORM @schema@._fail('TRV01', format(
          'the subquery of %s (%s) reads the statement around it in %s: a correlated condition must be an equality (or <>) of an expression of the subquery''s tables with one of the statement''s',
          shape->>'written', c, expr));
      END IF;
      IF toks[eq].text = '=' THEN
        keys := keys || jsonb_build_array(jsonb_build_object('inner', lhs, 'outer', rhs));
      ELSE
        nes := nes || jsonb_build_array(jsonb_build_object('inner', lhs, 'outer', rhs));
      END IF;
    END LOOP;
    -- 0044: uncorrelated (EXISTS): an existence part, below. Correlated only by <>: refused.
    IF jsonb_array_length(keys) = 0 AND jsonb_array_length(nes) > 0 THEN
      PERFORM @schema@._fail('TRV01', format(
        'the subquery of %s (%s) is correlated only by <>, not by an equality with the statement around it: a correlated <> is supported only besides an equality (inner_column = outer_column)',
        shape->>'written', c));
    END IF;
    IF jsonb_array_length(nes) > 1 THEN
      PERFORM @schema@._fail('TRV01', format(
        'the subquery of %s (%s) has more than one correlated <> condition: not supported',
        shape->>'written', c));
    END IF;
    -- NOT IN's NULLs: x NOT IN (SELECT col ...) is NULL (the row is left out) when col holds
    -- a NULL, or when x is NULL and the subquery has rows. Kept exactly only where neither
    -- can happen.
    -- 0044: kept exactly with existence parts (below) where either can, except over the
    -- groups of a GROUP BY (whether a group passes HAVING is not a fact of S's rows) or
    -- besides a correlated <>.
    nullable_inner := false;
    nullable_outer := false;
    IF shape->>'kind' = 'not_in' THEN
      nullable_inner := NOT @schema@._semi_not_null(sub, keys->0->>'inner', sub_conj);
      nullable_outer := NOT @schema@._semi_not_null(ast, keys->0->>'outer', conjuncts);
      IF (nullable_inner OR nullable_outer)
         AND (jsonb_array_length(coalesce(sub->'group_by', '[]')) > 0 OR sub->>'having' IS NOT NULL
              OR jsonb_array_length(nes) > 0) THEN
        IF nullable_inner THEN
          PERFORM @schema@._fail('TRV01', format(
            '%s (%s): its subquery''s column %s can be NULL, and one NULL there makes the condition NULL for every row it does not match; kept exactly for a subquery of rows, not over the groups of a GROUP BY or besides a correlated <>: add WHERE %s IS NOT NULL to the subquery (or declare the column NOT NULL), or write NOT EXISTS (SELECT 1 FROM ... WHERE %s = %s)',
            shape->>'written', c, keys->0->>'inner', keys->0->>'inner', keys->0->>'inner', keys->0->>'outer'));
        END IF;
        PERFORM @schema@._fail('TRV01', format(
          '%s (%s): %s can be NULL, and a NULL there makes the condition NULL when the subquery has rows and true when it has none; kept exactly for a subquery of rows, not over the groups of a GROUP BY or besides a correlated <>: add AND %s IS NOT NULL to WHERE (or declare the column NOT NULL), or write NOT EXISTS (SELECT 1 FROM ... WHERE column = %s)',
          shape->>'written', c, keys->0->>'outer', keys->0->>'outer', keys->0->>'outer'));
      END IF;
    END IF;
    base_kept := sub_kept;
    -- 0044: uncorrelated EXISTS / NOT EXISTS: one existence part, at most one row.
    IF jsonb_array_length(keys) = 0 THEN
      made := @schema@._semi_exists_part(sub, base_kept, '[]', alias);
      joins := joins || jsonb_build_array(made->'join');
      ast := ast || jsonb_build_object('parts', coalesce(ast->'parts', '[]') || jsonb_build_array(made->'part'));
      cond := format('%I.%I IS %sNULL', alias, 'key#1',
        CASE WHEN shape->>'kind' = 'exists' THEN 'NOT ' ELSE '' END);
    ELSE
      -- The part: the subquery's rows that pass its own conditions, one per correlation key.
      sel := '[]';
      part_where := NULL;
      FOR k IN 0 .. jsonb_array_length(keys) - 1 LOOP
        sel := sel || jsonb_build_array(jsonb_build_object(
          'expr', keys->k->>'inner', 'name', 'key#' || (k + 1)));
        sub_kept := sub_kept || ('(' || (keys->k->>'inner') || ') IS NOT NULL');
      END LOOP;
      IF jsonb_array_length(nes) = 1 THEN
        sel := sel || jsonb_build_array(
          jsonb_build_object('expr', 'min(' || (nes->0->>'inner') || ')', 'name', 'min#1'),
          jsonb_build_object('expr', 'max(' || (nes->0->>'inner') || ')', 'name', 'max#1'));
      END IF;
      sub := sub || jsonb_build_object(
        'select', sel, 'where', array_to_string(sub_kept, ' AND '),
        'group_by', (SELECT jsonb_agg(x->>'inner' ORDER BY o) FROM jsonb_array_elements(keys) WITH ORDINALITY AS y(x, o)),
        'having', sub->'having', 'semi_key', true);
      on_ := (SELECT string_agg(format('%I.%I = (%s)', alias, 'key#' || o, x->>'outer'), ' AND ' ORDER BY o)
                FROM jsonb_array_elements(keys) WITH ORDINALITY AS y(x, o));
      joins := joins || jsonb_build_array(jsonb_build_object(
        'type', 'left', 'schema', NULL, 'name', alias, 'alias', alias, 'on', on_,
        'part', alias, 'part_kind', 'derived', 'semi', true));
      ast := ast || jsonb_build_object('parts', coalesce(ast->'parts', '[]') || jsonb_build_array(jsonb_build_object(
        'name', alias, 'kind', 'derived', 'columns', '[]'::jsonb, 'ast', sub, 'semi', true)));
      IF jsonb_array_length(nes) = 1 THEN
        rhs := format('coalesce(%I.%I <> (%s) OR %I.%I <> (%s), false)',
          alias, 'min#1', nes->0->>'outer', alias, 'max#1', nes->0->>'outer');
        cond := CASE WHEN shape->>'kind' IN ('exists', 'in') THEN rhs ELSE 'NOT ' || rhs END;
      ELSE
        cond := format('%I.%I IS %sNULL', alias, 'key#1',
          CASE WHEN shape->>'kind' IN ('exists', 'in') THEN 'NOT ' ELSE '' END);
      END IF;
      -- 0044: NOT IN over nullable values: TRUE iff the subquery (for this row's correlation
      -- values) is empty, or x is not NULL, matches nothing, and the subquery holds no NULL.
      corr := coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(keys) WITH ORDINALITY AS y(x, o)
                         WHERE o > 1), '[]');
      IF nullable_inner THEN
        made := @schema@._semi_exists_part(sub, base_kept || ('(' || (keys->0->>'inner') || ') IS NULL'),
          corr, 'nulls#' || n);
        joins := joins || jsonb_build_array(made->'join');
        ast := ast || jsonb_build_object('parts', coalesce(ast->'parts', '[]') || jsonb_build_array(made->'part'));
        cond := cond || format(' AND %I.%I IS NULL', 'nulls#' || n, 'key#1');
      END IF;
      IF nullable_outer THEN
        made := @schema@._semi_exists_part(sub, base_kept || ('(' || (keys->0->>'inner') || ') IS NOT NULL'),
          corr, 'values#' || n);
        joins := joins || jsonb_build_array(made->'join');
        ast := ast || jsonb_build_object('parts', coalesce(ast->'parts', '[]') || jsonb_build_array(made->'part'));
        cond := cond || format(' AND ((%s) IS NOT NULL OR %I.%I IS NULL)', keys->0->>'outer', 'values#' || n, 'key#1');
      END IF;
    END IF;
    -- 0044: AND-ed at the top, or in its place among an OR's terms.
    IF w ? 'grp' THEN
      grps := jsonb_set(grps, ARRAY[w->>'grp', w->>'term'], to_jsonb('(' || cond || ')'));
    ELSE
      conds := conds || cond;
    END IF;
  END LOOP;
  -- 0044: each OR, its forms' conditions in their places.
  conds := conds || ARRAY(SELECT '(' || (SELECT string_agg(t, ' OR ' ORDER BY o2)
                                           FROM jsonb_array_elements_text(g) WITH ORDINALITY AS z(t, o2)) || ')'
                            FROM jsonb_array_elements(grps) WITH ORDINALITY AS y(g, o) ORDER BY o);
  IF NOT found THEN
    RETURN ast;
  END IF;
  RETURN ast || jsonb_build_object(
    'joins', joins, 'where', array_to_string(kept || conds, ' AND '),
    'semi_where', ast->>'where');
END
$fn$;

-- Scalar subqueries in the WHERE, HAVING or SELECT list of a derived table or WITH query
-- (TPC-H Q22: `c_acctbal > (SELECT avg(c_acctbal) ...)` inside its FROM's subquery): each
-- part's statement gets _scalar_subqueries (ADR 0058) before it is defined, as the
-- statement around it does; its comma joins first, as there. A part without one, or
-- reading a WITH query of the statement around it, is as before. Renamed and wrapped:
-- _define_parts (0041) -> _define_parts_before_notin.
ALTER FUNCTION @schema@._define_parts(jsonb, text, text, jsonb) RENAME TO _define_parts_before_notin;

CREATE FUNCTION @schema@._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast ? 'parts' THEN
    ast := ast || jsonb_build_object('parts', (
      SELECT jsonb_agg(CASE WHEN p ? 'ast' AND NOT (p->'ast') ? 'union' AND NOT (p->'ast') ? 'scalars'
                             -- not one reading a WITH query of the statement around it (Postgres
                             -- cannot read it alone): refused as before, "a subquery in WHERE"
                             AND NOT EXISTS (
                               SELECT 1 FROM jsonb_array_elements(jsonb_build_array(p->'ast'->'from')
                                                                  || coalesce(p->'ast'->'joins', '[]')) i
                                WHERE i->>'part_kind' = 'cte'
                                  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(p->'ast'->'parts', '[]')) q
                                                   WHERE q->>'kind' = 'cte' AND q->>'name' = i->>'part'))
                             AND (coalesce(p->'ast'->>'where', '') ~* '\(\s*(select|with)\M'
                                  OR coalesce(p->'ast'->>'having', '') ~* '\(\s*(select|with)\M'
                                  OR EXISTS (SELECT 1 FROM jsonb_array_elements(p->'ast'->'select') i
                                              WHERE i->>'expr' ~* '\(\s*(select|with)\M'))
                            THEN p || jsonb_build_object('ast',
                                   @schema@._scalar_subqueries(@schema@._comma_joins(p->'ast')))
                            ELSE p END ORDER BY o)
        FROM jsonb_array_elements(ast->'parts') WITH ORDINALITY AS x(p, o)));
  END IF;
  RETURN @schema@._define_parts_before_notin(ast, root, path, scope);
END
$fn$;
