-- ALTER TRANSFORM t AS <statement> into a top-N (issue #25: a definition changes like code;
-- #26: the view SQL it may change into): a ranking derived table, or a ranking WITH query
-- (0062), was refused ("a window function is kept only as top-N per partition") although the
-- same statement defines a transform. TRANSFORM binds the rankings before it defines anything
-- (`_define` calls `_topn_bind`, 0045: each ranking part rewritten into the partition's top k
-- and the rows joined with it); ALTER … AS did not, and each part's own check then refused
-- the ranking SELECT.
--
-- Wrapped (the pattern of 0039-0041): `_redefine` (0056's) is renamed `_redefine_before_topn`;
-- the new function of the old name binds the new definition's rankings as `_define` does,
-- then delegates.

ALTER FUNCTION @schema@._redefine(jsonb) RENAME TO _redefine_before_topn;

CREATE FUNCTION @schema@._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast -> 'definition' ->> 'form' = 'as' THEN
    ast := jsonb_set(ast, '{definition}', @schema@._topn_bind(ast -> 'definition'));
  END IF;
  RETURN @schema@._redefine_before_topn(ast);
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;

-- A RIGHT or FULL JOIN after another join checks that every column is written with its
-- table's alias (`_prefix_refs`, 0054): the name after COLLATE (`a.tag COLLATE "C"`) was taken
-- for a bare column and the statement refused (found by the differential generator).
-- Wrapped: renamed `_prefix_refs_before_collate`; the new function of the old name drops
-- collation names from the bare names its delegate found.
ALTER FUNCTION @schema@._prefix_refs(text, jsonb, text) RENAME TO _prefix_refs_before_collate;

CREATE FUNCTION @schema@._prefix_refs(expr text, sources jsonb, q text)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  r jsonb := @schema@._prefix_refs_before_collate(expr, sources, q);
  t @schema@.grammar_token[];
  collations text[];
BEGIN
  IF jsonb_array_length(r -> 'bare') = 0 THEN
    RETURN r;
  END IF;
  t := @schema@.grammar_tokenize(expr);
  collations := ARRAY(SELECT t[k].text FROM generate_series(2, coalesce(array_length(t, 1), 0)) k
                       WHERE t[k - 1].kind = 'word' AND t[k - 1].value = 'collate');
  RETURN jsonb_set(r, '{bare}', coalesce((SELECT jsonb_agg(b) FROM jsonb_array_elements_text(r -> 'bare') b
                                           WHERE b <> ALL (collations)), '[]'));
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
