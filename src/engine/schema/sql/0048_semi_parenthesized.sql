-- A semi- or anti-join in brackets is still a condition AND-ed at the top of WHERE
-- (issue #24, item 4: found by the differential tests' view SQL).
--
-- `WHERE (x > 1) AND (EXISTS (SELECT …))` was refused as a subquery "inside another
-- expression", and `WHERE (c IS NOT NULL) AND (c NOT IN (SELECT …))` did not see its
-- `c IS NOT NULL`: the conjuncts were split at the top-level ANDs only, the brackets
-- around each kept. Brackets mean nothing in Postgres's parse tree, and pg_get_viewdef()
-- writes every condition in them (`WHERE ((o.x > 1) AND (EXISTS ( SELECT …)))`), which
-- README says the AS form takes as it is. A conjunct wholly in brackets is now split again
-- inside them, so `((a) AND (b))` gives `a` and `b`.
--
-- Renamed here and wrapped:
--   _semi_conjuncts (0039) -> _semi_conjuncts_before_parens
-- No other function is replaced.

ALTER FUNCTION @schema@._semi_conjuncts(text) RENAME TO _semi_conjuncts_before_parens;

CREATE FUNCTION @schema@._semi_conjuncts(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  res text[] := '{}';
  c text;
  toks @schema@.grammar_token[];
  n int;
BEGIN
  FOREACH c IN ARRAY @schema@._semi_conjuncts_before_parens(cond) LOOP
    toks := @schema@.grammar_tokenize(c);
    n := array_length(toks, 1) - 1;  -- the last token before eof
    IF n >= 2 AND toks[1].kind = 'punct' AND toks[1].text = '('
       AND @schema@._closing_token(toks, 1) = n THEN
      res := res || @schema@._semi_conjuncts(@schema@.grammar_text(toks, 2, n));
    ELSE
      res := res || c;
    END IF;
  END LOOP;
  RETURN res;
END
$fn$;
