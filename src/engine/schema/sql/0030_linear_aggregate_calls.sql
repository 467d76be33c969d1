-- Defining a GROUP BY over a many-way self-join took seconds in _aggregate_calls (0026):
-- it read the view's node string one character at a time with substr(), which walks a
-- multibyte text from its start at every call, so its cost grew with the square of the
-- string (a six-way self-join's is hundreds of kilobytes: every range table entry lists
-- its columns). Replaced by a walk by byte offset over the string's bytes, linear in its
-- size; what it returns is unchanged.

-- As in 0026, with the node string walked by byte offset.
CREATE OR REPLACE FUNCTION @schema@._aggregate_calls(expr text, from_sql text, group_list text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  prefix text := 'CREATE TEMP VIEW trellis_aggregates AS SELECT ';
  stmt text := prefix || expr || ' FROM ' || from_sql || ' GROUP BY ' || group_list;
  enc text := current_setting('server_encoding');
  action text;
  bytes bytea;
  pieces text[];
  at int;
  k int;
  depth int;
  b int;
  i int;
  node text;
  own text;
  m text[];
  loc int;
  pos int;
  toks @schema@.grammar_token[];
  t int;
  open_at int;
  close_at int;
  filter_open int;
  filter_close int;
  args text;
  filter_text text;
  calls jsonb := '[]';
  coll oid;
BEGIN
  DROP VIEW IF EXISTS pg_temp.trellis_aggregates;
  EXECUTE stmt;
  SELECT r.ev_action::text INTO action
    FROM pg_rewrite r WHERE r.ev_class = 'pg_temp.trellis_aggregates'::regclass;
  DROP VIEW pg_temp.trellis_aggregates;
  toks := @schema@.grammar_tokenize(expr);
  -- Walked by byte offset, each byte read once (0030): the node string as bytes (its
  -- structural characters are ASCII, which no multibyte character of a server encoding
  -- contains), its AGGREF nodes found by one split. Reading it a character at a time by
  -- substr(), as 0026 did, walked the text from its start at every step: quadratic in the
  -- size of the view's tree, seconds for a six-way self-join.
  bytes := textsend(action);
  pieces := string_to_array(action, '{AGGREF ');
  at := 0;
  FOR k IN 1 .. coalesce(array_length(pieces, 1), 0) - 1 LOOP
    -- 0-based byte offset of the k-th '{AGGREF '.
    at := at + octet_length(pieces[k]) + CASE WHEN k > 1 THEN 8 ELSE 0 END;
    -- Inside a token, a brace is escaped with a backslash: not a node.
    CONTINUE WHEN right(pieces[k], 1) = chr(92);
    -- The node, up to its closing brace.
    depth := 0;
    i := at;
    LOOP
      b := get_byte(bytes, i);
      IF b = 92 THEN  -- a backslash: the next byte belongs to a token
        i := i + 2;
        CONTINUE;
      END IF;
      IF b = 123 THEN
        depth := depth + 1;
      ELSIF b = 125 THEN
        depth := depth - 1;
        EXIT WHEN depth = 0;
      END IF;
      i := i + 1;
    END LOOP;
    node := convert_from(substring(bytes FROM at + 1 FOR i - at + 1), enc);
    own := @schema@._node_own_fields(node);
    m := regexp_match(own, ':location (-?\d+)\}$');
    loc := m[1]::int;
    -- Byte offset in the statement -> character position in expr (1-based).
    pos := length(convert_from(substring(convert_to(stmt, enc) FROM 1 FOR loc), enc))
           - length(prefix) + 1;
    IF pos < 1 OR pos > length(expr) THEN
      -- Not one of expr's own calls (a GROUP BY item's): nothing to rewrite there.
      CONTINUE;
    END IF;
    -- The call as written: a (qualified) name, its parenthesised arguments, then FILTER.
    t := NULL;
    FOR i IN 1 .. coalesce(array_length(toks, 1), 0) LOOP
      IF toks[i].pos = pos THEN
        t := i;
        EXIT;
      END IF;
    END LOOP;
    CONTINUE WHEN t IS NULL;
    WHILE toks[t].kind IN ('word', 'ident', 'uident') OR (toks[t].kind = 'punct' AND toks[t].text = '.') LOOP
      t := t + 1;
    END LOOP;
    CONTINUE WHEN NOT (toks[t].kind = 'punct' AND toks[t].text = '(');
    open_at := t;
    depth := 0;
    LOOP
      IF toks[t].kind = 'punct' AND toks[t].text IN ('(', '[') THEN
        depth := depth + 1;
      ELSIF toks[t].kind = 'punct' AND toks[t].text IN (')', ']') THEN
        depth := depth - 1;
        EXIT WHEN depth = 0;
      END IF;
      t := t + 1;
    END LOOP;
    close_at := t;
    args := btrim(substr(expr, toks[open_at].pos + 1, toks[close_at].pos - toks[open_at].pos - 1));
    IF toks[open_at + 1].kind = 'word' AND lower(toks[open_at + 1].text) = 'all' THEN
      args := btrim(substr(expr, toks[open_at + 2].pos, toks[close_at].pos - toks[open_at + 2].pos));
    END IF;
    filter_text := NULL;
    IF toks[close_at + 1].kind = 'word' AND lower(toks[close_at + 1].text) = 'filter' THEN
      filter_open := close_at + 2;
      t := filter_open;
      depth := 0;
      LOOP
        IF toks[t].kind = 'punct' AND toks[t].text IN ('(', '[') THEN
          depth := depth + 1;
        ELSIF toks[t].kind = 'punct' AND toks[t].text IN (')', ']') THEN
          depth := depth - 1;
          EXIT WHEN depth = 0;
        END IF;
        t := t + 1;
      END LOOP;
      filter_close := t;
      -- (WHERE condition)
      filter_text := btrim(substr(expr, toks[filter_open + 2].pos,
                             toks[filter_close].pos - toks[filter_open + 2].pos));
      close_at := filter_close;
    END IF;
    coll := nullif((regexp_match(own, ':inputcollid (\d+)'))[1]::oid, 0);
    calls := calls || jsonb_build_array(jsonb_build_object(
      'fn', ((regexp_match(own, ':aggfnoid (\d+)'))[1]::oid)::regprocedure::text,
      'name', (SELECT p.proname FROM pg_proc p WHERE p.oid = (regexp_match(own, ':aggfnoid (\d+)'))[1]::oid),
      'builtin', (SELECT p.pronamespace = 'pg_catalog'::regnamespace FROM pg_proc p
                   WHERE p.oid = (regexp_match(own, ':aggfnoid (\d+)'))[1]::oid),
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
      'first', pos,
      'last', toks[close_at].pos,
      'args', args,
      'filter', filter_text));
  END LOOP;
  RETURN calls;
END
$fn$;
