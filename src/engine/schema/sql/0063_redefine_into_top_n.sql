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
