-- Aggregates maintained by delta (issue #22, ADR 0044). A GROUP BY (or grand total) whose
-- every aggregate has an exact inverse is kept by applying each changed row's contribution
-- (minus its old one, plus its new one) to its groups, instead of recomputing the groups
-- from all their rows:
--
--   * the key map (map_<id>) also holds each join row's aggregate inputs (i<n>): its old
--     contribution, which the sources no longer show;
--   * a group state table (groups_<id>) holds, per group, the row count and each
--     aggregate's state (sums, counts, extremes, ...), from which the target row is
--     computed. The target always equals its group states finalised, and the group states
--     always equal the key map's rows folded: every change to one is made with the other,
--     in one statement (src/engine/drain/delta-sql.ts).
--
-- Which aggregates qualify, and how each is kept (`<schema>.transforms.delta`, written by
-- _classify_aggregates at define time):
--   count(*), count(x)                          counts
--   sum / avg of smallint, integer, bigint      sum and count of non-NULL inputs
--   sum / avg of numeric                        finite sum, counts of non-NULL, NaN and
--                                               infinite inputs, and the largest display
--                                               scale with how many inputs have it (the
--                                               sum's scale is the inputs' largest)
--   min / max of integers, dates, timestamps,   the extreme; when a change removes it, the
--   text with a deterministic collation, oid    group's extreme is read again from its
--                                               key-map rows (a rescan)
--   bool_and / every / bool_or                  counts of false (true) and non-NULL inputs
-- each with or without FILTER, in any expression that reads no column outside its
-- aggregates (coalesce(sum(x), 0), sum(a) / nullif(count(*), 0), ...), and HAVING over
-- such expressions. Anything else (DISTINCT or ORDER BY inside, float sums, ordered-set or
-- user-defined aggregates, a column read outside an aggregate) keeps the whole transform
-- on the group recompute of ADR 0006, with the reason recorded.

ALTER TABLE @schema@.transforms ADD COLUMN delta jsonb;

-- How the drain applied a range (status().lastApply): 'delta' joins 'rederive' and 'recompute';
-- the estimates it chose by (apply_estimate), and what each way has cost this transform,
-- per unit, as measured (apply_costs; see src/engine/drain/apply-choice.ts).
ALTER TABLE @schema@.pipeline DROP CONSTRAINT pipeline_apply_mode_check;
ALTER TABLE @schema@.pipeline ADD CONSTRAINT pipeline_apply_mode_check
  CHECK (apply_mode IN ('delta', 'rederive', 'recompute'));
ALTER TABLE @schema@.pipeline
  ADD COLUMN apply_estimate jsonb,
  ADD COLUMN apply_costs jsonb;

-- `node` (a node string of pg_rewrite.ev_action, from its opening brace) with everything
-- nested inside it emptied: `{AGGREF :aggfnoid 2108 ... :args () ... :location 39}`, so its
-- own fields can be read without meeting those of the nodes it holds. Node strings escape
-- braces and parentheses inside tokens with a backslash.
CREATE FUNCTION @schema@._node_own_fields(node text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  ch text[] := string_to_array(node, NULL);
  result text := '';
  depth int := 0;
  i int := 1;
  n int := coalesce(array_length(ch, 1), 0);
  c text;
BEGIN
  WHILE i <= n LOOP
    c := ch[i];
    IF c = '\' THEN
      IF depth <= 1 THEN
        result := result || c || coalesce(ch[i + 1], '');
      END IF;
      i := i + 2;
      CONTINUE;
    END IF;
    IF c IN ('{', '(') THEN
      depth := depth + 1;
      IF depth <= 2 THEN
        result := result || c;
      END IF;
    ELSIF c IN ('}', ')') THEN
      IF depth <= 2 THEN
        result := result || c;
      END IF;
      depth := depth - 1;
      EXIT WHEN depth = 0;
    ELSIF depth <= 1 THEN
      result := result || c;
    END IF;
    i := i + 1;
  END LOOP;
  RETURN result;
END
$fn$;

-- The aggregate calls in `expr`, one of the SELECT items (or the HAVING) of a definition
-- reading `from_sql` grouped by `grouping`, as Postgres resolves them, each with where it
-- is written in `expr`:
--   [{fn (regprocedure text), name, aggtype (format_type), collation (of its input, or
--     null), star, distinct, ordered, filtered, kind ('n' normal, 'o' ordered-set, 'h'),
--     outer (an outer query's aggregate), first, last (1-based character positions of the
--     call in expr, FILTER included), args (text of its arguments), filter (text of its
--     FILTER condition, or null)}]
-- Each call written in expr (a name, its parenthesised arguments, then FILTER or WITHIN
-- GROUP) is asked of Postgres on its own: a temporary view of that call alone, grouped as
-- the definition is, whose column is an Aggref node when the call is an aggregate. Stored
-- query trees carry no text locations from Postgres 17 on (every :location is -1), so the
-- calls are found in the text and Postgres says what each is. A call that is not an
-- aggregate (coalesce(...), a cast) is looked into for the aggregates it holds.
CREATE FUNCTION @schema@._aggregate_calls(expr text, from_sql text, group_list text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(expr);
  n int := coalesce(array_length(toks, 1), 0);
  t int := 1;
  s int;
  depth int;
  open_at int;
  close_at int;
  end_at int;
  filter_open int;
  filter_close int;
  call_text text;
  action text;
  node text;
  own text;
  args text;
  filter_text text;
  calls jsonb := '[]';
  coll oid;
  fn oid;
BEGIN
  WHILE t <= n LOOP
    -- A call starts at a name (possibly qualified) followed by an opening parenthesis.
    IF NOT (toks[t].kind IN ('word', 'ident', 'uident')
            AND (t = 1 OR NOT (toks[t - 1].kind = 'punct' AND toks[t - 1].text = '.'))) THEN
      t := t + 1;
      CONTINUE;
    END IF;
    s := t;
    WHILE s + 2 <= n AND toks[s + 1].kind = 'punct' AND toks[s + 1].text = '.'
          AND toks[s + 2].kind IN ('word', 'ident', 'uident') LOOP
      s := s + 2;
    END LOOP;
    IF NOT (s + 1 <= n AND toks[s + 1].kind = 'punct' AND toks[s + 1].text = '(') THEN
      t := s + 1;
      CONTINUE;
    END IF;
    open_at := s + 1;
    close_at := open_at;
    depth := 0;
    LOOP
      EXIT WHEN close_at > n;
      IF toks[close_at].kind = 'punct' AND toks[close_at].text IN ('(', '[') THEN
        depth := depth + 1;
      ELSIF toks[close_at].kind = 'punct' AND toks[close_at].text IN (')', ']') THEN
        depth := depth - 1;
        EXIT WHEN depth = 0;
      END IF;
      close_at := close_at + 1;
    END LOOP;
    IF close_at > n THEN
      EXIT;
    END IF;
    end_at := close_at;
    filter_text := NULL;
    -- WITHIN GROUP (...) and FILTER (...) belong to the call.
    IF end_at + 2 <= n AND toks[end_at + 1].kind = 'word' AND toks[end_at + 1].value = 'within'
       AND toks[end_at + 2].kind = 'word' AND toks[end_at + 2].value = 'group' THEN
      end_at := @schema@._closing_token(toks, end_at + 3);
    END IF;
    IF end_at IS NOT NULL AND end_at + 1 <= n AND toks[end_at + 1].kind = 'word'
       AND toks[end_at + 1].value = 'filter' THEN
      filter_open := end_at + 2;
      filter_close := @schema@._closing_token(toks, filter_open);
      IF filter_close IS NOT NULL THEN
        -- (WHERE condition)
        filter_text := btrim(substr(expr, toks[filter_open + 2].pos,
                               toks[filter_close].pos - toks[filter_open + 2].pos));
      END IF;
      end_at := filter_close;
    END IF;
    IF end_at IS NULL THEN
      t := open_at + 1;
      CONTINUE;
    END IF;
    call_text := substr(expr, toks[t].pos, toks[end_at].pos - toks[t].pos + 1);
    action := NULL;
    BEGIN
      DROP VIEW IF EXISTS pg_temp.trellis_aggregates;
      EXECUTE 'CREATE TEMP VIEW trellis_aggregates AS SELECT ' || call_text
        || ' FROM ' || from_sql || ' GROUP BY ' || group_list;
      SELECT r.ev_action::text INTO action
        FROM pg_rewrite r WHERE r.ev_class = 'pg_temp.trellis_aggregates'::regclass;
      DROP VIEW pg_temp.trellis_aggregates;
    EXCEPTION WHEN OTHERS THEN
      -- Not a call Postgres takes alone (it reads an ungrouped column, say): its
      -- arguments may still hold aggregates.
      action := NULL;
    END;
    node := substring(action FROM ':targetList \(\{TARGETENTRY :expr (\{AGGREF .*)$');
    IF node IS NULL THEN
      t := open_at + 1;
      CONTINUE;
    END IF;
    own := @schema@._node_own_fields(node);
    args := btrim(substr(expr, toks[open_at].pos + 1, toks[close_at].pos - toks[open_at].pos - 1));
    IF toks[open_at + 1].kind = 'word' AND toks[open_at + 1].value = 'all' THEN
      args := btrim(substr(expr, toks[open_at + 2].pos, toks[close_at].pos - toks[open_at + 2].pos));
    END IF;
    coll := nullif((regexp_match(own, ':inputcollid (\d+)'))[1]::oid, 0);
    fn := (regexp_match(own, ':aggfnoid (\d+)'))[1]::oid;
    calls := calls || jsonb_build_array(jsonb_build_object(
      'fn', fn::regprocedure::text,
      'name', (SELECT p.proname FROM pg_proc p WHERE p.oid = fn),
      'builtin', (SELECT p.pronamespace = 'pg_catalog'::regnamespace FROM pg_proc p WHERE p.oid = fn),
      'aggtype', format_type((regexp_match(own, ':aggtype (\d+)'))[1]::oid, NULL),
      'argtype', format_type(nullif((regexp_match(node, ':aggargtypes \(o ?(\d*)'))[1], '')::oid, NULL),
      'collation', (SELECT quote_ident(cn.nspname) || '.' || quote_ident(co.collname)
                      FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                     WHERE co.oid = coll),
      'deterministic', coalesce((SELECT co.collisdeterministic FROM pg_collation co WHERE co.oid = coll), true),
      'star', own ~ ':aggstar true',
      'distinct', own !~ ':aggdistinct <>',
      'ordered', own !~ ':aggorder <>',
      'filtered', own !~ ':aggfilter <>',
      'variadic', own ~ ':aggvariadic true',
      'kind', (regexp_match(own, ':aggkind (\w)'))[1],
      'outer', (regexp_match(own, ':agglevelsup (\d+)'))[1]::int > 0,
      'first', toks[t].pos,
      'last', toks[end_at].pos,
      'args', args,
      'filter', filter_text));
    -- An aggregate holds no other (Postgres refuses nested aggregates).
    t := end_at + 1;
  END LOOP;
  RETURN calls;
END
$fn$;

-- The index of the token closing the bracket opened at toks[open_at] (which must be an
-- opening parenthesis), or null when there is none.
CREATE FUNCTION @schema@._closing_token(toks @schema@.grammar_token[], open_at int)
RETURNS int LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  n int := coalesce(array_length(toks, 1), 0);
  t int := open_at;
  depth int := 0;
BEGIN
  IF open_at > n OR NOT (toks[open_at].kind = 'punct' AND toks[open_at].text = '(') THEN
    RETURN NULL;
  END IF;
  WHILE t <= n LOOP
    IF toks[t].kind = 'punct' AND toks[t].text IN ('(', '[') THEN
      depth := depth + 1;
    ELSIF toks[t].kind = 'punct' AND toks[t].text IN (')', ']') THEN
      depth := depth - 1;
      IF depth = 0 THEN
        RETURN t;
      END IF;
    END IF;
    t := t + 1;
  END LOOP;
  RETURN NULL;
END
$fn$;

-- How one aggregate call (of _aggregate_calls) is kept by delta, or why it cannot be:
-- {kind, input_kind} or {why}. kind: count, sum_int (smallint/integer), sum_int8, avg_int,
-- sum_numeric, avg_numeric, min, max, bool_and, bool_or. input_kind: 'flag' (the input
-- stored per row is whether it counts), 'value' (the argument), 'none' (count(*)).
CREATE FUNCTION @schema@._delta_kind(call jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  name text := call->>'name';
  arg text := call->>'argtype';
BEGIN
  IF NOT (call->>'builtin')::boolean THEN
    RETURN jsonb_build_object('why', 'a user-defined aggregate has no known inverse');
  ELSIF (call->>'kind') <> 'n' THEN
    RETURN jsonb_build_object('why', 'an ordered-set or hypothetical-set aggregate needs every row of the group');
  ELSIF (call->>'outer')::boolean THEN
    RETURN jsonb_build_object('why', 'an outer query''s aggregate');
  ELSIF (call->>'distinct')::boolean THEN
    RETURN jsonb_build_object('why', 'DISTINCT needs every row of the group');
  ELSIF (call->>'ordered')::boolean THEN
    RETURN jsonb_build_object('why', 'ORDER BY inside the aggregate needs every row of the group');
  ELSIF (call->>'variadic')::boolean THEN
    RETURN jsonb_build_object('why', 'a VARIADIC call');
  END IF;
  IF name = 'count' THEN
    RETURN jsonb_build_object('kind', 'count',
      'input_kind', CASE WHEN (call->>'star')::boolean AND NOT (call->>'filtered')::boolean THEN 'none' ELSE 'flag' END);
  ELSIF name IN ('sum', 'avg') AND arg IN ('smallint', 'integer') THEN
    RETURN jsonb_build_object('kind', name || '_int', 'input_kind', 'value');
  ELSIF name = 'sum' AND arg = 'bigint' THEN
    RETURN jsonb_build_object('kind', 'sum_int8', 'input_kind', 'value');
  ELSIF name = 'avg' AND arg = 'bigint' THEN
    RETURN jsonb_build_object('kind', 'avg_int', 'input_kind', 'value');
  ELSIF name IN ('sum', 'avg') AND arg = 'numeric' THEN
    RETURN jsonb_build_object('kind', name || '_numeric', 'input_kind', 'value');
  ELSIF name IN ('sum', 'avg') THEN
    RETURN jsonb_build_object('why', format(
      '%s of %s: a delta is not exact for this type (floating-point sums depend on the order rows are added in)', name, arg));
  ELSIF name IN ('min', 'max') THEN
    -- Only types whose equal values are the same value: otherwise which of two equal
    -- values a recompute shows (1.0 or 1.00) depends on the order it reads rows in.
    IF arg IN ('smallint', 'integer', 'bigint', 'oid', 'date',
               'timestamp without time zone', 'timestamp with time zone', 'time without time zone')
       OR (arg IN ('text') AND (call->>'deterministic')::boolean) THEN
      RETURN jsonb_build_object('kind', name, 'input_kind', 'value');
    END IF;
    RETURN jsonb_build_object('why', format(
      '%s of %s: equal values of this type can differ (1.0 and 1.00), so the extreme a recompute shows depends on row order', name, arg));
  ELSIF name IN ('bool_and', 'every') THEN
    RETURN jsonb_build_object('kind', 'bool_and', 'input_kind', 'value');
  ELSIF name = 'bool_or' THEN
    RETURN jsonb_build_object('kind', 'bool_or', 'input_kind', 'value');
  END IF;
  RETURN jsonb_build_object('why', format('%s has no known inverse', name));
END
$fn$;

-- Whether `expr` (with aggregate calls replaced by columns of `placeholders`,
-- [{name, type}]) reads nothing else: then it can be computed from group states alone.
CREATE FUNCTION @schema@._reads_only(expr text, placeholders jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
  DROP VIEW IF EXISTS pg_temp.trellis_aggregates;
  EXECUTE 'CREATE TEMP VIEW trellis_aggregates AS SELECT (' || expr || ') FROM (SELECT '
    || coalesce((SELECT string_agg('NULL::' || (p->>'type') || ' AS ' || quote_ident(p->>'name'), ', ')
                   FROM jsonb_array_elements(placeholders) p), '')
    || ') ' || quote_ident('trellis#s');
  DROP VIEW pg_temp.trellis_aggregates;
  RETURN true;
EXCEPTION
  WHEN query_canceled OR lock_not_available THEN
    RAISE;
  WHEN OTHERS THEN
    RETURN false;
END
$fn$;

-- Whether two equal values of a GROUP BY item's type (and collation) are always written
-- the same way. Delta maintenance keeps a group's key as the group was first written: where
-- equal values can be written differently (numeric 1.0 and 1.00, float -0 and 0, citext,
-- a case-blind collation, intervals, jsonb), the group a recompute shows takes the image of
-- its rows, which only a group recompute reads. Allowed: the types below, their domains
-- and enums, with a deterministic collation.
CREATE FUNCTION @schema@._equal_means_identical(type_name text, collation_name text)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE t(oid, typtype, typbasetype, depth) AS (
    SELECT ty.oid, ty.typtype, ty.typbasetype, 0 FROM pg_type ty WHERE ty.oid = to_regtype(type_name)
    UNION ALL
    SELECT ty.oid, ty.typtype, ty.typbasetype, t.depth + 1
      FROM pg_type ty JOIN t ON ty.oid = t.typbasetype WHERE t.typtype = 'd'),
  base AS (SELECT oid, typtype FROM t ORDER BY depth DESC LIMIT 1)
  SELECT coalesce((SELECT base.typtype = 'e'
                       OR base.oid IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype,
                                       'boolean'::regtype, 'text'::regtype, 'character varying'::regtype,
                                       'name'::regtype, '"char"'::regtype, 'date'::regtype,
                                       'timestamp'::regtype, 'timestamptz'::regtype,
                                       'time'::regtype, 'uuid'::regtype, 'bytea'::regtype, 'oid'::regtype)
                     FROM base), false)
     AND (collation_name IS NULL
          OR coalesce((SELECT co.collisdeterministic FROM pg_collation co
                         JOIN pg_namespace cn ON cn.oid = co.collnamespace
                        WHERE quote_ident(cn.nspname) || '.' || quote_ident(co.collname) = collation_name
                           OR co.collname = collation_name
                        LIMIT 1), false))
$fn$;

-- How a transform's aggregates are maintained: by delta, or by recomputing each changed
-- group (ADR 0006). Returns null for a transform that does not aggregate, else
--   {mode: 'delta' | 'group', reason,
--    aggs: [{call, kind | null, delta (bool), why (null when delta), input (1-based index
--            into inputs, or null), type, collation, scale (a fixed display scale, or null)}],
--    inputs: [{expr, type, collation}]     -- key map columns i1.., one per distinct input
--    items: {column: expression over "trellis#a<n>"} -- each non-key column
--    having: expression over "trellis#a<n>" | null}
-- Expressions are those of the definition (the search_path in force resolves them).
CREATE FUNCTION @schema@._classify_aggregates(spec jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  from_sql text := spec->>'from_sql';
  cross_sql text;
  group_list text;
  col jsonb;
  call jsonb;
  calls jsonb;
  kind jsonb;
  aggs jsonb := '[]';
  inputs jsonb := '[]';
  items jsonb := '{}';
  having_expr text;
  rewritten text;
  idx int;
  input_expr text;
  input_idx int;
  info jsonb;
  placeholders jsonb;
  reason text;
  mode text := 'delta';
  part text;
  exprs jsonb;
BEGIN
  IF NOT (spec->>'aggregates')::boolean THEN
    RETURN NULL;
  END IF;
  group_list := coalesce((SELECT string_agg(g->>'expr', ', ' ORDER BY o)
                          FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS x(g, o)), '()');
  IF group_list = '' THEN
    group_list := '()';
  END IF;
  cross_sql := (SELECT string_agg((s->>'qualified') || ' AS ' || quote_ident(s->>'alias'), ', ' ORDER BY (s->>'ordinal')::int)
                  FROM jsonb_array_elements(spec->'sources') s);
  -- Every expression to rewrite: each non-key column, then HAVING.
  exprs := coalesce((SELECT jsonb_agg(jsonb_build_object('part', c->>'name', 'expr', c->>'expression') ORDER BY o)
                       FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o)
                      WHERE NOT (c->>'is_key')::boolean), '[]');
  IF spec->'ast'->>'having' IS NOT NULL THEN
    exprs := exprs || jsonb_build_array(jsonb_build_object('part', NULL, 'expr', spec->'ast'->>'having'));
  END IF;
  FOR col IN SELECT value FROM jsonb_array_elements(exprs) LOOP
    part := coalesce('column ' || quote_ident(col->>'part'), 'HAVING');
    calls := @schema@._aggregate_calls(col->>'expr', from_sql, group_list);
    rewritten := col->>'expr';
    -- Right to left, so earlier positions stay valid.
    FOR call IN SELECT value FROM jsonb_array_elements(calls) ORDER BY (value->>'first')::int DESC LOOP
      kind := @schema@._delta_kind(call);
      input_expr := NULL;
      input_idx := NULL;
      IF kind ? 'kind' AND kind->>'input_kind' <> 'none' THEN
        IF kind->>'input_kind' = 'flag' THEN
          input_expr := concat_ws(' AND ',
            CASE WHEN (call->>'filtered')::boolean THEN 'coalesce((' || (call->>'filter') || '), false)' END,
            CASE WHEN NOT (call->>'star')::boolean THEN '(' || (call->>'args') || ') IS NOT NULL' END);
          info := jsonb_build_object('columns', jsonb_build_array(jsonb_build_object('type', 'boolean')));
        ELSE
          input_expr := CASE WHEN (call->>'filtered')::boolean
                             THEN 'CASE WHEN (' || (call->>'filter') || ') THEN (' || (call->>'args') || ') END'
                             ELSE '(' || (call->>'args') || ')' END;
          -- Typed as the argument is (numeric(12,2) keeps its scale; a FILTER's CASE would not).
          info := @schema@._analyze_query('SELECT (' || (call->>'args') || ') FROM ' || cross_sql,
            format('in %s (%s)', part, call->>'args'));
        END IF;
        SELECT o::int INTO input_idx FROM jsonb_array_elements(inputs) WITH ORDINALITY AS x(i, o)
         WHERE i->>'expr' = input_expr;
        IF input_idx IS NULL THEN
          inputs := inputs || jsonb_build_array(jsonb_build_object(
            'expr', input_expr,
            'type', info->'columns'->0->>'type',
            'collation', info->'columns'->0->'collation'));
          input_idx := jsonb_array_length(inputs);
        END IF;
      END IF;
      -- The same call twice (in two columns) is one aggregate.
      SELECT o::int INTO idx FROM jsonb_array_elements(aggs) WITH ORDINALITY AS x(a, o)
       WHERE a->>'fn' = call->>'fn' AND a->>'args' = call->>'args'
         AND a->>'filter' IS NOT DISTINCT FROM call->>'filter' AND a->>'star' = call->>'star';
      IF idx IS NULL THEN
        aggs := aggs || jsonb_build_array(jsonb_build_object(
          'call', substr(col->>'expr', (call->>'first')::int, (call->>'last')::int - (call->>'first')::int + 1),
          'fn', call->>'fn', 'args', call->>'args', 'filter', call->>'filter', 'star', call->>'star',
          'kind', kind->'kind', 'delta', kind ? 'kind', 'why', kind->'why',
          'input', input_idx, 'type', call->>'aggtype', 'collation', call->'collation',
          -- numeric(p,s) inputs all have display scale s: no need to track the largest.
          'scale', CASE WHEN kind->>'kind' IN ('sum_numeric', 'avg_numeric')
                        THEN (regexp_match(inputs->(input_idx - 1)->>'type', '^numeric\(\d+,(\d+)\)$'))[1]::int END));
        idx := jsonb_array_length(aggs);
      END IF;
      IF NOT (kind ? 'kind') AND reason IS NULL THEN
        reason := format('%s: %s', aggs->(idx - 1)->>'call', kind->>'why');
      END IF;
      rewritten := substr(rewritten, 1, (call->>'first')::int - 1)
        || quote_ident('trellis#a' || idx)
        || substr(rewritten, (call->>'last')::int + 1);
    END LOOP;
    IF col->>'part' IS NOT NULL THEN
      items := items || jsonb_build_object(col->>'part', rewritten);
    ELSE
      having_expr := rewritten;
    END IF;
  END LOOP;
  IF reason IS NULL THEN
    SELECT format('GROUP BY %s (%s): equal values of it can be written differently, and a group shows how its rows write it',
                  g->>'expr', concat_ws(' COLLATE ', g->>'type', g->>'collation'))
      INTO reason
      FROM jsonb_array_elements(coalesce(spec->'groups', '[]')) WITH ORDINALITY AS x(g, o)
     WHERE NOT @schema@._equal_means_identical(g->>'type', g->>'collation')
     ORDER BY o LIMIT 1;
  END IF;
  IF reason IS NULL THEN
    placeholders := coalesce((SELECT jsonb_agg(jsonb_build_object('name', 'trellis#a' || o, 'type', a->>'type'))
                                FROM jsonb_array_elements(aggs) WITH ORDINALITY AS x(a, o)), '[]');
    FOR col IN SELECT value FROM jsonb_array_elements(exprs) LOOP
      rewritten := coalesce(items->>(col->>'part'), having_expr);
      IF NOT @schema@._reads_only(rewritten, placeholders) THEN
        reason := format('%s reads columns outside its aggregates', coalesce('column ' || quote_ident(col->>'part'), 'HAVING'));
        EXIT;
      END IF;
    END LOOP;
  END IF;
  IF reason IS NOT NULL THEN
    mode := 'group';
  END IF;
  RETURN jsonb_build_object(
    'mode', mode,
    'reason', coalesce(reason, CASE WHEN jsonb_array_length(aggs) = 0
                                    THEN 'no aggregates: each group is its key'
                                    ELSE 'every aggregate has an exact delta' END),
    'aggs', aggs, 'inputs', inputs, 'items', items, 'having', having_expr);
END
$fn$;

-- As before (0009), and for a transform whose aggregates are kept by delta: the key map
-- carries each join row's aggregate inputs, is made for a grand total too, and is indexed
-- by group where an extreme may have to be read again; the group state table is created.
-- The classification is recorded in transforms.delta (and spec.key_map follows it).
CREATE OR REPLACE FUNCTION @schema@._create_key_map(transform_id int, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM @schema@._make_key_map(transform_id, spec, @schema@._classify_aggregates(spec));
END
$fn$;

-- The key map (and, kept by delta, the group state table) of a transform, as
-- `classified` (_classify_aggregates) says; records the classification.
CREATE FUNCTION @schema@._make_key_map(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  map_sql text := quote_ident(@schema_literal@) || '.' || quote_ident('map_' || transform_id);
  state_sql text := quote_ident(@schema_literal@) || '.' || quote_ident('groups_' || transform_id);
  kind text := @schema@._key_map_kind(spec);
  is_delta boolean;
  src jsonb;
  groups text;
BEGIN
  is_delta := classified->>'mode' = 'delta';
  IF is_delta THEN
    kind := 'groups';
  END IF;
  UPDATE @schema@.transforms t
     SET delta = classified,
         spec = t.spec || jsonb_build_object('key_map', kind)
   WHERE t.id = transform_id;
  -- A group state table left by a transform of the same id in a dumped database.
  EXECUTE 'DROP TABLE IF EXISTS ' || state_sql;
  IF kind IS NULL THEN
    RETURN;
  END IF;
  EXECUTE 'CREATE TABLE ' || map_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT (s->>'ordinal')::int AS o1, k.o AS o2,
             quote_ident(format('k%s_%s', s->>'ordinal', k.o)) || ' ' || k.t AS col
        FROM jsonb_array_elements(spec->'sources') s,
             jsonb_array_elements_text(s->'key_types') WITH ORDINALITY AS k(t, o)
      UNION ALL
      SELECT 1000000, g.o, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '')
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)
      UNION ALL
      SELECT 2000000, 0, 'passes boolean NOT NULL' WHERE kind = 'groups'
      UNION ALL
      SELECT 3000000, i.o, quote_ident(format('i%s', i.o)) || ' ' || (i.v->>'type')
                            || coalesce(' COLLATE ' || (i.v->>'collation'), '')
        FROM jsonb_array_elements(CASE WHEN is_delta THEN classified->'inputs' ELSE '[]' END)
             WITH ORDINALITY AS i(v, o)) c) || ')';
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') LOOP
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || (
      SELECT string_agg(quote_ident(format('k%s_%s', src->>'ordinal', k.o)), ', ' ORDER BY k.o)
        FROM jsonb_array_elements_text(src->'key_types') WITH ORDINALITY AS k(t, o)) || ')';
  END LOOP;
  IF NOT is_delta THEN
    RETURN;
  END IF;
  groups := (SELECT string_agg(quote_ident('g' || o), ', ' ORDER BY o)
               FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS x(g, o));
  -- A rescan reads a group's rows from the key map.
  IF groups IS NOT NULL AND EXISTS (
       SELECT 1 FROM jsonb_array_elements(classified->'aggs') a
        WHERE a->>'kind' IN ('min', 'max')
           OR (a->>'kind' IN ('sum_numeric', 'avg_numeric') AND a->>'scale' IS NULL)) THEN
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || groups || ')';
  END IF;
  EXECUTE 'CREATE TABLE ' || state_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT 0 AS o1, g.o AS o2, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '') AS col
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)
      UNION ALL
      SELECT 1, 0, 'n bigint NOT NULL'
      UNION ALL
      SELECT 2, a.o * 10 + p.o, quote_ident(format('a%s_%s', a.o, p.part)) || ' ' || p.type
        FROM jsonb_array_elements(classified->'aggs') WITH ORDINALITY AS a(v, o)
        CROSS JOIN LATERAL (
          SELECT * FROM (VALUES
            (1, 'c', 'bigint', true),
            (2, 's', CASE WHEN a.v->>'kind' = 'sum_int' THEN 'bigint' ELSE 'numeric' END,
                     a.v->>'kind' IN ('sum_int', 'sum_int8', 'avg_int', 'sum_numeric', 'avg_numeric')),
            (3, 'nan', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (4, 'pinf', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (5, 'ninf', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (6, 'ms', 'int', a.v->>'kind' IN ('sum_numeric', 'avg_numeric') AND a.v->>'scale' IS NULL),
            (7, 'msc', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric') AND a.v->>'scale' IS NULL),
            (8, 'm', (a.v->>'type') || coalesce(' COLLATE ' || (a.v->>'collation'), ''), a.v->>'kind' IN ('min', 'max')),
            (9, 'b', 'bigint', a.v->>'kind' IN ('bool_and', 'bool_or'))
          ) AS parts(o, part, type, used)
          WHERE used AND (a.v->>'kind' <> 'count' OR part = 'c')) p) c) || ')';
  EXECUTE 'CREATE UNIQUE INDEX ON ' || state_sql
    || coalesce(' (' || groups || ') NULLS NOT DISTINCT', ' ((true))');
END
$fn$;

-- A join with a WHERE keeps a 'rows' key map only when a LEFT JOIN can turn a row the
-- WHERE filtered out into a NULL-extended row that passes: an inner join's old rows are
-- the target's, as without a WHERE. (Maps made before stay, and keep working.)
CREATE OR REPLACE FUNCTION @schema@._key_map_kind(spec jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE
    WHEN jsonb_array_length(coalesce(spec->'groups', '[]')) > 0 THEN 'groups'
    WHEN jsonb_array_length(spec->'sources') > 1 AND spec->'ast'->>'where' IS NOT NULL
         AND EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s WHERE s->>'join_type' = 'left')
      THEN 'rows'
  END
$fn$;

-- A transform's group state table goes with it.
CREATE FUNCTION @schema@._drop_group_states()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('groups_' || OLD.id);
  RETURN NULL;
END
$fn$;

CREATE TRIGGER drop_group_states AFTER DELETE ON @schema@.transforms
  FOR EACH ROW EXECUTE FUNCTION @schema@._drop_group_states();


-- ALTER ... ADD COLUMN: as before (0009), and an aggregating transform's key map and group
-- states are made again for the new column.
CREATE OR REPLACE FUNCTION @schema@._alter_add_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  new_ast jsonb;
  spec jsonb;
  col jsonb;
BEGIN
  IF EXISTS (SELECT 1 FROM @schema@.transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'name') THEN
    PERFORM @schema@._fail('TRV01', format('transform %I already has a column %I', t.target_name, ast->>'name'));
  END IF;
  new_ast := jsonb_set(t.spec->'ast', '{select}', (t.spec->'ast'->'select') || jsonb_build_array(
    jsonb_build_object('expr', ast->>'expr', 'name', ast->>'name', 'bare_label', NULL,
                       'label_expr', NULL, 'position', NULL)));
  spec := @schema@._analyze_transform(new_ast);
  IF (spec->>'aggregates')::boolean <> t.aggregates THEN
    PERFORM @schema@._fail('TRV01', format(
      'column %I would make transform %I %s: define a new transform instead', ast->>'name', t.target_name,
      CASE WHEN t.aggregates THEN 'stop aggregating' ELSE 'aggregate' END));
  END IF;
  IF @schema@._check_definition(spec) AND NOT coalesce((t.spec->>'whole_row')::boolean, false) THEN
    UPDATE @schema@.transforms SET spec = spec || '{"whole_row": true}' WHERE id = t.id;
  END IF;
  SELECT c INTO col FROM jsonb_array_elements(spec->'columns') c WHERE c->>'name' = ast->>'name';
  BEGIN
    EXECUTE 'ALTER TABLE ' || t.target_oid::regclass::text || ' ADD COLUMN ' || quote_ident(col->>'name')
      || ' ' || (col->>'type') || coalesce(' COLLATE ' || (col->>'collation'), '');
  EXCEPTION WHEN program_limit_exceeded THEN
    -- Tables can have at most 1600 columns.
    PERFORM @schema@._fail('TRV01', format('column %I cannot be added to %I: %s', col->>'name', t.target_name, SQLERRM));
  END;
  INSERT INTO @schema@.transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  VALUES (t.id, (SELECT max(ordinal) + 1 FROM @schema@.transform_columns WHERE transform_id = t.id),
          col->>'name', col->>'expression', col->>'type', col->>'collation', false, false, col->'reads');
  -- Sources may now be read in more columns.
  UPDATE @schema@.transform_sources s
     SET read_columns = ARRAY(SELECT jsonb_array_elements_text(n->'read_columns'))::name[]
    FROM jsonb_array_elements(spec->'sources') n
   WHERE s.transform_id = t.id AND s.ordinal = (n->>'ordinal')::int;
  PERFORM @schema@._record_read_attrs(t.id);
  PERFORM @schema@._restate(t, new_ast);
  -- The new column's aggregates may need inputs in the key map, states of their own, or
  -- another way of maintenance: both are made again (the rebuild fills them).
  IF t.aggregates THEN
    EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id);
    PERFORM @schema@._create_key_map(t.id, spec);
  END IF;
  PERFORM @schema@._request_rebuild(t.id);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- Transforms defined before this migration keep their key maps and the group recompute
-- until their next build: their classification is recorded as pending, and the build
-- switches them (_switch_to_delta) — converting a live target in place would be a
-- rebuild's work inside this migration. Classified under the search_path each was
-- defined with.
DO $migrate$
DECLARE
  t record;
  old_path text := current_setting('search_path');
  classified jsonb;
BEGIN
  FOR t IN SELECT * FROM @schema@.transforms WHERE aggregates LOOP
    PERFORM set_config('search_path', t.search_path, true);
    BEGIN
      -- Analysed again: a spec's columns are not updated by ALTER ... ADD COLUMN.
      classified := @schema@._classify_aggregates(@schema@._analyze_transform(t.spec->'ast'));
    EXCEPTION WHEN OTHERS THEN
      -- A definition its sources no longer hold: it stays as it is (RESUME rebinds it).
      classified := NULL;
    END;
    PERFORM set_config('search_path', old_path, true);
    IF classified->>'mode' = 'delta' THEN
      classified := classified || '{"pending": true}';
    END IF;
    UPDATE @schema@.transforms SET delta = classified WHERE id = t.id;
  END LOOP;
END
$migrate$;

-- At the start of a build: a transform whose classification is pending (see above) gets
-- its key map and group state table made for delta maintenance, empty for the build to
-- fill. Returns whether it switched.
CREATE FUNCTION @schema@._switch_to_delta(transform_id int)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms;
BEGIN
  SELECT * INTO t FROM @schema@.transforms x WHERE x.id = transform_id;
  IF NOT coalesce((t.delta->>'pending')::boolean, false) THEN
    RETURN false;
  END IF;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id);
  PERFORM @schema@._make_key_map(t.id, t.spec, t.delta - 'pending');
  UPDATE @schema@.transforms SET updated_at = now() WHERE id = t.id;
  -- What applying ranges cost it by group recompute says nothing of delta.
  UPDATE @schema@.pipeline SET apply_costs = NULL WHERE pipeline.transform_id = t.id;
  RETURN true;
END
$fn$;

-- As in 0025, and lastApply carries the estimates the choice was made by.
CREATE OR REPLACE FUNCTION @schema@.status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t @schema@.transforms;
  p @schema@.pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := @schema@.workers();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM @schema@.transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM @schema@.pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM @schema@.transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM @schema@.transform_sources src
      JOIN @schema@.transforms u ON u.target_oid = src.source_oid
      JOIN @schema@.transform_columns uc ON uc.transform_id = u.id
     WHERE src.transform_id = t.id
       AND uc.name = ANY (src.read_columns)
       AND (uc.paused_at IS NOT NULL OR u.paused_at IS NOT NULL)
     ORDER BY 1));
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'node', c.node, 'since', c.since,
           'keysRemaining', CASE WHEN c.keys_total IS NOT NULL
                                 THEN greatest(c.keys_total - c.keys_done, 0) END)
         ORDER BY c.since, c.node), '[]')
    INTO correcting
    FROM @schema@.corrections c JOIN @schema@.sources src ON src.id = c.source_id
    JOIN @schema@.transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM @schema@.transform_sources ts
        JOIN @schema@.transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN @schema@.transform_sources ts ON ts.transform_id = up.id
        JOIN @schema@.transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN @schema@.transforms u ON u.id = up.id
      JOIN @schema@.pipeline pu ON pu.transform_id = u.id
     WHERE u.paused_at IS NOT NULL OR pu.phase <> 'live');

  lifecycle := CASE WHEN t.paused_at IS NOT NULL THEN 'paused' ELSE p.phase END;
  -- Rows that came or went without DML are being re-derived: a build, of a part of it.
  IF lifecycle IN ('live', 'catching_up') AND jsonb_array_length(correcting) > 0 THEN
    lifecycle := 'backfilling';
  END IF;
  -- A live transform reading a paused upstream column, or reading a target that is still
  -- being built, is not keeping up with its sources.
  IF lifecycle = 'live' AND (jsonb_array_length(paused_upstream) > 0 OR upstream_behind) THEN
    lifecycle := 'catching_up';
  END IF;

  IF p.cursor_tick IS NOT NULL THEN
    SELECT count(*), extract(epoch FROM clock_timestamp() - min(k.at))::float8
      INTO lag_segments, lag_seconds
      FROM @schema@.ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || @schema@._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM @schema@.transform_sources ts JOIN @schema@.sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || @schema@._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM @schema@.transform_sources ts JOIN @schema@.sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.widened_at IS NOT NULL AND ts.read_columns && src.widen_columns
     ORDER BY ts.ordinal LIMIT 1;
  END IF;
  -- WAL capture published a source and waits out the transactions that began before
  -- (they could write it unpublished) before a backfill reads it (ADR 0023).
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'publish', 'table', src.qualified, 'lockMode', 'none',
             'since', src.wal_since, 'attempts', NULL)
           || @schema@._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM @schema@.transform_sources ts JOIN @schema@.sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM @schema@.transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM @schema@.pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM @schema@.held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
        FROM jsonb_array_elements(@schema@.source_index_gaps(t.id)) g),
    'correcting', correcting,
    'captureFailure', CASE WHEN t.capture_failure IS NOT NULL THEN jsonb_build_object(
        'kind', t.capture_failure->'kind', 'error', t.capture_failure->'error',
        'columns', t.capture_failure->'columns',
        'detectedAt', (t.capture_failure->>'detected_at')::timestamptz) END,
    'captureWait', wait,
    'buildFailure', CASE WHEN p.build_attempts > 0 AND p.build_error IS NOT NULL
                          AND p.build_next_at IS NOT NULL THEN jsonb_build_object(
        'attempts', p.build_attempts, 'error', p.build_error,
        'nextAttemptAt', p.build_next_at) END,
    'drainFailure', drain,
    'backfill', CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM @schema@.build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', @schema@._capture_status(t.id),
    'rowSecurity', @schema@._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', @schema@._worker_failure(health),
    'waitingOn', @schema@._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                      upstream_behind OR jsonb_array_length(paused_upstream) > 0));
END
$fn$;

-- How a transform is kept up to date when its sources change (the handle's Maintenance):
--   {mode: 'rows' | 'delta' | 'group', reason,
--    aggregates: [{call, how: 'delta' | 'delta+rescan' | 'recompute', why}]}
CREATE FUNCTION @schema@._maintenance(aggregates boolean, delta jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE
    WHEN NOT aggregates THEN jsonb_build_object(
      'mode', 'rows', 'reason', 'each changed key''s target rows are re-derived', 'aggregates', '[]'::jsonb)
    WHEN delta IS NULL THEN jsonb_build_object(
      'mode', 'group', 'reason', 'each changed group is recomputed from its rows', 'aggregates', '[]'::jsonb)
    ELSE (
      WITH d AS (
        SELECT delta->>'mode' = 'delta' AND NOT coalesce((delta->>'pending')::boolean, false) AS kept)
      SELECT jsonb_build_object(
        'mode', CASE WHEN d.kept THEN 'delta' ELSE 'group' END,
        'reason', CASE WHEN coalesce((delta->>'pending')::boolean, false)
                       THEN (delta->>'reason') || ': kept by delta from its next build (defined before trellis-pg kept aggregates by delta; requestBackfill() rebuilds it)'
                       ELSE delta->>'reason' END,
        'aggregates', coalesce((
          SELECT jsonb_agg(jsonb_build_object(
                   'call', a->>'call',
                   'how', CASE WHEN NOT d.kept THEN 'recompute'
                               WHEN a->>'kind' IN ('min', 'max')
                                    OR (a->>'kind' IN ('sum_numeric', 'avg_numeric') AND a->>'scale' IS NULL)
                               THEN 'delta+rescan'
                               ELSE 'delta' END,
                   'why', coalesce(a->>'why', CASE WHEN NOT d.kept THEN
                     format('another part of the definition needs the group''s rows (%s)', delta->>'reason') END))
                 ORDER BY o)
            FROM jsonb_array_elements(delta->'aggs') WITH ORDINALITY AS x(a, o)), '[]'))
        FROM d)
  END
$fn$;

-- Every registered transform (the handle's Definition), as in 0024, with how it is kept
-- (maintenance).
CREATE OR REPLACE FUNCTION @schema@.definitions()
RETURNS SETOF jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object(
           'target', t.target_name,
           'targetSchema', t.target_schema,
           'statement', t.statement,
           'sources', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'table', s.source_schema || '.' || s.source_name, 'alias', s.alias,
                      'join', s.join_type, 'keyColumns', to_jsonb(s.key_columns))
                    ORDER BY s.ordinal)
               FROM @schema@.transform_sources s WHERE s.transform_id = t.id), '[]'),
           'columns', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'type', c.type, 'expression', c.expression,
                      'key', c.is_key, 'implicit', c.implicit)
                    ORDER BY c.ordinal)
               FROM @schema@.transform_columns c WHERE c.transform_id = t.id), '[]'),
           'options', jsonb_build_object(
             'withoutSourceIndex', t.without_source_index,
             'withoutRowSecurity', coalesce((t.spec->'ast'->>'without_row_security')::boolean, false)),
           'settings', t.settings,
           'aggregates', t.aggregates,
           'maintenance', @schema@._maintenance(t.aggregates, t.delta),
           'createdAt', t.created_at,
           'updatedAt', t.updated_at)
    FROM @schema@.transforms t
   ORDER BY t.target_name
$fn$;
