-- Set operations and the indexes of joins on other conditions than equalities (issue #26,
-- item 1; ADR 0072).
--
-- 1. Source indexes of joins on other conditions than equalities (`ON r.k BETWEEN l.k AND
--    l.k + 2`, `ON l.k > r.k`): the drain finds the rows a change touches through the
--    condition, run from the changed rows (a change to r looks l up by the columns of l the
--    condition compares, and the other way round). source_index_gaps (0008) named indexes
--    from equalities only; it now also names, for each join whose condition has no
--    equality the engine routes by, the columns of each side its condition reads (role
--    join_joined for the joined table, join_from for the tables before it), when no valid
--    index of that table leads with one of them.
--
-- 2. INTERSECT and EXCEPT (distinct), compiled when the statement is parsed into what the
--    engine keeps already: a GROUP BY of every column over a UNION ALL (ADR 0059) of the
--    branches, each tagged with its place, filtered by HAVING:
--
--      A INTERSECT B INTERSECT C  is
--        SELECT s."trellis#1" AS c1, ... FROM (A' UNION ALL B' UNION ALL C') AS "set#op"
--               ("trellis#1", ..., "trellis#side")
--         GROUP BY every column
--        HAVING sum(CASE WHEN side = 1 THEN 1 ELSE 0 END) > 0 AND ... (every branch)
--      A EXCEPT B EXCEPT C  is the same, HAVING max(side) = 1 (in A, in none of the others)
--
--    (X' is X with `<its place> AS "trellis#side"` added to its SELECT list.) A GROUP BY
--    treats NULLs as equal, as INTERSECT and EXCEPT do. The columns are named as the first
--    branch names them (an item's AS, or a column's own name; another expression must be
--    named). The statement is shown as written: the compiled AST keeps the union the
--    branches make, marked with the operator, under "written" (0046's mechanism), which
--    _render_view_select renders with INTERSECT or EXCEPT. INTERSECT ALL and EXCEPT ALL,
--    and set operators of different kinds in one statement, are refused by name.
--
-- 3. GROUP BY, HAVING or aggregates directly over a FULL JOIN (the first join of FROM, ADR 0066), kept as
--    the same GROUP BY over a subquery holding the FULL JOIN:
--
--      SELECT f(l.x), count(r.y) FROM l FULL JOIN r ON ... WHERE w GROUP BY f(l.x) HAVING h
--    is
--      SELECT f(j."l.x") AS f, count(j."r.y") AS count
--        FROM (SELECT l.x AS "l.x", r.y AS "r.y" FROM l FULL JOIN r ON ... WHERE w) AS "full#join"
--       GROUP BY f(j."l.x") HAVING h'
--
--    every column the SELECT list, GROUP BY and HAVING read (`alias.column`, or a bare name
--    that is no word of SQL's syntax: the grammar runs before names are resolved, so a bare
--    column named like one, `year`, needs its table's alias) selected by the subquery under a name
--    of its own and read from it. The subquery is a FULL JOIN ADR 0066 keeps (a UNION ALL
--    read by its never-NULL key), so the GROUP BY around it is kept as any GROUP BY over a
--    part. Items are named as Postgres names them (AS, a column's name, a function's name);
--    another unnamed expression is refused. Shown as written ("written", as 0046 does).
--
-- 4. A RIGHT or FULL JOIN after other joins (`a JOIN b ON c1 FULL JOIN c ON c2 ...`): the
--    joins before it made a subquery, which the RIGHT or FULL JOIN then joins as its first
--    join (ADR 0066 keeps that):
--
--      SELECT ... FROM (SELECT a.x AS "a.x", b.y AS "b.y" FROM a JOIN b ON c1) AS "joined#"
--        FULL JOIN c ON c2' ... WHERE w' [GROUP BY ...]
--
--    every column of a and b the rest reads (`alias.column`) selected by the subquery and
--    read from it. The joins before it must be inner joins (the subquery is read by its
--    key, its tables' keys, never NULL), and every column the rest reads must be written
--    with its table's alias (the grammar cannot tell whose a bare name is): refused by name
--    otherwise. Shown as written.
--
-- Renamed and wrapped (statements without these go straight through): source_index_gaps
-- (0008) -> source_index_gaps_before_setops, grammar_parse_view (four arguments, 0046) ->
-- grammar_parse_view_before_setops, _render_view_select (0046) ->
-- _render_view_select_before_setops, grammar_parse_block (0046) ->
-- grammar_parse_block_before_setops, render_statement (0046) -> render_statement_before_setops.
-- No body is replaced.

ALTER FUNCTION @schema@.source_index_gaps(int) RENAME TO source_index_gaps_before_setops;

-- The columns a join condition reads, per source: `alias.column` (a source at or before
-- the join, by its alias), and a bare name that is a column of exactly one of them.
CREATE FUNCTION @schema@._condition_columns(p_transform_id int, p_ordinal int, cond text)
RETURNS TABLE (src int, attnum int)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token[] := @schema@.grammar_tokenize(cond);
  n int := coalesce(array_length(t, 1), 0);
  k int;
  s int;
  a int;
BEGIN
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN t[k].kind NOT IN ('word', 'ident');
    -- Part of a qualified name already read, or a function's name.
    CONTINUE WHEN k > 1 AND t[k - 1].kind = 'punct' AND t[k - 1].text = '.';
    CONTINUE WHEN k < n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '(';
    IF k + 2 <= n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '.' AND t[k + 2].kind IN ('word', 'ident') THEN
      SELECT ts.ordinal, att.attnum INTO s, a
        FROM @schema@.transform_sources ts
        JOIN pg_attribute att ON att.attrelid = ts.source_oid AND att.attname = t[k + 2].value
                              AND att.attnum > 0 AND NOT att.attisdropped
       WHERE ts.transform_id = p_transform_id AND ts.ordinal <= p_ordinal AND ts.alias = t[k].value;
      IF s IS NOT NULL THEN
        src := s; attnum := a;
        RETURN NEXT;
      END IF;
    ELSE
      IF (SELECT count(*) FROM @schema@.transform_sources ts
            JOIN pg_attribute att ON att.attrelid = ts.source_oid AND att.attname = t[k].value
                                  AND att.attnum > 0 AND NOT att.attisdropped
           WHERE ts.transform_id = p_transform_id AND ts.ordinal <= p_ordinal) = 1 THEN
        RETURN QUERY
          SELECT ts.ordinal, att.attnum::int
            FROM @schema@.transform_sources ts
            JOIN pg_attribute att ON att.attrelid = ts.source_oid AND att.attname = t[k].value
                                  AND att.attnum > 0 AND NOT att.attisdropped
           WHERE ts.transform_id = p_transform_id AND ts.ordinal <= p_ordinal;
      END IF;
    END IF;
  END LOOP;
END
$fn$;

-- As before (0008), and the indexes joins on other conditions than equalities need: for a
-- join with no equality the engine routes by (none in the spec's joins for it), the
-- columns of each side its condition reads.
CREATE FUNCTION @schema@.source_index_gaps(p_transform_id int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH t AS (SELECT * FROM @schema@.transforms WHERE id = p_transform_id),
  theta AS (
    SELECT ts.ordinal AS j, ts.join_condition AS cond
      FROM t JOIN @schema@.transform_sources ts ON ts.transform_id = t.id
     WHERE ts.ordinal > 0 AND ts.join_condition IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(t.spec->'joins', '[]')) e
                        WHERE (e->>'join')::int = ts.ordinal)
       -- LATERAL's table of positions (0053) is joined by its key from each row of the
       -- table before it (`ordinality = ANY (...)`): nothing to index on either side.
       AND NOT (ts.source_schema = @schema_literal@ AND ts.source_name = 'lateral_ordinals')),
  sides AS (
    SELECT DISTINCT c.src, c.attnum, CASE WHEN c.src = th.j THEN 'join_joined' ELSE 'join_from' END AS role
      FROM theta th CROSS JOIN LATERAL @schema@._condition_columns(p_transform_id, th.j, th.cond) c),
  needs AS (
    SELECT src, role, array_agg(attnum ORDER BY attnum) AS attnums FROM sides GROUP BY src, role),
  extra AS (
    SELECT ts.ordinal, n.role, jsonb_build_object(
             'table', ts.source_schema || '.' || ts.source_name,
             'columns', to_jsonb(cols.names),
             'role', n.role,
             'opted_out', t.without_source_index,
             'fix', format('CREATE INDEX CONCURRENTLY ON %I.%I (%s)', ts.source_schema, ts.source_name,
                           (SELECT string_agg(quote_ident(c), ', ') FROM unnest(cols.names) c))) AS gap
      FROM needs n
      CROSS JOIN t
      JOIN @schema@.transform_sources ts ON ts.transform_id = t.id AND ts.ordinal = n.src
      CROSS JOIN LATERAL (
        SELECT array_agg(a.attname::text ORDER BY a.attnum) AS names
          FROM pg_attribute a WHERE a.attrelid = ts.source_oid AND a.attnum = ANY (n.attnums)) cols
     WHERE NOT EXISTS (
       SELECT 1 FROM pg_index i
        WHERE i.indrelid = ts.source_oid AND i.indisvalid AND i.indkey[0] = ANY (n.attnums))),
  before AS (
    SELECT g, o FROM jsonb_array_elements(@schema@.source_index_gaps_before_setops(p_transform_id))
      WITH ORDINALITY AS y(g, o))
  SELECT coalesce(jsonb_agg(g ORDER BY o1, o2, o3), '[]') FROM (
    SELECT g, 0 AS o1, o AS o2, '' AS o3 FROM before
    UNION ALL
    SELECT x.gap, 1, x.ordinal, x.role FROM (SELECT DISTINCT ON (gap) ordinal, role, gap FROM extra) x
     WHERE NOT EXISTS (SELECT 1 FROM before b WHERE b.g = x.gap)) all_gaps
$fn$;

ALTER FUNCTION @schema@.grammar_parse_view(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_view_before_setops;
ALTER FUNCTION @schema@._render_view_select(jsonb) RENAME TO _render_view_select_before_setops;

-- A view's SELECT: with INTERSECT or EXCEPT at its top level, compiled as the header says;
-- any other as before.
CREATE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  op text;
  op_at int;
  has_union boolean := false;
  t2 @schema@.grammar_token[] := '{}';
  u jsonb;
  b jsonb;
  nb int;
  n int;
  names text[] := '{}';
  it jsonb;
  et @schema@.grammar_token[];
  nm text;
  with_ text;
  txt text;
  res jsonb;
  q text := quote_ident('set#op');
BEGIN
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND (@schema@.grammar_kw(toks[k], 'intersect') OR @schema@.grammar_kw(toks[k], 'except')) THEN
      IF @schema@.grammar_kw(toks[k + 1], 'all') THEN
        PERFORM @schema@.grammar_refuse(format(
          '%s ALL is not supported yet: only %s (distinct) is maintained (count each row''s copies per branch with GROUP BY over a UNION ALL)',
          upper(toks[k].value), upper(toks[k].value)), toks[k].pos);
      END IF;
      IF op IS NOT NULL AND op <> toks[k].value THEN
        PERFORM @schema@.grammar_refuse(
          'INTERSECT and EXCEPT mixed in one statement are not supported: put one of them in a subquery in FROM',
          toks[k].pos);
      END IF;
      op := toks[k].value;
      op_at := coalesce(op_at, k);
    ELSIF d = 0 AND @schema@.grammar_kw(toks[k], 'union') THEN
      has_union := true;
    END IF;
    k := k + 1;
  END LOOP;
  IF op IS NULL THEN
    RETURN @schema@.grammar_parse_view_before_setops(toks, i, target, ctes);
  END IF;
  IF has_union THEN
    PERFORM @schema@.grammar_refuse(format(
      'UNION and %s mixed in one statement are not supported: put one of them in a subquery in FROM',
      upper(op)), toks[op_at].pos);
  END IF;

  -- The branches as a UNION ALL (each INTERSECT or EXCEPT [DISTINCT] read as UNION ALL).
  k := 1;
  WHILE k <= array_length(toks, 1) LOOP
    IF k >= i AND @schema@.grammar_kw(toks[k], op) THEN
      t2 := t2 || ROW('word', 'UNION', 'union', toks[k].pos)::@schema@.grammar_token
               || ROW('word', 'ALL', 'all', toks[k].pos)::@schema@.grammar_token;
      IF @schema@.grammar_kw(toks[k + 1], 'distinct') THEN
        k := k + 1;
      END IF;
    ELSE
      t2 := t2 || toks[k];
    END IF;
    k := k + 1;
  END LOOP;
  u := @schema@.grammar_parse_view_before_setops(t2, i, target, ctes);
  IF NOT u ? 'union' THEN
    PERFORM @schema@.grammar_refuse(format('%s could not be read here', upper(op)), toks[op_at].pos);
  END IF;
  nb := jsonb_array_length(u->'union'->'branches');

  -- The columns, as the first branch names them.
  FOR it IN SELECT x FROM jsonb_array_elements(u->'select') WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    nm := it->>'name';
    IF nm IS NULL THEN
      et := @schema@.grammar_tokenize(it->>'expr');
      n := array_length(et, 1);
      -- ident [. ident [. ident]] then eof
      IF et[n - 1].kind IN ('word', 'ident')
         AND (n = 2 OR (et[n - 2].kind = 'punct' AND et[n - 2].text = '.'
                        AND (n = 4 OR (n = 6 AND et[2].kind = 'punct' AND et[2].text = '.')))) THEN
        nm := et[n - 1].value;
      ELSE
        PERFORM @schema@.grammar_refuse(format(
          'a column of %s must be named in its first SELECT: write %s AS name', upper(op), it->>'expr'),
          coalesce((it->>'position')::int, toks[i].pos));
      END IF;
    END IF;
    names := names || nm;
  END LOOP;
  n := cardinality(names);

  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(u->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';

  txt := coalesce(with_, '') || 'SELECT '
    || (SELECT string_agg(format('%s.%I AS %I', q, 'trellis#' || o, nm2), ', ' ORDER BY o)
          FROM unnest(names) WITH ORDINALITY AS x(nm2, o))
    || ' FROM ('
    || (SELECT string_agg(@schema@._render_view_select(br || jsonb_build_object('select',
                 (br->'select') || jsonb_build_array(jsonb_build_object('expr', o::text, 'name', 'trellis#side',
                   'position', NULL, 'bare_label', NULL, 'label_expr', NULL)))), ' UNION ALL ' ORDER BY o)
          FROM jsonb_array_elements(u->'union'->'branches') WITH ORDINALITY AS x(br, o))
    || ') AS ' || q || ' ('
    || (SELECT string_agg(quote_ident('trellis#' || o), ', ' ORDER BY o) FROM generate_series(1, n) o)
    || ', "trellis#side") GROUP BY '
    || (SELECT string_agg(format('%s.%I', q, 'trellis#' || o), ', ' ORDER BY o) FROM generate_series(1, n) o)
    || ' HAVING '
    || CASE WHEN op = 'intersect'
         THEN (SELECT string_agg(format('sum(CASE WHEN %s."trellis#side" = %s THEN 1 ELSE 0 END) > 0', q, o), ' AND ' ORDER BY o)
                 FROM generate_series(1, nb) o)
         ELSE format('max(%s."trellis#side") = 1', q) END
    || CASE WHEN (u->>'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (u->>'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  res := @schema@.grammar_parse_view_before_setops(@schema@.grammar_tokenize(txt), 1, target, ctes);
  RETURN res || jsonb_build_object('written', u || jsonb_build_object('union', (u->'union') || jsonb_build_object('setop', op)));
END
$fn$;

-- A view's SELECT as text: a union marked with a set operator (the written form of an
-- INTERSECT or EXCEPT) joined by it; a block marked "written_outer" (a RIGHT or FULL JOIN
-- after other joins, as written) with that join's word; any other as before.
CREATE FUNCTION @schema@._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  with_ text;
  sentinel text := 'trellis#outer#join#item';
  m int;
  txt text;
  marker text;
BEGIN
  IF ast ? 'written_outer' THEN
    -- A RIGHT or FULL JOIN after other joins, as written: parsed as a LEFT JOIN, its word
    -- put back (the join found by a name no statement holds, as 0046 finds the first).
    m := (ast->'written_outer'->>'at')::int;
    txt := @schema@._render_view_select(jsonb_set(ast - 'written_outer', ARRAY['joins', m::text],
      jsonb_build_object('schema', NULL, 'name', sentinel, 'alias', NULL, 'type', 'left', 'on', ast->'joins'->m->>'on')));
    marker := 'LEFT JOIN ' || quote_ident(sentinel);
    RETURN overlay(txt PLACING upper(ast->'written_outer'->>'kind') || ' JOIN ' || @schema@._render_view_item(ast, ast->'joins'->m)
                   FROM strpos(txt, marker) FOR length(marker));
  END IF;
  IF NOT (ast ? 'union' AND ast->'union' ? 'setop') THEN
    RETURN @schema@._render_view_select_before_setops(ast);
  END IF;
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  RETURN coalesce(with_, '') || (
    SELECT string_agg(@schema@._render_view_select(b), ' ' || upper(ast->'union'->>'setop') || ' ' ORDER BY o)
      FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o));
END
$fn$;

ALTER FUNCTION @schema@.grammar_parse_block(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block_before_setops;

-- An expression with every column it reads from `sources` (the aliases of FROM) replaced by the subquery's column ("full#join"."alias.column", or "full#join".
-- "column" for a bare name): {expr, columns: {name: expression in the subquery}}.
CREATE FUNCTION @schema@._full_join_refs(expr text, sources jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token[] := @schema@.grammar_tokenize(expr);
  n int := coalesce(array_length(t, 1), 0);
  k int;
  cols jsonb := '{}';
  edits jsonb := '[]';
  e jsonb;
  nm text;
  q text := quote_ident('full#join');
BEGIN
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN t[k].kind NOT IN ('word', 'ident');
    CONTINUE WHEN k > 1 AND t[k - 1].kind = 'punct' AND t[k - 1].text IN ('.', '::');
    CONTINUE WHEN k < n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '(';
    IF k + 2 <= n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '.' THEN
      CONTINUE WHEN NOT sources ? t[k].value;
      IF t[k + 2].kind NOT IN ('word', 'ident') THEN
        PERFORM @schema@._fail('TRV01', format(
          'GROUP BY over a FULL JOIN reads %s.%s: name the columns (alias.column)', t[k].text, t[k + 2].text));
      END IF;
      nm := t[k].value || '.' || t[k + 2].value;
      cols := cols || jsonb_build_object(nm, quote_ident(t[k].value) || '.' || quote_ident(t[k + 2].value));
      edits := edits || jsonb_build_object('from', t[k].pos, 'to', t[k + 2].pos + length(t[k + 2].text),
                                            'text', q || '.' || quote_ident(nm));
    ELSE
      -- A bare name: a column, unless it is a word of SQL's syntax (a keyword other than an
      -- unreserved one, or one of the unreserved words expressions use), a typed literal's
      -- type (date '…'), or a table's alias (a whole row).
      CONTINUE WHEN k < n AND t[k + 1].kind = 'string';
      CONTINUE WHEN sources ? t[k].value;
      CONTINUE WHEN t[k].kind = 'word' AND (
        EXISTS (SELECT 1 FROM pg_get_keywords() w WHERE w.word = t[k].value AND w.catcode <> 'U')
        OR t[k].value IN ('at', 'zone', 'nulls', 'first', 'last', 'escape', 'within', 'over', 'filter',
                          'ordinality', 'day', 'hour', 'minute', 'second', 'month', 'year', 'to'));
      nm := t[k].value;
      cols := cols || jsonb_build_object(nm, quote_ident(nm));
      edits := edits || jsonb_build_object('from', t[k].pos, 'to', t[k].pos + length(t[k].text),
                                            'text', q || '.' || quote_ident(nm));
    END IF;
  END LOOP;
  FOR e IN SELECT x FROM jsonb_array_elements(edits) x ORDER BY (x->>'from')::int DESC LOOP
    expr := overlay(expr PLACING e->>'text' FROM (e->>'from')::int FOR (e->>'to')::int - (e->>'from')::int);
  END LOOP;
  RETURN jsonb_build_object('expr', expr, 'columns', cols);
END
$fn$;

-- The name Postgres gives a SELECT item written without AS: a column's own name, or a
-- function call's name; NULL for anything else.
CREATE FUNCTION @schema@._item_default_name(expr text)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token[] := @schema@.grammar_tokenize(expr);
  n int := array_length(t, 1);
  d int := 0;
  k int;
BEGIN
  IF t[n - 1].kind IN ('word', 'ident')
     AND (n = 2 OR (t[n - 2].kind = 'punct' AND t[n - 2].text = '.'
                    AND (n = 4 OR (n = 6 AND t[2].kind = 'punct' AND t[2].text = '.')))) THEN
    RETURN t[n - 1].value;
  END IF;
  -- f(...) and nothing after its closing bracket.
  IF t[1].kind IN ('word', 'ident') AND t[2].kind = 'punct' AND t[2].text = '(' THEN
    FOR k IN 2 .. n - 1 LOOP
      IF t[k].kind = 'punct' AND t[k].text IN ('(', '[') THEN
        d := d + 1;
      ELSIF t[k].kind = 'punct' AND t[k].text IN (')', ']') THEN
        d := d - 1;
        IF d = 0 THEN
          RETURN CASE WHEN k = n - 1 THEN t[1].value END;
        END IF;
      END IF;
    END LOOP;
  END IF;
  RETURN NULL;
END
$fn$;

-- An expression with every `alias.column` of `sources` (aliases) replaced by the column of
-- the subquery q ("alias.column"): {expr, columns: {name: expression in the subquery},
-- bare: [the bare names that may be columns]}.
CREATE FUNCTION @schema@._prefix_refs(expr text, sources jsonb, q text)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token[] := @schema@.grammar_tokenize(expr);
  n int := coalesce(array_length(t, 1), 0);
  k int;
  cols jsonb := '{}';
  bare jsonb := '[]';
  edits jsonb := '[]';
  e jsonb;
  nm text;
BEGIN
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN t[k].kind NOT IN ('word', 'ident');
    CONTINUE WHEN k > 1 AND t[k - 1].kind = 'punct' AND t[k - 1].text IN ('.', '::');
    CONTINUE WHEN k < n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '(';
    IF k + 2 <= n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '.' THEN
      CONTINUE WHEN NOT sources ? t[k].value;
      IF t[k + 2].kind NOT IN ('word', 'ident') THEN
        PERFORM @schema@._fail('TRV01', format(
          'a RIGHT or FULL JOIN after another join reads %s.%s: name the columns (alias.column)', t[k].text, t[k + 2].text));
      END IF;
      nm := t[k].value || '.' || t[k + 2].value;
      cols := cols || jsonb_build_object(nm, quote_ident(t[k].value) || '.' || quote_ident(t[k + 2].value));
      edits := edits || jsonb_build_object('from', t[k].pos, 'to', t[k + 2].pos + length(t[k + 2].text),
                                            'text', q || '.' || quote_ident(nm));
    ELSIF NOT (k < n AND t[k + 1].kind = 'string')
          AND NOT (k + 1 <= n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '.')
          AND NOT (t[k].kind = 'word' AND (
            EXISTS (SELECT 1 FROM pg_get_keywords() w WHERE w.word = t[k].value AND w.catcode <> 'U')
            OR t[k].value IN ('at', 'zone', 'nulls', 'first', 'last', 'escape', 'within', 'over', 'filter',
                              'ordinality', 'day', 'hour', 'minute', 'second', 'month', 'year', 'to'))) THEN
      bare := bare || to_jsonb(t[k].text);
    END IF;
  END LOOP;
  FOR e IN SELECT x FROM jsonb_array_elements(edits) x ORDER BY (x->>'from')::int DESC LOOP
    expr := overlay(expr PLACING e->>'text' FROM (e->>'from')::int FOR (e->>'to')::int - (e->>'from')::int);
  END LOOP;
  RETURN jsonb_build_object('expr', expr, 'columns', cols, 'bare', bare);
END
$fn$;

-- A SELECT block with a RIGHT or FULL JOIN after other joins, compiled as the header says
-- (then read again, by grammar_parse_block); NULL for any other block.
CREATE FUNCTION @schema@._outer_join_later(
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
  m int := 0;
  t2 @schema@.grammar_token[];
  ast jsonb;
  written jsonb;
  sources jsonb := '{}';
  item jsonb;
  j jsonb;
  r jsonb;
  cols jsonb := '{}';
  bare jsonb := '[]';
  items text[] := '{}';
  joins_txt text := '';
  groups text[] := '{}';
  on_ text;
  where_ text;
  having_ text;
  nm text;
  g text;
  p_txt text;
  with_ text;
  txt text;
  o int;
  q text := quote_ident('joined#');
BEGIN
  IF NOT @schema@.grammar_kw(toks[i], 'select') THEN
    RETURN NULL;
  END IF;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND f IS NULL AND @schema@.grammar_kw(toks[k], 'from') THEN
      f := k;
    ELSIF d = 0 AND f IS NOT NULL THEN
      IF (toks[k].kind = 'punct' AND toks[k].text = ',')
         OR (toks[k].kind = 'word' AND toks[k].value IN ('join', 'inner', 'cross', 'natural'))
         OR (@schema@.grammar_kw(toks[k], 'left') AND coalesce(toks[k + 1].text, '') <> '(')
         OR @schema@._outer_join_at(toks, k) IS NOT NULL THEN
        IF first_join IS NULL THEN
          first_join := k;
        END IF;
        -- Count the joins before the outer one (a JOIN word after INNER or LEFT is its own).
        IF outer_at IS NULL AND toks[k].kind = 'word' AND toks[k].value = 'join'
           AND NOT (k > 1 AND toks[k - 1].kind = 'word' AND toks[k - 1].value IN ('inner', 'left', 'outer', 'cross', 'natural')) THEN
          m := m + 1;
        ELSIF outer_at IS NULL AND toks[k].kind = 'word' AND toks[k].value IN ('inner', 'left', 'cross', 'natural') THEN
          m := m + 1;
        END IF;
      END IF;
      IF outer_at IS NULL AND @schema@._outer_join_at(toks, k) IS NOT NULL AND k <> first_join THEN
        outer_at := k;
        kind := toks[k].value;
      END IF;
    END IF;
    k := k + 1;
  END LOOP;
  IF outer_at IS NULL THEN
    RETURN NULL;
  END IF;

  -- Parsed with that join read as a LEFT JOIN; its word kept to be shown.
  t2 := toks;
  t2[outer_at] := ROW('word', 'LEFT', 'left', toks[outer_at].pos)::@schema@.grammar_token;
  ast := @schema@.grammar_parse_block_before_joins(t2, i, target, ctes);
  IF ast ? 'window' OR ast ? 'distinct_on'
     OR jsonb_array_length(coalesce(ast->'joins', '[]')) <= m OR ast->'joins'->m->>'type' <> 'left' THEN
    RETURN NULL;
  END IF;
  FOR o IN 0 .. m - 1 LOOP
    IF ast->'joins'->o->>'type' <> 'inner' THEN
      PERFORM @schema@.grammar_refuse(format(
        'a %s JOIN after a %s JOIN is not supported yet: only after inner joins (the joins before it are kept as a subquery, read by its tables'' keys)',
        upper(kind), upper(ast->'joins'->o->>'type')), toks[outer_at].pos);
    END IF;
  END LOOP;
  written := ast || jsonb_build_object('written_outer', jsonb_build_object('at', m, 'kind', kind));

  -- The joins before it, and their aliases.
  p_txt := @schema@._render_view_item(ast, ast->'from');
  sources := jsonb_build_object(coalesce(ast->'from'->>'alias', ast->'from'->>'part', ast->'from'->>'name'), true);
  FOR o IN 0 .. m - 1 LOOP
    j := ast->'joins'->o;
    p_txt := p_txt || ' JOIN ' || @schema@._render_view_item(ast, j) || ' ON ' || (j->>'on');
    sources := sources || jsonb_build_object(coalesce(j->>'alias', j->>'part', j->>'name'), true);
  END LOOP;

  FOR item IN SELECT x FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS y(x, o2) ORDER BY o2 LOOP
    nm := coalesce(item->>'name', @schema@._item_default_name(item->>'expr'));
    IF nm IS NULL THEN
      PERFORM @schema@.grammar_refuse(format(
        'a %s JOIN after another join: name this column (%s AS name)', upper(kind), item->>'expr'),
        coalesce((item->>'position')::int, toks[i].pos));
    END IF;
    r := @schema@._prefix_refs(item->>'expr', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    items := items || ((r->>'expr') || ' AS ' || quote_ident(nm));
  END LOOP;
  FOR o IN m .. jsonb_array_length(ast->'joins') - 1 LOOP
    j := ast->'joins'->o;
    r := @schema@._prefix_refs(j->>'on', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    joins_txt := joins_txt || ' ' || CASE WHEN o = m THEN upper(kind) || ' JOIN '
                                          WHEN j->>'type' = 'left' THEN 'LEFT JOIN ' ELSE 'JOIN ' END
      || @schema@._render_view_item(ast, j) || ' ON ' || (r->>'expr');
  END LOOP;
  IF ast->>'where' IS NOT NULL THEN
    r := @schema@._prefix_refs(ast->>'where', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    where_ := r->>'expr';
  END IF;
  FOR g IN SELECT x FROM jsonb_array_elements_text(coalesce(ast->'group_by', '[]')) WITH ORDINALITY AS y(x, o2) ORDER BY o2 LOOP
    r := @schema@._prefix_refs(g, sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    groups := groups || (r->>'expr');
  END LOOP;
  IF ast->>'having' IS NOT NULL THEN
    r := @schema@._prefix_refs(ast->>'having', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    having_ := r->>'expr';
  END IF;
  IF jsonb_array_length(bare) > 0 THEN
    PERFORM @schema@.grammar_refuse(format(
      'a %s JOIN after another join needs every column written with its table''s alias (alias.column): %s',
      upper(kind), (SELECT string_agg(DISTINCT x, ', ') FROM jsonb_array_elements_text(bare) x)), toks[outer_at].pos);
  END IF;

  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p->'ast') || ')', ', ' ORDER BY o3) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o3)
   WHERE p->>'kind' = 'cte';
  txt := coalesce(with_, '') || 'SELECT '
    || CASE WHEN coalesce((ast->>'distinct')::boolean, false) THEN 'DISTINCT ' ELSE '' END
    || array_to_string(items, ', ')
    || ' FROM (SELECT '
    || CASE WHEN cols = '{}' THEN '1 AS "trellis#one"'
            ELSE (SELECT string_agg((c.value #>> '{}') || ' AS ' || quote_ident(c.key), ', ' ORDER BY c.key) FROM jsonb_each(cols) c) END
    || ' FROM ' || p_txt || ') AS ' || q
    || joins_txt
    || coalesce(' WHERE ' || where_, '')
    || CASE WHEN cardinality(groups) > 0 THEN ' GROUP BY ' || array_to_string(groups, ', ') ELSE '' END
    || coalesce(' HAVING ' || having_, '')
    || CASE WHEN (ast->>'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast->>'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  RETURN @schema@.grammar_parse_block(@schema@.grammar_tokenize(txt), 1, target, ctes)
    || jsonb_build_object('written', written);
END
$fn$;

-- A SELECT block with GROUP BY or HAVING over a FULL JOIN, compiled as the header says;
-- any other as before.
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
  full_at int;
  grouped boolean := false;
  t2 @schema@.grammar_token[];
  ast jsonb;
  written jsonb;
  sources jsonb := '{}';
  item jsonb;
  r jsonb;
  cols jsonb := '{}';
  items text[] := '{}';
  groups text[] := '{}';
  having_ text;
  nm text;
  g text;
  inner_ jsonb;
  with_ text;
  txt text;
  q text := quote_ident('full#join');
BEGIN
  -- A RIGHT or FULL JOIN after other joins first (its result may then group over a FULL JOIN).
  ast := @schema@._outer_join_later(toks, i, target, ctes);
  IF ast IS NOT NULL THEN
    RETURN ast;
  END IF;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND f IS NULL AND @schema@.grammar_kw(toks[k], 'from') THEN
      f := k;
    ELSIF d = 0 AND f IS NOT NULL AND full_at IS NULL AND @schema@._outer_join_at(toks, k) = 'full' THEN
      full_at := k;
    ELSIF d = 0 AND f IS NOT NULL AND ((@schema@.grammar_kw(toks[k], 'group') AND @schema@.grammar_kw(toks[k + 1], 'by'))
                                       OR @schema@.grammar_kw(toks[k], 'having')) THEN
      grouped := true;
    ELSIF f IS NULL AND toks[k].kind = 'word' AND toks[k + 1].kind = 'punct' AND toks[k + 1].text = '('
          AND (k = 1 OR NOT (toks[k - 1].kind = 'punct' AND toks[k - 1].text = '.'))
          AND toks[k].value IN ('count', 'sum', 'avg', 'min', 'max', 'bool_and', 'bool_or', 'every',
                                'array_agg', 'string_agg', 'json_agg', 'jsonb_agg', 'json_object_agg',
                                'jsonb_object_agg', 'stddev', 'stddev_pop', 'stddev_samp', 'variance',
                                'var_pop', 'var_samp', 'bit_and', 'bit_or', 'bit_xor') THEN
      -- An aggregate in the SELECT list (or one named as one): grouped, without GROUP BY.
      grouped := true;
    END IF;
    k := k + 1;
  END LOOP;
  IF full_at IS NULL OR NOT grouped THEN
    RETURN @schema@.grammar_parse_block_before_setops(toks, i, target, ctes);
  END IF;

  -- Parsed as written (the FULL JOIN read as a LEFT JOIN, its word kept as 0046 keeps it).
  t2 := toks;
  t2[full_at] := ROW('word', 'LEFT', 'left', toks[full_at].pos)::@schema@.grammar_token;
  ast := @schema@.grammar_parse_block_before_joins(t2, i, target, ctes);
  IF ast->'joins'->0 IS NULL OR ast->'joins'->0->>'type' <> 'left' OR (ast->>'distinct')::boolean
     OR ast ? 'window' OR ast ? 'distinct_on' THEN
    -- Not the first join, or a form refused anyway: as before (refused by name there).
    RETURN @schema@.grammar_parse_block_before_setops(toks, i, target, ctes);
  END IF;
  written := ast || jsonb_build_object('written_join', 'full');

  -- The tables of FROM, by alias.
  FOR item IN SELECT x FROM (SELECT ast->'from' AS x, 0 AS o
                             UNION ALL SELECT j, o FROM jsonb_array_elements(ast->'joins') WITH ORDINALITY AS y(j, o)) z ORDER BY o LOOP
    sources := sources || jsonb_build_object(coalesce(item->>'alias', item->>'part', item->>'name'), true);
  END LOOP;

  FOR item IN SELECT x FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    nm := coalesce(item->>'name', @schema@._item_default_name(item->>'expr'));
    IF nm IS NULL THEN
      PERFORM @schema@.grammar_refuse(format(
        'GROUP BY over a FULL JOIN: name this column (%s AS name)', item->>'expr'),
        coalesce((item->>'position')::int, toks[i].pos));
    END IF;
    r := @schema@._full_join_refs(item->>'expr', sources);
    cols := cols || (r->'columns');
    items := items || ((r->>'expr') || ' AS ' || quote_ident(nm));
  END LOOP;
  FOR g IN SELECT x FROM jsonb_array_elements_text(coalesce(ast->'group_by', '[]')) WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    r := @schema@._full_join_refs(g, sources);
    cols := cols || (r->'columns');
    groups := groups || (r->>'expr');
  END LOOP;
  IF ast->>'having' IS NOT NULL THEN
    r := @schema@._full_join_refs(ast->>'having', sources);
    cols := cols || (r->'columns');
    having_ := r->>'expr';
  END IF;

  -- The subquery: the FULL JOIN as written, selecting the columns read around it.
  inner_ := (written - 'group_by' - 'having' - 'target' - 'without_source_index' - 'without_row_security')
    || jsonb_build_object('group_by', '[]'::jsonb, 'having', NULL,
         'parts', coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS y(x, o)
                             WHERE x->>'kind' <> 'cte'), '[]'),
         'select', CASE WHEN cols = '{}' THEN jsonb_build_array(jsonb_build_object('expr', '1', 'name', 'trellis#one'))
                   ELSE (SELECT jsonb_agg(jsonb_build_object('expr', c.value #>> '{}', 'name', c.key) ORDER BY c.key)
                           FROM jsonb_each(cols) c) END);
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  txt := coalesce(with_, '') || 'SELECT ' || array_to_string(items, ', ')
    || ' FROM (' || @schema@._render_view_select(inner_) || ') AS ' || q
    || CASE WHEN cardinality(groups) > 0 THEN ' GROUP BY ' || array_to_string(groups, ', ') ELSE '' END
    || coalesce(' HAVING ' || having_, '')
    || CASE WHEN (ast->>'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast->>'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  RETURN @schema@.grammar_parse_block_before_setops(@schema@.grammar_tokenize(txt), 1, target, ctes)
    || jsonb_build_object('written', written);
END
$fn$;

ALTER FUNCTION @schema@.render_statement(jsonb) RENAME TO render_statement_before_setops;

-- render_statement: a statement whose own FROM has a RIGHT or FULL JOIN after other joins,
-- as written; every other as before.
CREATE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  w jsonb;
BEGIN
  IF ast ->> 'kind' IS DISTINCT FROM 'transform' OR NOT ast::text LIKE '%"written_outer"%'
     OR starts_with(coalesce(ast->'target'->>'name', ''), 'trellis#') THEN
    RETURN @schema@.render_statement_before_setops(ast);
  END IF;
  w := @schema@._joins_as_written(ast);
  IF NOT w ? 'written_outer' THEN
    RETURN @schema@.render_statement_before_setops(ast);
  END IF;
  RETURN 'TRANSFORM ' || @schema@.grammar_render_name(w -> 'target' ->> 'schema', w -> 'target' ->> 'name')
    || ' AS ' || @schema@._render_view_select(w)
    || CASE WHEN (w ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (w ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
END
$fn$;
