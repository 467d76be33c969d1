-- rank() and dense_rank() top-N over SEVERAL order expressions compare a row's values with
-- the others' as one text, `ROW(o1, o2, ...)::text` (ADR 0065): values equal in order but
-- not in text (numeric 1.0 and 1.00, float8 0 and -0, interval '1 day' and '24 hours',
-- citext 'A' and 'a') got different ranks where Postgres gives them one (0058 typed the
-- comparison for one order expression only: a record[] cannot be a column).
--
-- Wrapped again (the pattern of 0039-0041): `_topn_rewrite_window` (0058's) is renamed
-- `_topn_rewrite_window_before_canon`, and the new function of the old name rewrites its
-- result for rank and dense_rank over several order expressions: each value in the probe
-- is its canonical text (`_topn_canon`), the same text for values its type calls equal, so
-- equal texts are equal values and the other way round. Rows are still ordered by the
-- values themselves. Transforms defined before keep the old probe until defined again (or
-- redefined with ALTER TRANSFORM … AS).

ALTER FUNCTION @schema@._topn_rewrite_window(jsonb, int) RENAME TO _topn_rewrite_window_before_canon;

-- A value's text, the same for every value its type's equality calls equal: numerics without
-- trailing zeros, float zero without its sign, intervals justified (30-day months, 24-hour
-- days, as interval comparison counts them), citext in lower case; any other type's own
-- text (equal and same text for the types a ranking orders by: integers, text under a
-- deterministic collation, dates, timestamps, booleans, uuids). IMMUTABLE as a definition's
-- own functions must be (the check of _check_definition): a type's text can depend on
-- settings (timestamptz on TimeZone), which a transform's statements run under as it was
-- defined (ADR 0033), as the `::text` it replaces did.
CREATE FUNCTION @schema@._topn_canon(v anyelement)
RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
  t regtype := pg_typeof(v);
BEGIN
  IF v IS NULL THEN
    RETURN NULL;
  ELSIF t = 'numeric'::regtype THEN
    RETURN trim_scale(v::text::numeric)::text;
  ELSIF t IN ('float8'::regtype, 'float4'::regtype) THEN
    RETURN CASE WHEN v::text::float8 = 0 THEN '0' ELSE v::text END;
  ELSIF t = 'interval'::regtype THEN
    RETURN justify_interval(v::text::interval)::text;
  -- By the type's name (a syscache lookup, not a query per value): citext in any schema.
  ELSIF t::text ~ '(^|\.)citext$' THEN
    RETURN lower(v::text);
  END IF;
  RETURN v::text;
END
$fn$;

CREATE FUNCTION @schema@._topn_rewrite_window(pa jsonb, k int)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  win jsonb := pa -> 'window';
  res jsonb := @schema@._topn_rewrite_window_before_canon(pa, k);
  old_probe text;
  new_probe text;
BEGIN
  IF win ->> 'fn' NOT IN ('rank', 'dense_rank') OR jsonb_array_length(win -> 'order_by') < 2 THEN
    RETURN res;
  END IF;
  -- As _topn_rewrite_window_before_mvcc writes it (0045): in the top k's aggregate, the
  -- rank item and the WHERE.
  old_probe := 'ROW(' || (SELECT string_agg('(' || (o ->> 'expr') || ')', ', ' ORDER BY n)
                            FROM jsonb_array_elements(win -> 'order_by') WITH ORDINALITY AS x(o, n)) || ')::text';
  new_probe := 'ROW(' || (SELECT string_agg('@schema@._topn_canon((' || (o ->> 'expr') || '))', ', ' ORDER BY n)
                            FROM jsonb_array_elements(win -> 'order_by') WITH ORDINALITY AS x(o, n)) || ')::text';
  RETURN replace(res::text, @schema@._json_inner(old_probe), @schema@._json_inner(new_probe))::jsonb;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;

-- Set operations whose rows are counted by their text (ADR 0073: an ALL operator outermost,
-- or any set operation in a subquery or WITH query) grouped a row's copies by
-- `ROW(items)::text`: values equal to Postgres but not in text (numeric 1.0 and 1.00, an
-- integer 1 in one branch and a numeric 1.0 in another) were different rows, so INTERSECT
-- dropped them and EXCEPT kept them. Wrapped: `grammar_parse_view` (4 arguments, 0059's) is
-- renamed `grammar_parse_view_before_canon`, and the new function of the old name rewrites
-- each "trellis#row" item the set operation wrote into the same row of canonical texts
-- (`_topn_canon`): equal values, one group. A row shows one of its equal values, as
-- Postgres's own result does. Transforms defined before keep the text until defined again.
ALTER FUNCTION @schema@.grammar_parse_view(@schema@.grammar_token[], int, jsonb, jsonb)
  RENAME TO grammar_parse_view_before_canon;

-- `node` with every SELECT list's "trellis#row" item, as the set operation writes it
-- (`ROW((e1), (e2), ...)::text` over the items before it), made of canonical texts.
CREATE FUNCTION @schema@._setop_row_canon(node jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  res jsonb;
  items jsonb;
  before text;
  written text;
  canon text;
  i int;
BEGIN
  IF jsonb_typeof(node) = 'array' THEN
    RETURN (SELECT coalesce(jsonb_agg(@schema@._setop_row_canon(e) ORDER BY o), '[]')
              FROM jsonb_array_elements(node) WITH ORDINALITY AS x(e, o));
  ELSIF jsonb_typeof(node) IS DISTINCT FROM 'object' THEN
    RETURN node;
  END IF;
  SELECT coalesce(jsonb_object_agg(k, @schema@._setop_row_canon(v)), '{}') INTO res
    FROM jsonb_each(node) AS x(k, v);
  items := res -> 'select';
  IF jsonb_typeof(items) = 'array' THEN
    FOR i IN 0 .. jsonb_array_length(items) - 1 LOOP
      CONTINUE WHEN items -> i ->> 'name' IS DISTINCT FROM 'trellis#row' OR i = 0;
      SELECT 'ROW(' || string_agg('(' || (e ->> 'expr') || ')', ', ' ORDER BY o) || ')::text',
             'ROW(' || string_agg('@schema@._topn_canon((' || (e ->> 'expr') || '))', ', ' ORDER BY o) || ')::text'
        INTO written, canon
        FROM jsonb_array_elements(items) WITH ORDINALITY AS x(e, o) WHERE o <= i;
      before := items -> i ->> 'expr';
      IF before = written THEN
        items := jsonb_set(items, ARRAY[i::text, 'expr'], to_jsonb(canon));
      END IF;
    END LOOP;
    res := jsonb_set(res, '{select}', items);
  END IF;
  RETURN res;
END
$fn$;

CREATE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  res jsonb := @schema@.grammar_parse_view_before_canon(toks, i, target, ctes);
BEGIN
  IF strpos(res::text, 'trellis#row') = 0 THEN
    RETURN res;
  END IF;
  RETURN @schema@._setop_row_canon(res);
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
