-- Scalar subqueries that read tables, in the SELECT list, WHERE and HAVING of a view's
-- SQL (issue #26, item 1, third slice; ADR 0058), and one-row derived tables / WITH
-- queries (aggregates without GROUP BY):
--
--   uncorrelated  x > (SELECT 0.5 * sum(y) FROM t WHERE ...)
--     -> a one-row part (the subquery, aggregates without GROUP BY), given a constant key
--        column "trellis#one" (boolean, always true, its primary key) so the statement
--        around it can read it as a source: JOIN <part> AS "scalar#n" ON true, and
--        the subquery replaced by "scalar#n".v (in HAVING or the SELECT list of a GROUP
--        BY, outside an aggregate, by (array_agg("scalar#n".v))[1]: the same in every row).
--   correlated    x < (SELECT 0.2 * avg(q) FROM t2 WHERE t2.k = outer.k AND ...)
--     -> a GROUP BY part keyed by the inner side of each correlation equality, LEFT JOINed
--        on those equalities; the subquery replaced by CASE WHEN the part's key IS NULL
--        THEN <the subquery's value over no rows, computed once> ELSE "...".v END.
--
-- Every subquery accepted returns exactly one row per outer row by construction (an
-- aggregate without GROUP BY or HAVING); anything that could return more than one row
-- (GROUP BY, no aggregate, HAVING) is refused with validation, by name.
--
-- New functions: _one_row_part_key (the constant key of a one-row part: reusable by any
-- compilation that needs to read a one-row part as a source), _split_conjuncts,
-- _top_level_equality, _scalar_subqueries (the rewrite), _scalar_part (one subquery),
-- _scalar_as_written (the statement as written, for rendering), _render_scalar_item.
-- Replaced (their latest bodies, 0036, copied; each change marked "0040"):
-- _render_view_item, _render_view_select, _define_parts, _define.

-- A one-row part's target (aggregates without GROUP BY: a grand total, one row, no key)
-- gets a key the statement around it reads it by: a column "trellis#one" (boolean, NOT
-- NULL, always true) and a primary key on it. The engine keeps writing the row through its
-- own unique index on ((true)); the column's default fills it.
CREATE FUNCTION @schema@._one_row_part_key(tschema name, hidden text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  EXECUTE format('ALTER TABLE %I.%I ADD COLUMN %I boolean NOT NULL DEFAULT true',
    tschema, hidden, 'trellis#one');
  EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (%I)', tschema, hidden, 'trellis#one');
END
$fn$;

-- The top-level AND conjuncts of a condition (the AND of BETWEEN ... AND left alone), each
-- as normalised text.
CREATE FUNCTION @schema@._split_conjuncts(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(cond);
  n int := array_length(toks, 1);
  depth int := 0;
  between_open int := 0;
  start int := 1;
  res text[] := '{}';
BEGIN
  FOR k IN 1 .. n - 1 LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      depth := depth + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      depth := depth - 1;
    ELSIF depth = 0 AND @schema@.grammar_kw(toks[k], 'between') THEN
      between_open := between_open + 1;
    ELSIF depth = 0 AND @schema@.grammar_kw(toks[k], 'and') THEN
      IF between_open > 0 THEN
        between_open := between_open - 1;
      ELSE
        res := res || @schema@.grammar_text(toks, start, k);
        start := k + 1;
      END IF;
    END IF;
  END LOOP;
  RETURN res || @schema@.grammar_text(toks, start, n);
END
$fn$;

-- A condition `a = b` with one top-level "=" (outside brackets, no AND/OR/NOT around it):
-- (a, b); else (NULL, NULL).
CREATE FUNCTION @schema@._top_level_equality(cond text, OUT lhs text, OUT rhs text)
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(cond);
  n int := array_length(toks, 1);
  depth int := 0;
  at int;
BEGIN
  FOR k IN 1 .. n - 1 LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      depth := depth + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      depth := depth - 1;
    ELSIF depth = 0 AND (toks[k].kind = 'op' OR (toks[k].kind = 'word' AND toks[k].value IN ('or', 'not', 'and', 'is', 'in', 'like', 'between'))) THEN
      IF toks[k].kind = 'op' AND toks[k].text = '=' AND at IS NULL THEN
        at := k;
      ELSIF toks[k].kind = 'op' AND toks[k].text IN ('+', '-', '*', '/', '%', '||', '^') THEN
        NULL;
      ELSE
        RETURN;
      END IF;
    END IF;
  END LOOP;
  IF at IS NULL OR at = 1 OR at = n - 1 THEN
    RETURN;
  END IF;
  lhs := @schema@.grammar_text(toks, 1, at);
  rhs := @schema@.grammar_text(toks, at + 1, n);
END
$fn$;

-- A view's SELECT (an AS-form AST) rendered with the outer WITH queries `ctes` (parts of
-- kind cte) in scope: what Postgres is asked about a subquery on its own.
CREATE FUNCTION @schema@._scalar_render(sub jsonb, ctes jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT @schema@._render_view_select(sub || jsonb_build_object('parts', ctes || coalesce(sub->'parts', '[]')))
$fn$;

-- One scalar subquery (its AST `sub`, the n-th of the statement, in `clause`) made a part:
-- {part, join, placeholder, correlated}. `outer_ast` is the statement around it as
-- written (for the scope of correlated names); `ctes` its WITH queries.
CREATE FUNCTION @schema@._scalar_part(sub jsonb, n int, clause text, outer_ast jsonb, ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  name text := 'scalar#' || n;
  alias text := 'scalar#' || n;
  what text := format('the scalar subquery in %s', clause);
  info jsonb;
  bare jsonb := sub || jsonb_build_object('where', NULL);
  conj text;
  kept text[] := '{}';
  inner_exprs text[] := '{}';
  outer_exprs text[] := '{}';
  eq record;
  on_ text;
  empty_value text;
  empty_type text;
  k int;
  outer_scope jsonb := outer_ast - 'scalars' || jsonb_build_object(
    'where', NULL, 'group_by', '[]'::jsonb, 'having', NULL, 'distinct', false);
BEGIN
  IF jsonb_array_length(sub->'select') <> 1 THEN
    PERFORM @schema@._fail('TRV01', format('%s must return one column', what));
  END IF;
  IF jsonb_array_length(coalesce(sub->'group_by', '[]')) > 0 OR sub->>'having' IS NOT NULL
     OR coalesce((sub->>'distinct')::boolean, false) THEN
    PERFORM @schema@._fail('TRV01', format(
      '%s has GROUP BY, HAVING or DISTINCT: it may return more or fewer than one row (Postgres fails the statement on more than one), which is not supported. Aggregate without GROUP BY (one row), e.g. (SELECT max(...) FROM ...)',
      what));
  END IF;
  info := @schema@._view_parse(@schema@._scalar_render(sub, ctes));
  IF info IS NOT NULL THEN
    -- Uncorrelated: one row, whatever the tables hold.
    IF NOT (info->>'has_aggs')::boolean THEN
      PERFORM @schema@._fail('TRV01', format(
        '%s does not aggregate: it may return more or fewer than one row (Postgres fails the statement on more than one), which is not supported. Aggregate without GROUP BY (one row), e.g. (SELECT max(...) FROM ...), or JOIN the table',
        what));
    END IF;
    RETURN jsonb_build_object(
      'part', jsonb_build_object('name', name, 'kind', 'scalar', 'columns', '["v"]'::jsonb, 'ast', sub,
                                 'clause', clause, 'one_row', true),
      'join', jsonb_build_object('type', 'inner', 'part', name, 'part_kind', 'scalar', 'alias', alias,
                                 'on', 'true', 'schema', NULL, 'name', name),
      'placeholder', quote_ident(alias) || '.v',
      'correlated', false);
  END IF;
  -- Correlated: it may name the statement around it only in equalities of its WHERE
  -- (inner = outer), each a key of a GROUP BY part.
  IF @schema@._view_parse(@schema@._scalar_render(bare, ctes)) IS NULL THEN
    PERFORM @schema@._fail('TRV01', format(
      '%s names the statement around it (a correlated subquery) outside its WHERE, or is not valid on its own: a correlated scalar subquery may name the outer query only in equalities of its WHERE (inner column = outer expression)',
      what));
  END IF;
  FOREACH conj IN ARRAY @schema@._split_conjuncts(sub->>'where') LOOP
    IF @schema@._view_parse(@schema@._scalar_render(bare || jsonb_build_object('where', conj), ctes)) IS NOT NULL THEN
      kept := kept || conj;
      CONTINUE;
    END IF;
    SELECT * INTO eq FROM @schema@._top_level_equality(conj);
    IF eq.lhs IS NOT NULL AND @schema@._view_parse(@schema@._scalar_render(bare || jsonb_build_object(
         'select', jsonb_build_array(jsonb_build_object('expr', eq.lhs, 'name', 'x'))), ctes)) IS NOT NULL
       AND @schema@._view_parse(@schema@._render_view_select(outer_scope || jsonb_build_object(
         'select', jsonb_build_array(jsonb_build_object('expr', eq.rhs, 'name', 'x'))))) IS NOT NULL THEN
      inner_exprs := inner_exprs || eq.lhs;
      outer_exprs := outer_exprs || eq.rhs;
    ELSIF eq.lhs IS NOT NULL AND @schema@._view_parse(@schema@._scalar_render(bare || jsonb_build_object(
         'select', jsonb_build_array(jsonb_build_object('expr', eq.rhs, 'name', 'x'))), ctes)) IS NOT NULL
       AND @schema@._view_parse(@schema@._render_view_select(outer_scope || jsonb_build_object(
         'select', jsonb_build_array(jsonb_build_object('expr', eq.lhs, 'name', 'x'))))) IS NOT NULL THEN
      inner_exprs := inner_exprs || eq.rhs;
      outer_exprs := outer_exprs || eq.lhs;
    ELSE
      PERFORM @schema@._fail('TRV01', format(
        '%s names the statement around it in %s: a correlated scalar subquery may name the outer query only in equalities of its WHERE (inner column = outer expression), joined by AND',
        what, conj));
    END IF;
  END LOOP;
  bare := bare || jsonb_build_object('where', CASE WHEN cardinality(kept) > 0
                                                   THEN array_to_string(kept, ' AND ') END);
  info := @schema@._view_parse(@schema@._scalar_render(bare, ctes));
  IF info IS NULL OR NOT (info->>'has_aggs')::boolean THEN
    PERFORM @schema@._fail('TRV01', format(
      '%s does not aggregate: it may return more or fewer than one row per outer row (Postgres fails the statement on more than one), which is not supported. Aggregate without GROUP BY, e.g. (SELECT avg(...) FROM ... WHERE inner = outer), or JOIN the table',
      what));
  END IF;
  -- Its value over no rows (an outer row no group matches): count() is 0, most others NULL.
  BEGIN
    EXECUTE format('SELECT quote_nullable(x.v::text), pg_typeof(x.v)::text FROM (%s) AS x (v)',
      @schema@._scalar_render(bare || jsonb_build_object('where', 'false'), ctes))
      INTO empty_value, empty_type;
  EXCEPTION WHEN OTHERS THEN
    PERFORM @schema@._fail('TRV01', format('%s fails over no rows (%s): not supported', what, SQLERRM));
  END;
  on_ := '';
  FOR k IN 1 .. cardinality(inner_exprs) LOOP
    bare := jsonb_set(bare, '{select}', (bare->'select') || jsonb_build_array(jsonb_build_object(
      'expr', inner_exprs[k], 'name', 'trellis#k' || k, 'bare_label', NULL, 'label_expr', NULL)));
    bare := jsonb_set(bare, '{group_by}', coalesce(bare->'group_by', '[]') || to_jsonb(inner_exprs[k]));
    on_ := on_ || CASE WHEN k > 1 THEN ' AND ' ELSE '' END
      || quote_ident(alias) || '.' || quote_ident('trellis#k' || k) || ' = (' || outer_exprs[k] || ')';
  END LOOP;
  RETURN jsonb_build_object(
    'part', jsonb_build_object('name', name, 'kind', 'scalar', 'columns', '["v"]'::jsonb, 'ast', bare,
                               'clause', clause, 'one_row', false),
    'join', jsonb_build_object('type', 'left', 'part', name, 'part_kind', 'scalar', 'alias', alias,
                               'on', on_, 'schema', NULL, 'name', name),
    'placeholder', format('CASE WHEN %I.%I IS NULL THEN %s ELSE %I.v END', alias, 'trellis#k1',
                          CASE WHEN empty_value = 'NULL' THEN 'NULL' ELSE empty_value || '::' || empty_type END,
                          alias),
    'correlated', true);
END
$fn$;

-- Each scalar subquery of `scalars` ({placeholder, written}) in `expr`: its written text
-- replaced by its placeholder, or (to_written) the other way round.
CREATE FUNCTION @schema@._scalar_replace(expr text, scalars jsonb, to_written boolean)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  s jsonb;
BEGIN
  IF expr IS NULL THEN
    RETURN NULL;
  END IF;
  FOR s IN SELECT value FROM jsonb_array_elements(coalesce(scalars, '[]')) LOOP
    expr := CASE WHEN to_written THEN replace(expr, s->>'placeholder', s->>'written')
                 ELSE replace(expr, s->>'written', s->>'placeholder') END;
  END LOOP;
  RETURN expr;
END
$fn$;

-- One expression of a view's statement with its scalar subqueries made parts (from the
-- n-th on): {expr (rewritten), scalars: [{part, join, placeholder, written, correlated}]}.
-- A subquery after EXISTS, IN, ANY, ALL, SOME or ARRAY is not a scalar subquery: left as
-- it is (refused, or compiled, elsewhere).
CREATE FUNCTION @schema@._scalar_rewrite_expr(expr text, n int, clause text, outer_ast jsonb, ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(expr);
  out_toks @schema@.grammar_token[] := '{}';
  len int := array_length(toks, 1);
  k int := 1;
  close_at int;
  sub jsonb;
  made jsonb;
  found jsonb := '[]';
  cte_names jsonb;
BEGIN
  cte_names := coalesce((SELECT jsonb_object_agg(p->>'name', true) FROM jsonb_array_elements(ctes) p), '{}');
  WHILE k <= len LOOP
    IF toks[k].kind = 'punct' AND toks[k].text = '('
       AND (@schema@.grammar_kw(toks[k + 1], 'select') OR @schema@.grammar_kw(toks[k + 1], 'with'))
       AND NOT (k > 1 AND toks[k - 1].kind = 'word'
                AND toks[k - 1].value IN ('exists', 'in', 'any', 'all', 'some', 'array')) THEN
      close_at := @schema@._closing_token(toks, k);
      sub := @schema@.grammar_parse_view(
        toks[k + 1 : close_at - 1] || ROW('eof', '', '', toks[close_at].pos)::@schema@.grammar_token,
        1, NULL, cte_names);
      n := n + 1;
      made := @schema@._scalar_part(sub, n, clause, outer_ast, ctes);
      found := found || jsonb_build_array(made || jsonb_build_object(
        'written', @schema@.grammar_text(toks, k, close_at + 1)));
      out_toks := out_toks || ROW('ident', made->>'placeholder', made->>'placeholder', toks[k].pos)::@schema@.grammar_token;
      k := close_at + 1;
    ELSE
      out_toks := out_toks || toks[k];
      k := k + 1;
    END IF;
  END LOOP;
  IF jsonb_array_length(found) = 0 THEN
    RETURN jsonb_build_object('expr', expr, 'scalars', found);
  END IF;
  RETURN jsonb_build_object('expr', @schema@.grammar_text(out_toks, 1, array_length(out_toks, 1)),
                            'scalars', found);
END
$fn$;

-- A statement's HAVING and SELECT list with a placeholder read as (array_agg(it))[1].
CREATE FUNCTION @schema@._scalar_wrap(ast jsonb, placeholder text)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT ast || jsonb_build_object(
    'having', replace(ast->>'having', placeholder, '(array_agg(' || placeholder || '))[1]'),
    'select', (SELECT jsonb_agg(i || jsonb_build_object(
                        'expr', replace(i->>'expr', placeholder, '(array_agg(' || placeholder || '))[1]'))
                      || CASE WHEN i->>'label_expr' IS NOT NULL THEN jsonb_build_object('label_expr',
                           replace(i->>'label_expr', placeholder, '(array_agg(' || placeholder || '))[1]')) ELSE '{}' END
                      ORDER BY o)
                 FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS x(i, o)))
$fn$;

-- A view's statement (AS form) with its scalar subqueries (SELECT list, WHERE, HAVING)
-- made parts of kind 'scalar', each joined under an alias "scalar#<n>" and read
-- through a placeholder expression (_scalar_part). The AST keeps how it was written
-- (`scalars`: [{placeholder, written}]): _scalar_as_written gives it back. A
-- statement without any is returned as it is.
CREATE FUNCTION @schema@._scalar_subqueries(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  ctes jsonb;
  res jsonb;
  s jsonb;
  all_found jsonb := '[]';
  n int := 0;
  item jsonb;
  k int;
  has_group boolean := jsonb_array_length(coalesce(ast->'group_by', '[]')) > 0;
  aggregating boolean;
  info jsonb;
  written jsonb := '[]';
  trial jsonb;
  wrapped boolean := false;
BEGIN
  IF ast->>'form' IS DISTINCT FROM 'as' OR ast->>'kind' IS DISTINCT FROM 'transform' OR ast ? 'scalars' THEN
    RETURN ast;
  END IF;
  -- Cheap test first: no "(SELECT" or "(WITH" in any expression.
  IF NOT (coalesce(ast->>'where', '') ~* '\(\s*(select|with)\M'
          OR coalesce(ast->>'having', '') ~* '\(\s*(select|with)\M'
          OR EXISTS (SELECT 1 FROM jsonb_array_elements(ast->'select') i
                      WHERE i->>'expr' ~* '\(\s*(select|with)\M')) THEN
    RETURN ast;
  END IF;
  ctes := coalesce((SELECT jsonb_agg(p ORDER BY o) FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
                     WHERE p->>'kind' = 'cte'), '[]');
  -- Postgres reads the statement as written first (names, scopes, one column each).
  PERFORM @schema@._analyze_query(@schema@._render_view_select(ast), 'in the definition');
  info := @schema@._view_parse(@schema@._render_view_select(ast));
  aggregating := has_group OR ast->>'having' IS NOT NULL OR coalesce((info->>'has_aggs')::boolean, false);

  IF ast->>'where' IS NOT NULL THEN
    res := @schema@._scalar_rewrite_expr(ast->>'where', n, 'WHERE', ast, ctes);
    ast := jsonb_set(ast, '{where}', res->'expr');
    all_found := all_found || (SELECT coalesce(jsonb_agg(f || '{"clause": "WHERE"}'), '[]') FROM jsonb_array_elements(res->'scalars') f);
    n := n + jsonb_array_length(res->'scalars');
  END IF;
  IF ast->>'having' IS NOT NULL THEN
    res := @schema@._scalar_rewrite_expr(ast->>'having', n, 'HAVING', ast, ctes);
    ast := jsonb_set(ast, '{having}', res->'expr');
    all_found := all_found || (SELECT coalesce(jsonb_agg(f || '{"clause": "HAVING"}'), '[]') FROM jsonb_array_elements(res->'scalars') f);
    n := n + jsonb_array_length(res->'scalars');
  END IF;
  FOR k IN 0 .. jsonb_array_length(ast->'select') - 1 LOOP
    item := ast->'select'->k;
    res := @schema@._scalar_rewrite_expr(item->>'expr', n, 'the SELECT list', ast, ctes);
    IF jsonb_array_length(res->'scalars') > 0 THEN
      item := item || jsonb_build_object('expr', res->'expr');
      -- A bare label after the subquery stays the label of the rewritten expression.
      IF item->>'label_expr' IS NOT NULL THEN
        item := item || jsonb_build_object('label_expr',
          @schema@._scalar_replace(item->>'label_expr', res->'scalars', false));
      END IF;
      ast := jsonb_set(ast, ARRAY['select', k::text], item);
      all_found := all_found || (SELECT coalesce(jsonb_agg(f || '{"clause": "SELECT"}'), '[]') FROM jsonb_array_elements(res->'scalars') f);
      n := n + jsonb_array_length(res->'scalars');
    END IF;
  END LOOP;
  IF n = 0 THEN
    RETURN ast;
  END IF;
  FOR s IN SELECT value FROM jsonb_array_elements(all_found) LOOP
    IF aggregating AND s->>'clause' <> 'WHERE' THEN
      IF (s->>'correlated')::boolean THEN
        PERFORM @schema@._fail('TRV01', format(
          'a correlated scalar subquery in %s of a statement that aggregates is not supported yet: move it into WHERE, or into a subquery in FROM',
          CASE s->>'clause' WHEN 'SELECT' THEN 'the SELECT list' ELSE s->>'clause' END));
      END IF;
      IF NOT has_group THEN
        PERFORM @schema@._fail('TRV01', format(
          'a scalar subquery in %s of an aggregate without GROUP BY is not supported yet: compute the aggregate in a WITH query, and compare with it in the statement around it',
          CASE s->>'clause' WHEN 'SELECT' THEN 'the SELECT list' ELSE s->>'clause' END));
      END IF;
    END IF;
    ast := jsonb_set(ast, '{parts}', coalesce(ast->'parts', '[]') || jsonb_build_array(s->'part'));
    ast := jsonb_set(ast, '{joins}', coalesce(ast->'joins', '[]') || jsonb_build_array(s->'join'));
  END LOOP;
  -- In HAVING or the SELECT list of a GROUP BY, outside an aggregate, the part's one row
  -- (the same in every row of a group) is read as (array_agg(v))[1]: a group is never
  -- empty, and its value is then the subquery's. Inside an aggregate's argument it stays
  -- a row's value. Tried whole, as Postgres reads the statement; left bare if that fails.
  trial := ast;
  FOR s IN SELECT value FROM jsonb_array_elements(all_found) LOOP
    IF aggregating AND s->>'clause' <> 'WHERE' THEN
      trial := @schema@._scalar_wrap(trial, s->>'placeholder');
    END IF;
  END LOOP;
  IF trial <> ast AND @schema@._view_parse(@schema@._render_view_select(trial)) IS NOT NULL THEN
    ast := trial;
    wrapped := true;
  END IF;
  FOR s IN SELECT value FROM jsonb_array_elements(all_found) LOOP
    written := written || jsonb_build_array(jsonb_build_object(
      'placeholder', CASE WHEN wrapped AND s->>'clause' <> 'WHERE'
                          THEN '(array_agg(' || (s->>'placeholder') || '))[1]'
                          ELSE s->>'placeholder' END,
      'written', s->>'written'));
  END LOOP;
  RETURN ast || jsonb_build_object('scalars', written);
END
$fn$;

-- A statement whose scalar subqueries were made parts (_scalar_subqueries), as it was
-- written: the subqueries in place of their placeholders, without the joins, GROUP BY
-- items and parts they became.
CREATE FUNCTION @schema@._scalar_as_written(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  sc jsonb := ast->'scalars';
BEGIN
  IF sc IS NULL THEN
    RETURN ast;
  END IF;
  RETURN (ast - 'scalars') || jsonb_build_object(
    'where', @schema@._scalar_replace(ast->>'where', sc, true),
    'having', @schema@._scalar_replace(ast->>'having', sc, true),
    'select', coalesce((
      SELECT jsonb_agg(i || jsonb_build_object(
               'expr', @schema@._scalar_replace(i->>'expr', sc, true))
               || CASE WHEN i ? 'label_expr'
                       THEN jsonb_build_object('label_expr', @schema@._scalar_replace(i->>'label_expr', sc, true))
                       ELSE '{}' END ORDER BY o)
        FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS x(i, o)), '[]'),
    'joins', coalesce((
      SELECT jsonb_agg(j ORDER BY o)
        FROM jsonb_array_elements(coalesce(ast->'joins', '[]')) WITH ORDINALITY AS x(j, o)
       WHERE j->>'part_kind' IS DISTINCT FROM 'scalar'), '[]'),
    'parts', coalesce((
      SELECT jsonb_agg(p ORDER BY o)
        FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
       WHERE p->>'kind' IS DISTINCT FROM 'scalar'), '[]'));
END
$fn$;

-- A scalar subquery's join as the engine reads it, before its part is defined: the part's
-- SELECT as a derived table under its alias.
CREATE FUNCTION @schema@._render_scalar_item(ast jsonb, item jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  p jsonb;
BEGIN
  SELECT x INTO p FROM jsonb_array_elements(ast->'parts') x
   WHERE x->>'kind' = 'scalar' AND x->>'name' = item->>'part';
  RETURN '(' || @schema@._render_view_select(p->'ast') || ') AS ' || quote_ident(item->>'alias') || ' (v)';
END
$fn$;

-- 0040: _render_view_item as in 0036, and a scalar subquery's part (before it is bound).
CREATE OR REPLACE FUNCTION @schema@._render_view_item(ast jsonb, item jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  p jsonb;
BEGIN
  -- 0040: a scalar subquery's part.
  IF item->>'part_kind' = 'scalar' THEN RETURN @schema@._render_scalar_item(ast, item); END IF;
  IF item->>'part_kind' = 'derived' THEN
    SELECT x INTO p FROM jsonb_array_elements(ast->'parts') x
     WHERE x->>'kind' = 'derived' AND x->>'name' = item->>'part';
    RETURN '(' || @schema@._render_view_select(p->'ast') || ') AS ' || quote_ident(p->>'name')
      || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o)
                             FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o)) || ')', '');
  ELSIF item->>'part_kind' = 'cte' THEN
    RETURN quote_ident(item->>'part')
      || CASE WHEN coalesce((item->>'alias_implicit')::boolean, false) THEN ''
              ELSE coalesce(' AS ' || quote_ident(item->>'alias'), '') END;
  END IF;
  RETURN @schema@.grammar_render_name(item->>'schema', item->>'name')
    || coalesce(' AS ' || quote_ident(item->>'alias'), '');
END
$fn$;

-- 0040: _render_view_select as in 0036; a statement whose scalar subqueries were made
-- parts is rendered as written.
CREATE OR REPLACE FUNCTION @schema@._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  is_distinct boolean := coalesce((ast ->> 'distinct')::boolean, false);
  with_ text;
BEGIN
  -- 0040: scalar subqueries made parts are shown as written.
  IF ast ? 'scalars' THEN ast := @schema@._scalar_as_written(ast); is_distinct := coalesce((ast ->> 'distinct')::boolean, false); END IF;
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  RETURN coalesce(with_, '')
    || 'SELECT ' || CASE WHEN is_distinct THEN 'DISTINCT ' ELSE '' END || (
         SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
                           ', ' ORDER BY ordinality)
           FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY)
    || ' FROM ' || @schema@._render_view_item(ast, ast->'from')
    || coalesce((
         SELECT string_agg(
                  CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
                  || @schema@._render_view_item(ast, j) || ' ON ' || (j ->> 'on'), '' ORDER BY o)
           FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '')
    || coalesce(' WHERE ' || (ast ->> 'where'), '')
    || CASE WHEN is_distinct THEN '' ELSE coalesce(' GROUP BY ' || (
         SELECT string_agg(value, ', ' ORDER BY ordinality)
           FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '') END
    || coalesce(' HAVING ' || (ast ->> 'having'), '');
END
$fn$;

-- 0040: _define_parts as in 0036, with scalar subqueries' parts named in messages, and a
-- part of one row (aggregates without GROUP BY) read by a constant key (_one_row_part_key)
-- instead of refused.
CREATE OR REPLACE FUNCTION @schema@._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
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
                               -- 0040
                               WHEN 'scalar' THEN format('scalar subquery in %s', part->>'clause')
                               ELSE format('subquery %I in FROM', part->>'name') END;
    hidden := 'trellis#' || root || '#' || path || (part->>'name');
    IF octet_length(hidden) > 63 THEN
      PERFORM @schema@._fail('TRV01', format(
        'the %s is kept in a hidden target named %s, longer than 63 bytes: give it, or the transform, a shorter name',
        what, hidden));
    END IF;
    -- A table of that reserved name that no transform keeps is a part's target loaded
    -- from a schema dump (restore_definition defines the statement again): the part makes
    -- its own, and builds it.
    IF to_regclass(quote_ident(tschema) || '.' || quote_ident(hidden)) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM @schema@.transforms t
                        WHERE t.target_schema = tschema AND t.target_name = hidden) THEN
      EXECUTE format('DROP TABLE %I.%I', tschema, hidden);
    END IF;
    res := @schema@._define_parts(part->'ast', root, path || (part->>'name') || '.', scope);
    ids := ids || (res->'ids');
    sub := res->'ast';
    -- Column aliases name the part's columns, in order; Postgres refuses more of them than
    -- columns (the statement was checked whole before this).
    cols := coalesce(part->'columns', '[]');
    IF jsonb_array_length(cols) > jsonb_array_length(sub->'select') THEN
      PERFORM @schema@._fail('TRV01', format('the %s has %s columns available but %s columns specified',
        what, jsonb_array_length(sub->'select'), jsonb_array_length(cols)));
    END IF;
    FOR k IN 0 .. jsonb_array_length(cols) - 1 LOOP
      item := sub->'select'->k;
      -- A bare label (`count(*) n`) gives way to the alias: the expression without it, when
      -- Postgres reads it as a label (as _distinct_groups decides it).
      IF item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL THEN
        info := @schema@._analyze_query('SELECT ' || (item->>'expr') || ' FROM ' || @schema@._view_from_sql(sub),
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
    PERFORM @schema@._define_one(sub, NULL);
    SELECT t.id, t.spec INTO part_id, spec FROM @schema@.transforms t
     WHERE t.target_schema = tschema AND t.target_name = hidden;
    -- Its count() columns are never NULL: declared so, a GROUP BY of one around it is a key.
    IF (spec->>'aggregates')::boolean THEN
      FOR item IN SELECT c FROM jsonb_array_elements(spec->'columns') c
                   WHERE NOT (c->>'is_key')::boolean AND c->>'type' = 'bigint'
                     AND @schema@._is_count_call(c->>'expression') LOOP
        EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET NOT NULL', tschema, hidden, item->>'name');
        -- Recorded in its spec too: a target made again from it (a halt's repair) says so.
        UPDATE @schema@.transforms t
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
      -- 0040: a part of one row is read by a constant key.
      PERFORM @schema@._one_row_part_key(tschema, hidden);
    END IF;
    IF (spec->>'key_nullable')::boolean THEN
      PERFORM @schema@._fail('TRV01', format(
        'the %s is keyed by (%s), which can be NULL (a LEFT JOIN''s side, or a GROUP BY of a column that is not NOT NULL): the statement around a subquery reads its rows by a key that is never NULL. Group by columns declared NOT NULL (or filter the NULLs out and coalesce the column)',
        what, (SELECT string_agg(k2, ', ') FROM jsonb_array_elements_text(spec->'key') k2)));
    END IF;
    UPDATE @schema@.transforms SET part_name = path || (part->>'name') WHERE id = part_id;
    ids := ids || to_jsonb(part_id);
    scope := scope || jsonb_build_object((part->>'kind') || ':' || (part->>'name'), hidden);
  END LOOP;
  ast := jsonb_set(ast, '{from}', @schema@._bind_part_item(ast->'from', scope));
  ast := jsonb_set(ast, '{joins}', coalesce((
    SELECT jsonb_agg(@schema@._bind_part_item(j, scope) ORDER BY o)
      FROM jsonb_array_elements(coalesce(ast->'joins', '[]')) WITH ORDINALITY AS x(j, o)), '[]'));
  RETURN jsonb_build_object('ast', ast, 'ids', ids);
END
$fn$;

-- 0040: _define as in 0036, with scalar subqueries made parts first (_scalar_subqueries).
CREATE OR REPLACE FUNCTION @schema@._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
  tname text := ast->'target'->>'name';
  res jsonb;
  result jsonb;
BEGIN
  IF starts_with(tname, 'trellis#') THEN
    PERFORM @schema@._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): choose another target name',
      tname));
  END IF;
  -- 0040: scalar subqueries become parts.
  ast := @schema@._scalar_subqueries(ast);
  IF jsonb_array_length(coalesce(ast->'parts', '[]')) = 0 THEN
    RETURN @schema@._define_one(ast, statement);
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM @schema@._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  -- Postgres reads the statement as written first: names, column aliases, scopes.
  PERFORM @schema@._analyze_query(@schema@._render_view_select(ast), 'in the definition');
  -- 0040: as the engine reads it (scalar subqueries as their parts).
  PERFORM @schema@._refuse_view_sublinks(ast - 'scalars');
  res := @schema@._define_parts(ast, tname, '', '{}');
  result := @schema@._define_one(res->'ast', statement);
  UPDATE @schema@.transforms p SET part_of = t.id
    FROM @schema@.transforms t
   WHERE t.target_schema = tschema AND t.target_name = tname
     AND p.id IN (SELECT (x)::int FROM jsonb_array_elements_text(res->'ids') x);
  RETURN result;
END
$fn$;
