-- RIGHT and FULL joins in a view's SQL (issue #26, item 1; ADR 0066):
--
--   ... FROM a RIGHT [OUTER] JOIN b ON cond [further joins] ...
--     is kept as  FROM b LEFT JOIN a ON cond [further joins]  (the same rows; the SELECT
--     list is written item by item, so the columns keep their order);
--   ... FROM a FULL [OUTER] JOIN b ON cond [further joins] [WHERE w] ...
--     is kept as the UNION ALL (ADR 0059) of two branches:
--       SELECT ... FROM a LEFT JOIN b ON cond [further joins] [WHERE w]
--       SELECT ... FROM b LEFT JOIN a ON cond [further joins] WHERE ROW(a.*) IS NULL [AND w]
--     the second holding b's rows no row of a matches, with a's columns NULL (the LEFT
--     JOIN's own NULLs: a row of b that some row of a matches makes rows whose a has its
--     key, never NULL; one no row of a matches makes one row whose a is all NULL, whatever
--     cond makes of NULLs). SELECT DISTINCT over a FULL JOIN is a UNION of the
--     two. GROUP BY, HAVING and aggregates over a FULL JOIN are refused (a union's
--     branches are grouped apart): the FULL JOIN goes in a subquery in FROM.
--
-- LATERAL (CROSS JOIN LATERAL unnest(...), a correlated subquery) is refused by name here.
--
-- Only as the first join of its FROM (a RIGHT or FULL JOIN after other joins joins their
-- result, which one LEFT JOIN chain cannot say). The statement is recorded and shown as
-- written: the compiled AST keeps the parsed one under "written" (render_statement shows
-- that), and everything else (analysis, parts, capture, the drain) sees only what it was
-- compiled into.
--
-- Renamed and wrapped (statements without these joins go straight through, so whichever
-- migration wrote them last stays in force): grammar_parse_block (0041) ->
-- grammar_parse_block_before_joins, grammar_parse_view (four arguments, 0041) ->
-- grammar_parse_view_before_joins, _render_view_select (0041) ->
-- _render_view_select_before_joins, render_statement (0041) -> render_statement_before_joins,
-- _define_parts (0041) -> _define_parts_before_joins. No body is replaced.

ALTER FUNCTION @schema@.grammar_parse_block(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block_before_joins;
ALTER FUNCTION @schema@.grammar_parse_view(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_view_before_joins;
ALTER FUNCTION @schema@._render_view_select(jsonb) RENAME TO _render_view_select_before_joins;
ALTER FUNCTION @schema@.render_statement(jsonb) RENAME TO render_statement_before_joins;
ALTER FUNCTION @schema@._define_parts(jsonb, text, text, jsonb) RENAME TO _define_parts_before_joins;

-- Whether token k starts RIGHT [OUTER] JOIN or FULL [OUTER] JOIN: its word, or NULL.
CREATE FUNCTION @schema@._outer_join_at(toks @schema@.grammar_token[], k int)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT CASE WHEN toks[k].kind = 'word' AND toks[k].value IN ('right', 'full')
               AND (@schema@.grammar_kw(toks[k + 1], 'join')
                    OR (@schema@.grammar_kw(toks[k + 1], 'outer') AND @schema@.grammar_kw(toks[k + 2], 'join')))
              THEN toks[k].value END
$fn$;

-- A SELECT block (grammar_parse_block's) with a RIGHT or FULL JOIN as its first join,
-- compiled as the header says; any other block as before.
CREATE FUNCTION @schema@.grammar_parse_block(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  f int;
  first_join int;
  outer_at int;
  kind text;
  w text;
  ast jsonb;
  j0 jsonb;
  swapped jsonb;
  written jsonb;
  b1 jsonb;
  b2 jsonb;
  cte_parts jsonb;
  other_parts jsonb;
  cond text;
  where2 text;
  has_or boolean := false;
  wt @schema@.grammar_token[];
  wk int;
  wd int := 0;
BEGIN
  -- The block's FROM, its first join, and the RIGHT or FULL JOINs, at the top level.
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND f IS NULL AND @schema@.grammar_kw(toks[k], 'from') THEN
      f := k;
    ELSIF d = 0 AND f IS NOT NULL THEN
      IF @schema@.grammar_kw(toks[k], 'lateral') THEN
        PERFORM @schema@.grammar_refuse(
          'LATERAL is not supported yet: neither CROSS JOIN LATERAL over a set-returning function of the row (unnest(...) [WITH ORDINALITY], jsonb_array_elements(...)) nor a correlated subquery in FROM is maintained',
          toks[k].pos);
      END IF;
      IF first_join IS NULL AND (
           (toks[k].kind = 'punct' AND toks[k].text = ',')
           OR (toks[k].kind = 'word' AND toks[k].value IN ('join', 'inner', 'cross', 'natural'))
           OR (@schema@.grammar_kw(toks[k], 'left') AND coalesce(toks[k + 1].text, '') <> '(')
           OR @schema@._outer_join_at(toks, k) IS NOT NULL) THEN
        first_join := k;
      END IF;
      IF @schema@._outer_join_at(toks, k) IS NOT NULL THEN
        IF k <> first_join THEN
          PERFORM @schema@.grammar_refuse(format(
            'a %s JOIN after another join is not supported yet: make it the first join of FROM (FROM a %s JOIN b ON ... JOIN c ON ...), or write it as a LEFT JOIN',
            upper(toks[k].value), upper(toks[k].value)), toks[k].pos);
        END IF;
        outer_at := k;
        kind := toks[k].value;
      END IF;
    END IF;
    k := k + 1;
  END LOOP;
  IF outer_at IS NULL THEN
    RETURN @schema@.grammar_parse_block_before_joins(toks, i, target, ctes);
  END IF;

  -- Parsed as a LEFT JOIN in the order written: the statement as written, but its first
  -- join's type.
  toks[outer_at] := ROW('word', 'LEFT', 'left', toks[outer_at].pos)::@schema@.grammar_token;
  ast := @schema@.grammar_parse_block_before_joins(toks, i, target, ctes);
  written := ast || jsonb_build_object('written_join', kind);
  j0 := ast->'joins'->0;
  -- The sides swapped: b LEFT JOIN a ON cond, then the further joins.
  swapped := ast || jsonb_build_object(
    'from', j0 - 'type' - 'on',
    'joins', jsonb_build_array((ast->'from') || jsonb_build_object('type', 'left', 'on', j0->>'on'))
             || ((ast->'joins') - 0));

  IF kind = 'right' THEN
    RETURN swapped || jsonb_build_object('written', written);
  END IF;

  -- FULL JOIN.
  IF jsonb_array_length(coalesce(ast->'group_by', '[]')) > 0 OR ast->>'having' IS NOT NULL THEN
    PERFORM @schema@.grammar_refuse(
      'GROUP BY or HAVING over a FULL JOIN is not supported yet: put the FULL JOIN in a subquery in FROM (SELECT ... FROM (SELECT ... FROM a FULL JOIN b ON ...) AS j GROUP BY ...)',
      toks[outer_at].pos);
  END IF;
  cond := j0->>'on';
  w := ast->>'where';
  IF w IS NOT NULL THEN
    -- w is AND-ed as it is (its conjuncts stay at the top, where semi-joins are found)
    -- unless it has an OR at its top level.
    wt := @schema@.grammar_tokenize(w);
    FOR wk IN 1 .. coalesce(array_length(wt, 1), 0) LOOP
      IF wt[wk].kind = 'punct' AND wt[wk].text IN ('(', '[') THEN
        wd := wd + 1;
      ELSIF wt[wk].kind = 'punct' AND wt[wk].text IN (')', ']') THEN
        wd := wd - 1;
      ELSIF wd = 0 AND @schema@.grammar_kw(wt[wk], 'or') THEN
        has_or := true;
      END IF;
    END LOOP;
  END IF;
  -- b's rows no row of a matches: the LEFT JOIN's row whose a is NULL (every column of it,
  -- the key included, which a row of a never has).
  -- (ROW(a.*), not the bare name a, which a column of that name would take.)
  where2 := 'ROW(' || quote_ident(coalesce(ast->'from'->>'alias', ast->'from'->>'part', ast->'from'->>'name')) || '.*) IS NULL'
    || coalesce(' AND ' || CASE WHEN has_or THEN '(' || w || ')' ELSE w END, '');
  -- The WITH queries are the whole statement's; derived tables belong to each branch.
  cte_parts := coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS y(x, o)
                          WHERE x->>'kind' = 'cte'), '[]');
  other_parts := coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS y(x, o)
                            WHERE x->>'kind' <> 'cte'), '[]');
  b1 := ast - 'target' - 'without_source_index' - 'without_row_security' - 'distinct' - 'parts'
    || CASE WHEN jsonb_array_length(other_parts) > 0 THEN jsonb_build_object('parts', other_parts) ELSE '{}' END;
  b2 := swapped - 'target' - 'without_source_index' - 'without_row_security' - 'distinct' - 'parts'
    || jsonb_build_object('where', where2)
    || CASE WHEN jsonb_array_length(other_parts) > 0 THEN jsonb_build_object('parts', other_parts) ELSE '{}' END;
  RETURN jsonb_build_object(
    'kind', 'transform', 'form', 'as', 'target', target,
    'union', jsonb_build_object('all', NOT coalesce((ast->>'distinct')::boolean, false),
                                'branches', jsonb_build_array(b1, b2)),
    'select', b1->'select',
    'without_source_index', coalesce((ast->>'without_source_index')::boolean, false),
    'written', written)
    || CASE WHEN (ast->>'without_row_security')::boolean THEN jsonb_build_object('without_row_security', true) ELSE '{}' END
    || CASE WHEN jsonb_array_length(cte_parts) > 0 THEN jsonb_build_object('parts', cte_parts) ELSE '{}' END;
END
$fn$;

-- A view's SELECT: as before, but a FULL JOIN (compiled into a union) inside a branch of
-- a UNION is refused (a union of unions: put the FULL JOIN in a subquery in FROM).
CREATE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  ast jsonb := @schema@.grammar_parse_view_before_joins(toks, i, target, ctes);
BEGIN
  IF ast ? 'union' AND NOT ast ? 'written'
     AND EXISTS (SELECT 1 FROM jsonb_array_elements(ast->'union'->'branches') b WHERE b ? 'union') THEN
    PERFORM @schema@.grammar_refuse(
      'a FULL JOIN in a SELECT of a UNION is not supported yet: put the FULL JOIN in a subquery in FROM',
      toks[i].pos);
  END IF;
  RETURN ast;
END
$fn$;

-- A view's SELECT as text: a block marked "written_join" (the parsed form of a RIGHT or
-- FULL JOIN, kept to be shown) with its first join's word as written; any other as before.
-- The first join follows the FROM item, which is rendered apart and found by a name no
-- statement holds.
CREATE FUNCTION @schema@._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  sentinel text := 'trellis#first#join#item';
  txt text;
  marker text;
BEGIN
  IF NOT ast ? 'written_join' THEN
    RETURN @schema@._render_view_select_before_joins(ast);
  END IF;
  txt := @schema@._render_view_select_before_joins(
    (ast - 'written_join') || jsonb_build_object('from', jsonb_build_object('schema', NULL, 'name', sentinel, 'alias', NULL)));
  marker := quote_ident(sentinel) || ' LEFT JOIN ';
  RETURN overlay(txt PLACING @schema@._render_view_item(ast, ast->'from') || ' '
                 || upper(ast->>'written_join') || ' JOIN '
                 FROM strpos(txt, marker) FOR length(marker));
END
$fn$;

-- The AST as written: every node compiled from a RIGHT or FULL JOIN replaced by what was
-- parsed (its "written"), at every level (WITH queries, derived tables, union branches).
CREATE FUNCTION @schema@._joins_as_written(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast IS NULL OR jsonb_typeof(ast) <> 'object' THEN
    RETURN ast;
  END IF;
  IF ast ? 'written' THEN
    ast := (ast->'written') || CASE WHEN ast ? 'target' THEN jsonb_build_object('target', ast->'target') ELSE '{}' END;
  END IF;
  IF ast ? 'union' THEN
    ast := jsonb_set(ast, '{union,branches}', (
      SELECT jsonb_agg(@schema@._joins_as_written(b) ORDER BY o)
        FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o)));
  END IF;
  IF jsonb_typeof(ast->'parts') = 'array' AND jsonb_array_length(ast->'parts') > 0 THEN
    ast := jsonb_set(ast, '{parts}', (
      SELECT jsonb_agg(CASE WHEN p ? 'ast' THEN jsonb_set(p, '{ast}', @schema@._joins_as_written(p->'ast')) ELSE p END ORDER BY o)
        FROM jsonb_array_elements(ast->'parts') WITH ORDINALITY AS x(p, o)));
  END IF;
  RETURN ast;
END
$fn$;

-- render_statement: the statement as written (RIGHT and FULL JOINs as the user wrote
-- them), rendered as before.
CREATE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  w jsonb;
BEGIN
  -- A hidden part (trellis#...) is shown as what it keeps.
  IF ast ->> 'kind' IS DISTINCT FROM 'transform' OR NOT ast::text LIKE '%"written"%'
     OR starts_with(coalesce(ast->'target'->>'name', ''), 'trellis#') THEN
    RETURN @schema@.render_statement_before_joins(ast);
  END IF;
  w := @schema@._joins_as_written(ast);
  IF NOT w ? 'written_join' THEN
    RETURN @schema@.render_statement_before_joins(w);
  END IF;
  -- The statement's own FROM has the RIGHT or FULL JOIN: its SELECT as written.
  RETURN 'TRANSFORM ' || @schema@.grammar_render_name(w -> 'target' ->> 'schema', w -> 'target' ->> 'name')
    || ' AS ' || @schema@._render_view_select(w)
    || CASE WHEN (w ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (w ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
END
$fn$;

-- A part's definition: a FULL JOIN whose SELECT aggregates (without GROUP BY: the grammar
-- refuses GROUP BY and HAVING over one) is refused, as its two branches would each make
-- their own row; Postgres says whether it aggregates. Everything else as before.
CREATE FUNCTION @schema@._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  info jsonb;
  res jsonb;
BEGIN
  IF ast ? 'union' AND ast->'written'->>'written_join' = 'full' THEN
    info := @schema@._analyze_query(
      @schema@._render_view_select(@schema@._bind_scope_plain(ast->'written', scope)),
      'in the definition');
    IF coalesce((info->>'has_aggs')::boolean, false) THEN
      PERFORM @schema@._fail('TRV01',
        'aggregates over a FULL JOIN are not supported yet: put the FULL JOIN in a subquery in FROM (SELECT count(*) FROM (SELECT ... FROM a FULL JOIN b ON ...) AS j)');
    END IF;
  END IF;
  res := @schema@._define_parts_before_joins(ast, root, path, scope);
  -- What was written goes on being shown (definitions(), dumps).
  IF ast ? 'written' AND NOT res->'ast' ? 'written' THEN
    res := jsonb_set(res, '{ast}', (res->'ast') || jsonb_build_object('written', ast->'written'));
  END IF;
  RETURN res;
END
$fn$;
