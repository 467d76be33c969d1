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

-- The union a set operation's counts group (bound item `item`): its "trellis#row" (a row's
-- text, never NULL) declared NOT NULL, so the part grouping by it has a key that never is;
-- a column of an array type refused (the part holds a row's values as (array_agg(v))[1]).
CREATE FUNCTION @schema@._setop_row_not_null(item jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  rel regclass := to_regclass(quote_ident(item ->> 'schema') || '.' || quote_ident(item ->> 'name'));
  bad text;
BEGIN
  IF rel IS NULL THEN
    RETURN;
  END IF;
  SELECT string_agg(format_type(a.atttypid, a.atttypmod), ', ') INTO bad
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
   WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND t.typcategory = 'A'
     AND a.attname LIKE 'trellis#%' AND a.attname NOT IN ('trellis#row', 'trellis#side');
  IF bad IS NOT NULL THEN
    PERFORM @schema@._fail('TRV01', format(
      'a column of an array type (%s) in INTERSECT ALL, EXCEPT ALL or set operations of different kinds is not supported yet', bad));
  END IF;
  EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET NOT NULL', rel, 'trellis#row');
  UPDATE @schema@.transforms x
     SET spec = jsonb_set(x.spec, '{columns}', (
           SELECT jsonb_agg(CASE WHEN y ->> 'name' = 'trellis#row' THEN y || '{"notnull": true}' ELSE y END ORDER BY o)
             FROM jsonb_array_elements(x.spec -> 'columns') WITH ORDINALITY AS z(y, o)))
   WHERE x.target_oid = rel;
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
  IF ast ? 'setop_all' THEN
    -- The counts of a set operation's rows (below): its union's row text is never NULL.
    r1 := @schema@._define_parts_before_sqlmore(ast, root, path, scope);
    PERFORM @schema@._setop_row_not_null(r1 -> 'ast' -> 'from');
    RETURN r1;
  END IF;
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

-- 2. and 3. Set operations beyond ADR 0059 and 0072: INTERSECT ALL and EXCEPT ALL, set
--    operators of different kinds in one statement (with parentheses, and SQL's precedence:
--    INTERSECT binds tighter than UNION and EXCEPT, which go left to right), and set
--    operations other than UNION ALL in a subquery or a WITH query. The branches are read as
--    a UNION ALL (ADR 0059), each tagged with its place, and a row's count in the result is
--    a function of its counts in the branches (c_i: the number of copies in branch i):
--
--      UNION ALL  a + b            UNION      1 if a + b > 0
--      INTERSECT ALL least(a, b)   INTERSECT  1 if a > 0 and b > 0
--      EXCEPT ALL greatest(a - b, 0)  EXCEPT  1 if a > 0 and b = 0
--
--    When the outermost operator is distinct (each row once), at the top of a statement:
--    ADR 0072's GROUP BY of every column over the tagged UNION ALL, HAVING count > 0. Else
--    (INTERSECT ALL, EXCEPT ALL, a UNION ALL over other operators, or any in a subquery,
--    whose key must never be NULL): each branch also selects its row as text
--    (ROW(items)::text, never NULL: "trellis#row"), a part groups the union by it, holding
--    the row's values and its count, and the statement joins it with lateral_ordinals (ADR
--    0071's table of positions) for positions 1 .. count: a row's copies are keyed by (its
--    text, its position).
--
--    Shown as written: the AST keeps the union of the branches under "written", marked
--    setop 'tree' with the operators' tree (parentheses where written), which the wrapped
--    _render_view_select renders.
--
-- Renamed and wrapped: grammar_parse_view (0054) -> grammar_parse_view_before_sqlmore,
-- _render_view_select (0054) -> _render_view_select_before_sqlmore.

ALTER FUNCTION @schema@.grammar_parse_view(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_view_before_sqlmore;
ALTER FUNCTION @schema@._render_view_select(jsonb) RENAME TO _render_view_select_before_sqlmore;

-- The operator at token k ('union', 'union all', 'intersect', 'intersect all', 'except',
-- 'except all') and the token after it; NULL when token k is none.
CREATE FUNCTION @schema@._setop_at(toks @schema@.grammar_token[], k int, OUT op text, OUT next int)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF toks[k].kind <> 'word' OR toks[k].value NOT IN ('union', 'intersect', 'except') THEN
    RETURN;
  END IF;
  op := toks[k].value;
  next := k + 1;
  IF @schema@.grammar_kw(toks[k + 1], 'all') THEN
    op := op || ' all';
    next := k + 2;
  ELSIF @schema@.grammar_kw(toks[k + 1], 'distinct') THEN
    next := k + 2;
  END IF;
END
$fn$;

-- Set operations from token k: level 0 (UNION, EXCEPT, left to right), 1 (INTERSECT),
-- 2 (a bracketed set operation, or one SELECT: a leaf, up to the next operator or closing
-- bracket at its depth). Returns {node, k (the token after it), leaves ([[from, to)])};
-- a node is {leaf: n} or {op, l, r}, with paren: true when written in brackets.
CREATE FUNCTION @schema@._setop_parse(toks @schema@.grammar_token[], k int, lvl int, leaves jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  r jsonb;
  r2 jsonb;
  node jsonb;
  o record;
  d int := 0;
  s int := k;
BEGIN
  IF lvl < 2 THEN
    r := @schema@._setop_parse(toks, k, lvl + 1, leaves);
    node := r -> 'node';
    LOOP
      SELECT * INTO o FROM @schema@._setop_at(toks, (r ->> 'k')::int);
      EXIT WHEN o.op IS NULL OR (lvl = 0) = starts_with(o.op, 'intersect');
      r2 := @schema@._setop_parse(toks, o.next, lvl + 1, r -> 'leaves');
      node := jsonb_build_object('op', o.op, 'l', node, 'r', r2 -> 'node');
      r := r2;
    END LOOP;
    RETURN jsonb_build_object('node', node, 'k', r -> 'k', 'leaves', r -> 'leaves');
  END IF;
  IF toks[k].kind = 'punct' AND toks[k].text = '(' THEN
    r := @schema@._setop_parse(toks, k + 1, 0, leaves);
    IF NOT (toks[(r ->> 'k')::int].kind = 'punct' AND toks[(r ->> 'k')::int].text = ')') THEN
      PERFORM @schema@.grammar_unexpected(toks, (r ->> 'k')::int, ')');
    END IF;
    RETURN jsonb_build_object('node', (r -> 'node') || '{"paren": true}', 'k', (r ->> 'k')::int + 1,
                              'leaves', r -> 'leaves');
  END IF;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      EXIT WHEN d = 0;
      d := d - 1;
    ELSIF d = 0 AND toks[k].kind = 'word' AND toks[k].value IN ('union', 'intersect', 'except') THEN
      EXIT;
    END IF;
    k := k + 1;
  END LOOP;
  RETURN jsonb_build_object('node', jsonb_build_object('leaf', jsonb_array_length(leaves) + 1), 'k', k,
                            'leaves', leaves || jsonb_build_array(jsonb_build_array(s, k)));
END
$fn$;

-- The number of copies of a row in a node's result, from its counts in the branches (the
-- union "q", tagged by "trellis#side").
CREATE FUNCTION @schema@._setop_count(node jsonb, q text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  a text;
  b text;
BEGIN
  IF node ? 'leaf' THEN
    RETURN format('sum(CASE WHEN %s."trellis#side" = %s THEN 1 ELSE 0 END)', q, node ->> 'leaf');
  END IF;
  a := @schema@._setop_count(node -> 'l', q);
  b := @schema@._setop_count(node -> 'r', q);
  RETURN CASE node ->> 'op'
    WHEN 'union all' THEN format('(%s + %s)', a, b)
    WHEN 'union' THEN format('(CASE WHEN %s + %s > 0 THEN 1 ELSE 0 END)', a, b)
    WHEN 'intersect all' THEN format('least(%s, %s)', a, b)
    WHEN 'intersect' THEN format('(CASE WHEN %s > 0 AND %s > 0 THEN 1 ELSE 0 END)', a, b)
    WHEN 'except all' THEN format('greatest(%s - %s, 0)', a, b)
    ELSE format('(CASE WHEN %s > 0 AND %s = 0 THEN 1 ELSE 0 END)', a, b) END;
END
$fn$;

-- The operators of a tree, each once.
CREATE FUNCTION @schema@._setop_ops(node jsonb)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE WHEN node ? 'leaf' THEN '{}'::text[]
              ELSE ARRAY(SELECT DISTINCT x FROM unnest(ARRAY[node ->> 'op'] || @schema@._setop_ops(node -> 'l')
                                                   || @schema@._setop_ops(node -> 'r')) x) END
$fn$;

-- Whether a tree reads as its leaves joined left to right by its operator (no bracketed
-- operation on a right side, none of another operator).
CREATE FUNCTION @schema@._setop_flat(node jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $fn$
  SELECT node ? 'leaf' OR ((node -> 'r') ? 'leaf' AND @schema@._setop_flat(node -> 'l'))
$fn$;

-- A view's SELECT: set operations the ADRs 0059 and 0072 do not keep compiled as the header
-- says; any other as before.
CREATE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int;
  s int := i;
  found_op boolean := false;
  parsed jsonb;
  tree jsonb;
  leaves jsonb;
  ops text[];
  flat @schema@.grammar_token[] := '{}';
  u jsonb;
  nb int;
  n int;
  names text[] := '{}';
  it jsonb;
  et @schema@.grammar_token[];
  nm text;
  with_ text;
  txt text;
  res jsonb;
  cnt text;
  two boolean;
  lf jsonb;
  q text := quote_ident('set#op');
  a text := quote_ident('set#all');
  sch text := quote_ident(@schema_literal@);
BEGIN
  k := i;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND toks[k].kind = 'word' AND toks[k].value IN ('union', 'intersect', 'except') THEN
      found_op := true;
    END IF;
    k := k + 1;
  END LOOP;
  -- A set operation in brackets at the top: `(SELECT ... UNION SELECT ...) EXCEPT ...`.
  IF NOT found_op AND NOT (toks[i].kind = 'punct' AND toks[i].text = '(') THEN
    RETURN @schema@.grammar_parse_view_before_sqlmore(toks, i, target, ctes);
  END IF;
  -- The statement's WITH queries come first.
  IF @schema@.grammar_kw(toks[s], 'with') THEN
    s := s + 1;
    IF @schema@.grammar_kw(toks[s], 'recursive') THEN
      RETURN @schema@.grammar_parse_view_before_sqlmore(toks, i, target, ctes);
    END IF;
    LOOP
      s := s + 1;
      IF toks[s].kind = 'punct' AND toks[s].text = '(' THEN
        s := @schema@._closing_token(toks, s) + 1;
      END IF;
      EXIT WHEN NOT @schema@.grammar_kw(toks[s], 'as');
      s := s + 1;
      IF @schema@.grammar_kw(toks[s], 'not') THEN s := s + 1; END IF;
      IF @schema@.grammar_kw(toks[s], 'materialized') THEN s := s + 1; END IF;
      EXIT WHEN NOT (toks[s].kind = 'punct' AND toks[s].text = '(');
      s := @schema@._closing_token(toks, s) + 1;
      EXIT WHEN NOT (toks[s].kind = 'punct' AND toks[s].text = ',');
    END LOOP;
  END IF;
  parsed := @schema@._setop_parse(toks, s, 0, '[]');
  tree := parsed -> 'node';
  leaves := parsed -> 'leaves';
  IF tree ? 'leaf' THEN
    RETURN @schema@.grammar_parse_view_before_sqlmore(toks, i, target, ctes);
  END IF;
  ops := @schema@._setop_ops(tree);
  -- What ADR 0059 and 0072 keep: one operator, read left to right; in a subquery, UNION ALL.
  IF cardinality(ops) = 1 AND ops[1] IN ('union', 'union all', 'intersect', 'except')
     AND (ops[1] <> 'except' OR @schema@._setop_flat(tree))
     AND (target IS NOT NULL OR ops[1] IN ('union all', 'union')) AND tree::text NOT LIKE '%"paren"%' THEN
    RETURN @schema@.grammar_parse_view_before_sqlmore(toks, i, target, ctes);
  END IF;

  -- The branches as one UNION ALL: the tokens before the first, each branch's, then what
  -- follows the last (ORDER BY, options).
  flat := toks[1 : s - 1];
  FOR lf IN SELECT x FROM jsonb_array_elements(leaves) x LOOP
    IF cardinality(flat) > s - 1 THEN
      flat := flat || ROW('word', 'UNION', 'union', toks[(lf ->> 0)::int].pos)::@schema@.grammar_token
                   || ROW('word', 'ALL', 'all', toks[(lf ->> 0)::int].pos)::@schema@.grammar_token;
    END IF;
    flat := flat || toks[(lf ->> 0)::int : (lf ->> 1)::int - 1];
  END LOOP;
  flat := flat || toks[(parsed ->> 'k')::int : array_length(toks, 1)];
  u := @schema@.grammar_parse_view_before_sqlmore(flat, i, target, ctes);
  nb := jsonb_array_length(u -> 'union' -> 'branches');
  IF NOT u ? 'union' OR nb <> jsonb_array_length(leaves) THEN
    PERFORM @schema@.grammar_refuse('this combination of set operations could not be read', toks[s].pos);
  END IF;

  -- The columns, as the first branch names them.
  FOR it IN SELECT x FROM jsonb_array_elements(u -> 'select') WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    nm := it ->> 'name';
    IF nm IS NULL THEN
      et := @schema@.grammar_tokenize(it ->> 'expr');
      n := array_length(et, 1);
      IF et[n - 1].kind IN ('word', 'ident')
         AND (n = 2 OR (et[n - 2].kind = 'punct' AND et[n - 2].text = '.'
                        AND (n = 4 OR (n = 6 AND et[2].kind = 'punct' AND et[2].text = '.')))) THEN
        nm := et[n - 1].value;
      ELSE
        PERFORM @schema@.grammar_refuse(format(
          'a column of a set operation must be named in its first SELECT: write %s AS name', it ->> 'expr'),
          coalesce((it ->> 'position')::int, toks[s].pos));
      END IF;
    END IF;
    names := names || nm;
  END LOOP;
  n := cardinality(names);

  SELECT 'WITH ' || string_agg(quote_ident(p ->> 'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p -> 'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p -> 'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(u -> 'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p ->> 'kind' = 'cte';

  cnt := @schema@._setop_count(tree, q);
  -- Each row once (the outermost operator is distinct) at the top: ADR 0072's form.
  two := target IS NULL OR (tree ->> 'op') LIKE '% all';
  txt := coalesce(with_, '') || 'SELECT '
    || (SELECT string_agg(format('%s.%I AS %I', CASE WHEN two THEN a ELSE q END, 'trellis#' || o, nm2), ', ' ORDER BY o)
          FROM unnest(names) WITH ORDINALITY AS x(nm2, o))
    || ' FROM ('
    || CASE WHEN two THEN 'SELECT ' || q || '."trellis#row" AS "trellis#row", '
         || (SELECT string_agg(format('(array_agg(%s.%I))[1] AS %I', q, 'trellis#' || o, 'trellis#' || o), ', ' ORDER BY o)
               FROM generate_series(1, n) o)
         || ', ' || cnt || ' AS "trellis#n" FROM (' ELSE '' END
    || (SELECT string_agg(@schema@._render_view_select(br || jsonb_build_object('select',
                 (br -> 'select')
                 || CASE WHEN two THEN jsonb_build_array(jsonb_build_object('expr',
                      'ROW(' || (SELECT string_agg('(' || (s2 ->> 'expr') || ')', ', ' ORDER BY o2)
                                   FROM jsonb_array_elements(br -> 'select') WITH ORDINALITY AS z(s2, o2)) || ')::text',
                      'name', 'trellis#row', 'position', NULL, 'bare_label', NULL, 'label_expr', NULL)) ELSE '[]' END
                 || jsonb_build_array(jsonb_build_object('expr', o::text, 'name', 'trellis#side',
                   'position', NULL, 'bare_label', NULL, 'label_expr', NULL)))), ' UNION ALL ' ORDER BY o)
          FROM jsonb_array_elements(u -> 'union' -> 'branches') WITH ORDINALITY AS x(br, o))
    || ') AS ' || q || ' ('
    || (SELECT string_agg(quote_ident('trellis#' || o), ', ' ORDER BY o) FROM generate_series(1, n) o)
    || CASE WHEN two THEN ', "trellis#row"' ELSE '' END
    || ', "trellis#side") GROUP BY '
    || CASE WHEN two THEN q || '."trellis#row"'
         ELSE (SELECT string_agg(format('%s.%I', q, 'trellis#' || o), ', ' ORDER BY o) FROM generate_series(1, n) o) END
    || ' HAVING ' || cnt || ' > 0'
    || CASE WHEN two THEN ') AS ' || a || ' JOIN ' || sch || '.lateral_ordinals AS "set#copy" ON "set#copy".ordinality = ANY ('
         || sch || '._lateral_positions(' || a || '."trellis#n"::int))' ELSE '' END
    || CASE WHEN (u ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (u ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  res := @schema@.grammar_parse_view_before_sqlmore(@schema@.grammar_tokenize(txt), 1, target, ctes);
  IF two THEN
    res := res || jsonb_build_object('parts', (
      SELECT jsonb_agg(CASE WHEN p ->> 'name' = 'set#all' THEN p || jsonb_build_object('ast', (p -> 'ast') || '{"setop_all": true}')
                            ELSE p END ORDER BY o)
        FROM jsonb_array_elements(res -> 'parts') WITH ORDINALITY AS x(p, o)));
  END IF;
  RETURN res || jsonb_build_object('written', u || jsonb_build_object('union', (u -> 'union')
    || jsonb_build_object('setop', 'tree', 'tree', tree)));
END
$fn$;

-- A set operations' tree as written: each leaf its branch, brackets where written.
CREATE FUNCTION @schema@._setop_render(node jsonb, branches jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  txt text;
BEGIN
  IF node ? 'leaf' THEN
    txt := @schema@._render_view_select(branches -> ((node ->> 'leaf')::int - 1));
  ELSE
    txt := @schema@._setop_render(node -> 'l', branches) || ' ' || upper(node ->> 'op') || ' '
        || @schema@._setop_render(node -> 'r', branches);
  END IF;
  RETURN CASE WHEN (node ->> 'paren')::boolean THEN '(' || txt || ')' ELSE txt END;
END
$fn$;

-- A view's SELECT as text: a union marked with a tree of set operations as written; any
-- other as before.
CREATE FUNCTION @schema@._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  with_ text;
BEGIN
  IF ast -> 'union' ->> 'setop' IS DISTINCT FROM 'tree' THEN
    RETURN @schema@._render_view_select_before_sqlmore(ast);
  END IF;
  SELECT 'WITH ' || string_agg(quote_ident(p ->> 'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p -> 'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p -> 'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast -> 'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p ->> 'kind' = 'cte';
  RETURN coalesce(with_, '') || @schema@._setop_render(ast -> 'union' -> 'tree', ast -> 'union' -> 'branches');
END
$fn$;

-- 4. A RIGHT or FULL JOIN after a LEFT JOIN (`a LEFT JOIN b ON c1 FULL JOIN c ON c2`): ADR
--    0072 keeps a RIGHT or FULL JOIN after inner joins by making the joins before it a
--    subquery read by its tables' keys, which a LEFT JOIN's side makes nullable. With a LEFT
--    JOIN among them, the subquery is made a union of that one SELECT (ADR 0059): a union's
--    rows are keyed by their branch and the text of their tables' keys (ROW(k)::text, never
--    NULL), so the RIGHT or FULL JOIN reads it as any part. (The statement is compiled with a
--    second branch, WHERE false, which the parser needs to read a union; it is dropped from
--    the AST before anything is defined.) Renamed and wrapped: _outer_join_later (0054) ->
--    _outer_join_later_before_sqlmore (statements with inner joins only before the outer
--    join go to it unchanged).

ALTER FUNCTION @schema@._outer_join_later(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO _outer_join_later_before_sqlmore;

-- An AST with the subquery "joined#" (a union compiled with a second branch WHERE false)
-- left with its first branch, wherever it is (a FULL JOIN is itself a union of two).
CREATE FUNCTION @schema@._joined_one_branch(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast IS NULL OR jsonb_typeof(ast) <> 'object' THEN
    RETURN ast;
  END IF;
  IF jsonb_typeof(ast->'union'->'branches') = 'array' THEN
    ast := jsonb_set(ast, '{union,branches}', (
      SELECT jsonb_agg(@schema@._joined_one_branch(b) ORDER BY o)
        FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o)));
  END IF;
  IF jsonb_typeof(ast->'parts') = 'array' AND jsonb_array_length(ast->'parts') > 0 THEN
    ast := jsonb_set(ast, '{parts}', (
      SELECT jsonb_agg(CASE WHEN p->>'name' = 'joined#' AND jsonb_typeof(p->'ast'->'union'->'branches') = 'array'
                            THEN jsonb_set(p, '{ast,union,branches}', jsonb_build_array(p->'ast'->'union'->'branches'->0))
                            WHEN p ? 'ast' THEN jsonb_set(p, '{ast}', @schema@._joined_one_branch(p->'ast'))
                            ELSE p END ORDER BY o)
        FROM jsonb_array_elements(ast->'parts') WITH ORDINALITY AS x(p, o)));
  END IF;
  RETURN ast;
END
$fn$;

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
  sel_ text;
  res jsonb;
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
  -- After inner joins only: as before (0054).
  IF NOT EXISTS (SELECT 1 FROM generate_series(0, m - 1) o2 WHERE ast->'joins'->o2->>'type' = 'left') THEN
    RETURN @schema@._outer_join_later_before_sqlmore(toks, i, target, ctes);
  END IF;
  FOR o IN 0 .. m - 1 LOOP
    IF ast->'joins'->o->>'type' NOT IN ('inner', 'left') THEN
      PERFORM @schema@.grammar_refuse(format(
        'a %s JOIN after a %s JOIN is not supported yet', upper(kind), upper(ast->'joins'->o->>'type')), toks[outer_at].pos);
    END IF;
  END LOOP;
  written := ast || jsonb_build_object('written_outer', jsonb_build_object('at', m, 'kind', kind));

  -- The joins before it, and their aliases.
  p_txt := @schema@._render_view_item(ast, ast->'from');
  sources := jsonb_build_object(coalesce(ast->'from'->>'alias', ast->'from'->>'part', ast->'from'->>'name'), true);
  FOR o IN 0 .. m - 1 LOOP
    j := ast->'joins'->o;
    p_txt := p_txt || CASE WHEN j->>'type' = 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
      || @schema@._render_view_item(ast, j) || ' ON ' || (j->>'on');
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
  sel_ := CASE WHEN cols = '{}' THEN '1 AS "trellis#one"'
            ELSE (SELECT string_agg((c.value #>> '{}') || ' AS ' || quote_ident(c.key), ', ' ORDER BY c.key) FROM jsonb_each(cols) c) END;
  txt := coalesce(with_, '') || 'SELECT '
    || CASE WHEN coalesce((ast->>'distinct')::boolean, false) THEN 'DISTINCT ' ELSE '' END
    || array_to_string(items, ', ')
    -- sqlmore: the joins before it, LEFT JOINs among them, as a UNION ALL (its second
    -- branch, never any row, dropped once parsed, below): a union's rows are read by a key
    -- that is never NULL (its branch and the text of its tables' keys), where the LEFT
    -- JOIN's side's key can be NULL.
    || ' FROM (SELECT ' || sel_ || ' FROM ' || p_txt || ' UNION ALL SELECT ' || sel_ || ' FROM ' || p_txt
    || ' WHERE false) AS ' || q
    || joins_txt
    || coalesce(' WHERE ' || where_, '')
    || CASE WHEN cardinality(groups) > 0 THEN ' GROUP BY ' || array_to_string(groups, ', ') ELSE '' END
    || coalesce(' HAVING ' || having_, '')
    || CASE WHEN (ast->>'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast->>'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  res := @schema@.grammar_parse_block(@schema@.grammar_tokenize(txt), 1, target, ctes);
  RETURN @schema@._joined_one_branch(res) || jsonb_build_object('written', written);
END
$fn$;
