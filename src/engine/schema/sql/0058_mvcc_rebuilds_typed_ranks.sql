-- rank() and dense_rank() top-N compare ORDER BY values with their own type's equality
-- (ADR 0076), as Postgres ranks them: numeric 1.0 and 1.00 share a rank. Until now the
-- partition's top k held the values as text (`ROW(o)::text`, ADR 0065), so values equal in
-- order but not in text counted as different ranks.
--
-- Wrapped (the pattern of 0039-0041): `_topn_rewrite_window` is renamed
-- `_topn_rewrite_window_before_mvcc`, and the new function of the old name rewrites its
-- result for rank and dense_rank over ONE order expression: the top k is an array of the
-- expression's own type (`array_agg(o ORDER BY o …, (o)::text)`, the text only breaking
-- ties between equal values so the stored array is one function of the rows), and a row's
-- rank is `array_position(top, o)` (the type's equality). Over several order expressions
-- the values are still compared as text (a record[] column cannot be stored): left, and
-- said in README. Transforms defined before keep the text comparison until defined again
-- (or redefined with ALTER TRANSFORM … AS).

ALTER FUNCTION @schema@._topn_rewrite_window(jsonb, int) RENAME TO _topn_rewrite_window_before_mvcc;

-- The first k distinct values of `a` (in its order), for an array of any type: equality is
-- the element type's (array_position).
CREATE FUNCTION @schema@._topn_distinct_prefix(a anyarray, k int)
RETURNS anyarray LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
  res ALIAS FOR $0;
BEGIN
  IF a IS NULL THEN
    RETURN a;
  END IF;
  res := a[1:0];
  FOR i IN 1 .. coalesce(cardinality(a), 0) LOOP
    IF array_position(res, a[i]) IS NULL THEN
      EXIT WHEN cardinality(res) >= k;
      res := array_append(res, a[i]);
    END IF;
  END LOOP;
  RETURN res;
END
$fn$;

CREATE FUNCTION @schema@._topn_rewrite_window(pa jsonb, k int)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  win jsonb := pa -> 'window';
  res jsonb := @schema@._topn_rewrite_window_before_mvcc(pa, k);
  expr text;
  ord text;
  old_probe text;
  old_top text;
  new_top text;
  txt text;
BEGIN
  IF win ->> 'fn' NOT IN ('rank', 'dense_rank') OR jsonb_array_length(win -> 'order_by') <> 1 THEN
    RETURN res;
  END IF;
  -- As _topn_rewrite_window_before_mvcc writes them (0045).
  expr := '(' || (win -> 'order_by' -> 0 ->> 'expr') || ')';
  ord := expr || coalesce(' ' || (win -> 'order_by' -> 0 ->> 'dir'), '');
  old_probe := 'ROW(' || expr || ')::text';
  old_top := format('array_agg(%s ORDER BY %s)', old_probe, ord);
  new_top := format('array_agg(%s ORDER BY %s, (%s)::text)', expr, ord, expr);
  -- Replaced inside the AST's strings (the top k's aggregate, then every probe: the rank
  -- item and the WHERE), as JSON writes them.
  txt := res::text;
  txt := replace(txt, @schema@._json_inner(old_top), @schema@._json_inner(new_top));
  txt := replace(txt, @schema@._json_inner(old_probe), @schema@._json_inner(expr));
  RETURN txt::jsonb;
END
$fn$;

-- A string as it appears inside a JSON text (escaped, without its quotes).
CREATE FUNCTION @schema@._json_inner(s text)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT substr(to_jsonb(s)::text, 2, length(to_jsonb(s)::text) - 2)
$fn$;

-- RESUME of a target whose key was dropped by hand (0014's _repair_target): it TRUNCATEd
-- the target before adding the key back, and TRUNCATE is not MVCC-safe (a repeatable-read
-- reader whose snapshot came before read the target empty, ADR 0076). Wrapped (renamed
-- `_repair_target_before_mvcc`): when the target is there without its key and every key
-- column is there, it is emptied here with DELETE and the key added back, as 0014 does, so
-- the delegate finds the key and does not TRUNCATE. (A key column dropped too: the delegate
-- adds it and TRUNCATEs, as before.)
ALTER FUNCTION @schema@._repair_target(@schema@.transforms) RENAME TO _repair_target_before_mvcc;

CREATE FUNCTION @schema@._repair_target(t @schema@.transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  qualified text := quote_ident(t.target_schema) || '.' || quote_ident(t.target_name);
  keys text;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = t.target_oid)
     AND NOT EXISTS (SELECT 1 FROM pg_index x
                      WHERE x.indrelid = t.target_oid AND (x.indisprimary OR x.indisunique))
     AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(coalesce(t.spec->'key', '[]')) k
                      WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
                                         WHERE a.attrelid = t.target_oid AND a.attname = k
                                           AND a.attnum > 0 AND NOT a.attisdropped)) THEN
    keys := (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k);
    -- As Trellis: the guard, if it is there, lets only Trellis write.
    PERFORM set_config('trellis.maintaining', @schema_literal@, true);
    EXECUTE 'DELETE FROM ' || qualified;
    IF keys IS NULL THEN
      EXECUTE 'CREATE UNIQUE INDEX ON ' || qualified || ' ((true))';
    ELSIF (t.spec->>'key_nullable')::boolean THEN
      EXECUTE 'ALTER TABLE ' || qualified || ' ADD UNIQUE NULLS NOT DISTINCT (' || keys || ')';
    ELSE
      EXECUTE 'ALTER TABLE ' || qualified || ' ADD PRIMARY KEY (' || keys || ')';
    END IF;
  END IF;
  PERFORM @schema@._repair_target_before_mvcc(t);
END
$fn$;
