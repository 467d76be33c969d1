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
-- _scalar_as_written (the statement as written, for rendering), _render_scalar_item,
-- _scalar_render, _scalar_rewrite_expr, _scalar_replace, _scalar_wrap; and for
-- comma-separated FROM lists (FROM a, b WHERE ...: inner joins, WHERE's conditions moved
-- into their ON) _comma_joins, _comma_as_table.
-- Replaced (their latest bodies, 0036, copied; each change marked "0040"):
-- _render_view_item, _render_view_select, _define_parts, _define (0039's _define_before_semi),
-- grammar_parse_view (the
-- four-argument form).

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
      -- A subquery the view grammar cannot read (no FROM: `(SELECT 1)`, a set operation...)
      -- is refused as a subquery of its clause, not as a syntax error of the statement.
      BEGIN
        sub := @schema@.grammar_parse_view(
          toks[k + 1 : close_at - 1] || ROW('eof', '', '', toks[close_at].pos)::@schema@.grammar_token,
          1, NULL, cte_names);
      EXCEPTION WHEN SQLSTATE 'TRP01' THEN
        PERFORM @schema@._fail('TRV01', format(
          'a subquery in %s is not supported yet here: as a scalar subquery it must read a table (SELECT <aggregate> FROM ...): %s',
          clause, SQLERRM));
      END;
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
  cands int[];
  m int;
  mask int;
  wrapped_set int[] := '{}';
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
  -- Which of them to wrap: the first choice Postgres accepts, trying every one wrapped
  -- first, then fewer (a subquery inside an aggregate's argument stays bare).
  cands := ARRAY(SELECT x.ord::int - 1 FROM jsonb_array_elements(all_found) WITH ORDINALITY AS x(found_item, ord)
                  WHERE aggregating AND x.found_item->>'clause' <> 'WHERE');
  m := least(cardinality(cands), 6);
  IF m > 0 THEN
    FOR mask IN SELECT g.b FROM generate_series(0, (1 << m) - 1) AS g(b)
                 ORDER BY length(replace(g.b::bit(6)::text, '0', '')), g.b LOOP
      trial := ast;
      FOR k IN 1 .. m LOOP
        IF mask & (1 << (k - 1)) = 0 THEN
          trial := @schema@._scalar_wrap(trial, all_found->(cands[k])->>'placeholder');
        END IF;
      END LOOP;
      IF @schema@._view_parse(@schema@._render_view_select(trial)) IS NOT NULL THEN
        ast := trial;
        wrapped_set := ARRAY(SELECT cands[g.j] FROM generate_series(1, m) AS g(j) WHERE mask & (1 << (g.j - 1)) = 0);
        EXIT;
      END IF;
    END LOOP;
  END IF;
  FOR k IN 0 .. jsonb_array_length(all_found) - 1 LOOP
    s := all_found->k;
    written := written || jsonb_build_array(jsonb_build_object(
      'placeholder', CASE WHEN k = ANY (wrapped_set)
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

-- A comma-separated FROM list (FROM a, b, c WHERE ...), parsed as inner joins ON true
-- (marked `comma`), with each top-level conjunct of WHERE that needs a comma-joined table
-- moved into that join's ON: the first join after which Postgres can read it (its
-- equalities are then the join's columns, found by index, as JOIN ... ON's are). For inner
-- joins, a condition in ON or in WHERE is the same. A conjunct with a subquery stays in
-- WHERE. Parts already bound to their targets are read as those tables.
CREATE FUNCTION @schema@._comma_joins(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  joins jsonb := coalesce(ast->'joins', '[]');
  n int := jsonb_array_length(coalesce(ast->'joins', '[]'));
  conj text;
  kept text[] := '{}';
  k int;
  placed boolean;
  probe jsonb;
BEGIN
  IF ast->>'where' IS NULL OR NOT EXISTS (
       SELECT 1 FROM jsonb_array_elements(joins) j WHERE coalesce((j->>'comma')::boolean, false)) THEN
    RETURN ast;
  END IF;
  probe := (ast - 'scalars') || jsonb_build_object(
    'select', jsonb_build_array(jsonb_build_object('expr', '1', 'name', 'x')),
    'group_by', '[]'::jsonb, 'having', NULL, 'distinct', false,
    'from', @schema@._comma_as_table(ast->'from'));
  -- Bound throughout (a part's own statement): its WITH queries are tables already.
  IF ast->'from'->>'schema' IS NOT NULL AND NOT EXISTS (
       SELECT 1 FROM jsonb_array_elements(joins) j WHERE j->>'part' IS NOT NULL AND j->>'schema' IS NULL) THEN
    probe := probe || jsonb_build_object('parts', '[]'::jsonb);
  END IF;
  FOREACH conj IN ARRAY @schema@._split_conjuncts(ast->>'where') LOOP
    placed := false;
    IF conj !~* '\(\s*(select|with)\M' THEN
      FOR k IN 0 .. n LOOP
        IF @schema@._view_parse(@schema@._render_view_select(probe || jsonb_build_object(
             'where', conj,
             'joins', coalesce((SELECT jsonb_agg(@schema@._comma_as_table(j) ORDER BY o)
                                  FROM jsonb_array_elements(joins) WITH ORDINALITY AS x(j, o)
                                 WHERE o <= k), '[]')))) IS NOT NULL THEN
          IF k > 0 AND coalesce((joins->(k - 1)->>'comma')::boolean, false) THEN
            joins := jsonb_set(joins, ARRAY[(k - 1)::text, 'on'], to_jsonb(
              CASE WHEN joins->(k - 1)->>'on' = 'true' THEN conj
                   ELSE (joins->(k - 1)->>'on') || ' AND ' || conj END));
            placed := true;
          END IF;
          EXIT;
        END IF;
      END LOOP;
    END IF;
    IF NOT placed THEN
      kept := kept || conj;
    END IF;
  END LOOP;
  RETURN ast || jsonb_build_object(
    'joins', (SELECT jsonb_agg(j - 'comma' ORDER BY o) FROM jsonb_array_elements(joins) WITH ORDINALITY AS x(j, o)),
    'where', CASE WHEN cardinality(kept) > 0 THEN array_to_string(kept, ' AND ') END);
END
$fn$;

-- A FROM or JOIN item bound to a part's target (schema set) read as that table; any other
-- as it is.
CREATE FUNCTION @schema@._comma_as_table(item jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE WHEN item->>'part' IS NOT NULL AND item->>'schema' IS NOT NULL
              THEN item - 'part' - 'part_kind' - 'alias_implicit'
              ELSE item END
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
    -- 0040: a comma-separated FROM list's conditions go to its joins.
    sub := @schema@._comma_joins(sub);
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
-- Migration 0039 renamed 0036's _define to _define_before_semi (its _define rewrites
-- semi-joins, then calls it): this replaces that body, so both rewrites stay in force.
CREATE OR REPLACE FUNCTION @schema@._define_before_semi(ast jsonb, statement text)
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
  -- 0040: a comma-separated FROM list's conditions go to its joins; scalar subqueries
  -- become parts.
  ast := @schema@._comma_joins(ast);
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

-- 0040: grammar_parse_view (the four-argument form) as in 0036, with a comma-separated
-- FROM list read as inner joins ON true, marked `comma` (_comma_joins moves WHERE's
-- conditions into them when the statement is defined).
CREATE OR REPLACE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token := toks[i];
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
  last @schema@.grammar_token;
  before @schema@.grammar_token;
  -- 0036
  parts jsonb := '[]';
  cte_name text;
  cte_cols jsonb;
  cte_pos int;
  sub jsonb;
  part jsonb;
  derived jsonb;
BEGIN
  IF @schema@.grammar_kw(t, 'with') THEN
    IF @schema@.grammar_kw(toks[i + 1], 'recursive') THEN
      PERFORM @schema@.grammar_refuse('a recursive WITH clause (WITH RECURSIVE) is not supported', t.pos);
    END IF;
    -- 0036: WITH name [(columns)] AS [[NOT] MATERIALIZED] (<select>) {, ...}: each a part,
    -- in scope for the queries after it and for the SELECT.
    i := i + 1;
    LOOP
      cte_pos := toks[i].pos;
      cte_name := @schema@.grammar_name(toks[i], 'a WITH query name', true);
      i := i + 1;
      cte_cols := NULL;
      IF toks[i].kind = 'punct' AND toks[i].text = '(' THEN
        SELECT q.names, q.next INTO cte_cols, i
          FROM @schema@.grammar_name_list(toks, i, 'a column name') q;
      END IF;
      IF NOT @schema@.grammar_kw(toks[i], 'as') THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'AS and the WITH query in parentheses');
      END IF;
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'not') AND @schema@.grammar_kw(toks[i + 1], 'materialized') THEN
        i := i + 2;
      ELSIF @schema@.grammar_kw(toks[i], 'materialized') THEN
        i := i + 1;
      END IF;
      IF NOT (toks[i].kind = 'punct' AND toks[i].text = '(') THEN
        PERFORM @schema@.grammar_unexpected(toks, i, '"(" and the WITH query');
      END IF;
      IF NOT (@schema@.grammar_kw(toks[i + 1], 'select') OR @schema@.grammar_kw(toks[i + 1], 'with')) THEN
        PERFORM @schema@.grammar_refuse(
          'a WITH query that is not a SELECT (INSERT, UPDATE, DELETE, VALUES) is not supported',
          toks[i + 1].pos);
      END IF;
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(parts) p WHERE p->>'name' = cte_name) THEN
        PERFORM @schema@.grammar_fail(format('WITH query name %s is given more than once', cte_name),
          cte_pos);
      END IF;
      SELECT q.ast, q.next INTO sub, i FROM @schema@.grammar_subselect(toks, i, ctes) q;
      parts := parts || jsonb_build_array(jsonb_build_object(
        'name', cte_name, 'kind', 'cte', 'columns', coalesce(cte_cols, '[]'), 'ast', sub,
        'position', cte_pos));
      ctes := ctes || jsonb_build_object(cte_name, true);
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    t := toks[i];
    IF NOT @schema@.grammar_kw(t, 'select') THEN
      PERFORM @schema@.grammar_unexpected(toks, i, '",", or SELECT after the WITH queries');
    END IF;
  ELSIF t.kind = 'punct' AND t.text = '(' THEN
    PERFORM @schema@.grammar_refuse(
      'a SELECT in parentheses is not supported yet: write it without them', t.pos);
  ELSIF @schema@.grammar_kw(t, 'values') OR @schema@.grammar_kw(t, 'table') THEN
    PERFORM @schema@.grammar_refuse(format('%s is not supported: write a SELECT', upper(t.value)),
      t.pos);
  ELSIF NOT @schema@.grammar_kw(t, 'select') THEN
    PERFORM @schema@.grammar_unexpected(toks, i, 'SELECT after AS');
  END IF;
  i := i + 1;
  IF @schema@.grammar_kw(toks[i], 'distinct') THEN
    IF @schema@.grammar_kw(toks[i + 1], 'on') THEN
      PERFORM @schema@.grammar_refuse('DISTINCT ON is not supported yet', toks[i].pos);
    END IF;
    distinct_ := true;
    i := i + 1;
  ELSIF @schema@.grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  -- The SELECT list, as in the FROM-first form (0024).
  LOOP
    start := i;
    e := @schema@.grammar_scan(toks, i);
    IF e = start THEN
      PERFORM @schema@.grammar_view_clause(toks, e);
      PERFORM @schema@.grammar_unexpected(toks, e, 'a select item');
    END IF;
    IF (e = start + 1 AND toks[start].text = '*')
      OR (e >= start + 2 AND toks[e - 1].text = '*' AND toks[e - 2].kind = 'punct'
          AND toks[e - 2].text = '.') THEN
      PERFORM @schema@.grammar_fail(format(
        'name each column: SELECT * is not supported (expected an expression, found %s)',
        @schema@.grammar_describe(toks[e - 1])), toks[start].pos);
    END IF;
    nm := NULL;
    label := NULL;
    label_expr := NULL;
    IF @schema@.grammar_kw(toks[e], 'as') THEN
      nm := @schema@.grammar_name(toks[e + 1], 'a column name after AS', false);
      i := e + 2;
    ELSE
      i := e;
      IF e >= start + 2 THEN
        last := toks[e - 1];
        before := toks[e - 2];
        IF (last.kind = 'ident'
            OR (last.kind = 'word' AND @schema@.grammar_keyword_class(last.value) IS NULL))
          AND before.kind <> 'op'
          AND NOT (before.kind = 'punct' AND before.text IN ('.', '::')) THEN
          label := @schema@.grammar_name(last, 'a column name', false);
          label_expr := @schema@.grammar_text(toks, start, e - 1);
        END IF;
      END IF;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', @schema@.grammar_text(toks, start, e), 'name', nm, 'bare_label', label,
      'label_expr', label_expr, 'position', toks[start].pos));
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;

  IF NOT @schema@.grammar_kw(toks[i], 'from') THEN
    PERFORM @schema@.grammar_view_clause(toks, i);
    PERFORM @schema@.grammar_unexpected(toks, i, '",", or FROM and the tables');
  END IF;
  -- 0036: a table, a WITH query or a derived table.
  SELECT q.schema_name, q.rel_name, q.alias, q.part, q.derived, q.next
    INTO sch, nm, alias, part, derived, i
    FROM @schema@.grammar_view_item(toks, i + 1, 'a source table name', ctes) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias) || coalesce(part, '{}');
  IF derived IS NOT NULL THEN
    parts := parts || jsonb_build_array(derived);
  END IF;

  LOOP
    t := toks[i];
    IF t.kind = 'punct' AND t.text = ',' THEN
      -- 0040: a comma-separated FROM list: an inner join (its conditions found in WHERE).
      jt := 'comma';
      i := i + 1;
    ELSIF t.kind = 'word' AND t.value IN ('right', 'full')
      AND (@schema@.grammar_kw(toks[i + 1], 'join') OR @schema@.grammar_kw(toks[i + 1], 'outer')) THEN
      PERFORM @schema@.grammar_refuse(format('a %s JOIN is not supported yet', upper(t.value)), t.pos);
    ELSIF @schema@.grammar_kw(t, 'cross') AND @schema@.grammar_kw(toks[i + 1], 'join') THEN
      PERFORM @schema@.grammar_refuse('CROSS JOIN is not supported yet', t.pos);
    ELSIF @schema@.grammar_kw(t, 'natural') THEN
      PERFORM @schema@.grammar_refuse('NATURAL JOIN is not supported yet: write JOIN ... ON', t.pos);
    ELSIF @schema@.grammar_kw(t, 'join') THEN
      jt := 'inner';
      i := i + 1;
    ELSIF @schema@.grammar_kw(t, 'inner') THEN
      IF NOT @schema@.grammar_kw(toks[i + 1], 'join') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 1, 'JOIN after INNER');
      END IF;
      jt := 'inner';
      i := i + 2;
    ELSIF @schema@.grammar_kw(t, 'left') AND coalesce(toks[i + 1].text, '') <> '(' THEN
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'outer') THEN
        i := i + 1;
      END IF;
      IF NOT @schema@.grammar_kw(toks[i], 'join') THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'JOIN after LEFT');
      END IF;
      jt := 'left';
      i := i + 1;
    ELSE
      EXIT;
    END IF;
    -- 0036: a table, a WITH query or a derived table.
    SELECT q.schema_name, q.rel_name, q.alias, q.part, q.derived, q.next
      INTO sch, nm, alias, part, derived, i
      FROM @schema@.grammar_view_item(toks, i, 'a table name after JOIN', ctes) q;
    IF derived IS NOT NULL THEN
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(parts) p
                  WHERE p->>'kind' = 'derived' AND p->>'name' = derived->>'name') THEN
        PERFORM @schema@.grammar_fail(format('table name %s is given more than once', derived->>'name'),
          (derived->>'position')::int);
      END IF;
      parts := parts || jsonb_build_array(derived);
    END IF;
    -- 0040
    IF jt = 'comma' THEN joins := joins || jsonb_build_array(jsonb_build_object('type', 'inner', 'comma', true, 'schema', sch, 'name', nm, 'alias', alias, 'on', 'true') || coalesce(part, '{}')); CONTINUE; END IF;
    IF @schema@.grammar_kw(toks[i], 'using') THEN
      PERFORM @schema@.grammar_refuse('JOIN ... USING is not supported yet: write ON', toks[i].pos);
    END IF;
    IF NOT @schema@.grammar_kw(toks[i], 'on') THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'ON and a join condition');
    END IF;
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', @schema@.grammar_text(toks, i, e)) || coalesce(part, '{}'));
    i := e;
  END LOOP;
  expected := 'JOIN, WHERE, GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';

  IF @schema@.grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := @schema@.grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'group') AND @schema@.grammar_kw(toks[i + 1], 'by') THEN
    IF distinct_ THEN
      PERFORM @schema@.grammar_refuse('SELECT DISTINCT with GROUP BY is not supported yet', toks[i].pos);
    END IF;
    i := i + 2;
    IF @schema@.grammar_kw(toks[i], 'all') THEN
      PERFORM @schema@.grammar_fail(format(
        'GROUP BY ALL is not supported: expected the GROUP BY expressions, found %s',
        @schema@.grammar_describe(toks[i])), toks[i].pos);
    END IF;
    IF @schema@.grammar_kw(toks[i], 'distinct') THEN
      PERFORM @schema@.grammar_fail(format(
        'grouping sets are not supported: expected the GROUP BY expressions, found %s',
        @schema@.grammar_describe(toks[i])), toks[i].pos);
    END IF;
    LOOP
      IF ((@schema@.grammar_kw(toks[i], 'rollup') OR @schema@.grammar_kw(toks[i], 'cube'))
          AND toks[i + 1].text = '(')
        OR (@schema@.grammar_kw(toks[i], 'grouping') AND @schema@.grammar_kw(toks[i + 1], 'sets'))
        OR (toks[i].text = '(' AND toks[i + 1].text = ')')
      THEN
        PERFORM @schema@.grammar_fail(format(
          'grouping sets are not supported: expected a GROUP BY expression, found %s',
          @schema@.grammar_describe(toks[i])), toks[i].pos);
      END IF;
      e := @schema@.grammar_scan(toks, i);
      IF e = i THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'a GROUP BY expression');
      END IF;
      group_by := group_by || jsonb_build_array(@schema@.grammar_text(toks, i, e));
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'having') THEN
    IF distinct_ THEN
      PERFORM @schema@.grammar_refuse('SELECT DISTINCT with HAVING is not supported yet', toks[i].pos);
    END IF;
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := @schema@.grammar_text(toks, i, e);
    i := e;
    expected := 'ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  -- A set operation or a WINDOW clause here is refused by name before ORDER BY is read.
  PERFORM @schema@.grammar_view_clause(toks, i);

  -- ORDER BY: read, and dropped (a table has no order; ADR 0049). Its expressions are not
  -- checked: they never run.
  IF @schema@.grammar_kw(toks[i], 'order') AND @schema@.grammar_kw(toks[i + 1], 'by') THEN
    i := i + 2;
    LOOP
      e := @schema@.grammar_scan(toks, i);
      IF e = i THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'an ORDER BY expression');
      END IF;
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  PERFORM @schema@.grammar_view_clause(toks, i);

  -- WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY, each at most once, in either order.
  WHILE @schema@.grammar_kw(toks[i], 'without') LOOP
    IF @schema@.grammar_kw(toks[i + 1], 'source') AND NOT wsi THEN
      IF NOT @schema@.grammar_kw(toks[i + 2], 'index') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 2, 'INDEX after WITHOUT SOURCE');
      END IF;
      wsi := true;
    ELSIF @schema@.grammar_kw(toks[i + 1], 'row') AND NOT wrs THEN
      IF NOT @schema@.grammar_kw(toks[i + 2], 'security') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 2, 'SECURITY after WITHOUT ROW');
      END IF;
      wrs := true;
    ELSE
      PERFORM @schema@.grammar_unexpected(toks, i + 1, CASE
        WHEN wsi THEN 'ROW SECURITY after WITHOUT' WHEN wrs THEN 'SOURCE INDEX after WITHOUT'
        ELSE 'SOURCE INDEX or ROW SECURITY after WITHOUT' END);
    END IF;
    i := i + 3;
    expected := CASE WHEN wsi AND wrs THEN 'end of statement'
      WHEN wsi THEN 'WITHOUT ROW SECURITY or end of statement'
      ELSE 'WITHOUT SOURCE INDEX or end of statement' END;
  END LOOP;

  PERFORM @schema@.grammar_end(toks, i, expected);
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
