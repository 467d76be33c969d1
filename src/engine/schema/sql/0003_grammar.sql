-- The statement grammar: tokenizer, parser and renderer (see CONTRACT.md, "Statements").
--
--   parse_statement(statement text) RETURNS jsonb   one statement -> its AST, or SQLSTATE TRP01
--   render_statement(ast jsonb) RETURNS text        an AST -> the normalised statement text
--
-- Expressions are not parsed: Postgres checks them when a statement is applied. The parser
-- only finds where each one ends (tracking (), [] and CASE ... END) and keeps its tokens,
-- re-joined into a normalised text. Everything else here is an internal helper (grammar_*).

-- One token. kind: word (unquoted identifier or keyword), ident ("quoted"), uident (U&"..."),
-- string (every kind of string literal, dollar quotes included), number, op, punct, eof.
-- text is the token as written (continued string literals merged into one); value is the
-- resolved identifier for word/ident (ASCII letters folded for words), else the text.
-- pos is the 1-based character offset where the token starts.
CREATE TYPE @schema@.grammar_token AS (kind text, text text, value text, pos int);

-- Raises a grammar error: SQLSTATE TRP01, the position in the message and as DETAIL JSON.
CREATE FUNCTION @schema@.grammar_fail(message text, pos int) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  RAISE EXCEPTION USING
    ERRCODE = 'TRP01',
    MESSAGE = format('%s at character %s', message, pos),
    DETAIL = jsonb_build_object('position', pos)::text;
END
$fn$;

-- Postgres's keyword categories that matter here: 'R' reserved, 'T' type/function-name
-- keywords (both unusable as bare table names or aliases), NULL for anything else.
-- Fixed here (not pg_get_keywords()) so parsing is the same on every server version.
CREATE FUNCTION @schema@.grammar_keyword_class(word text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT CASE
    WHEN word = ANY ('{all,analyse,analyze,and,any,array,as,asc,asymmetric,both,case,cast,check,
      collate,column,constraint,create,current_catalog,current_date,current_role,current_time,
      current_timestamp,current_user,default,deferrable,desc,distinct,do,else,end,except,false,
      fetch,for,foreign,from,grant,group,having,in,initially,intersect,into,lateral,leading,
      limit,localtime,localtimestamp,not,"null",offset,on,only,or,order,placing,primary,
      references,returning,select,session_user,some,symmetric,system_user,table,then,to,
      trailing,true,union,unique,user,using,variadic,when,where,window,with}'::text[])
      THEN 'R'
    WHEN word = ANY ('{authorization,binary,collation,concurrently,cross,current_schema,freeze,
      full,ilike,inner,is,isnull,join,left,like,natural,notnull,outer,overlaps,right,similar,
      tablesample,verbose}'::text[])
      THEN 'T'
  END
$fn$;

-- Splits a statement into tokens, ending with an 'eof' token. Comments and whitespace are
-- dropped. Lexical errors (unterminated literals, comments, parameters, stray characters)
-- are grammar errors at the position where the offending token starts. Works on an array
-- of code points, so it stays linear however long the statement is.
CREATE FUNCTION @schema@.grammar_tokenize(statement text) RETURNS @schema@.grammar_token[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  ch text[] := coalesce(string_to_array(statement, NULL), '{}');
  n int := coalesce(array_length(string_to_array(statement, NULL), 1), 0);
  cp int[];
  toks @schema@.grammar_token[] := '{}';
  nt int := 0;
  p int := 1;
  q int;
  r int;
  c int;
  pl int;
  depth int;
  seg int;
  backslash boolean;
  k int;
  body text;
  txt text;
BEGIN
  -- Code points (any character outside ASCII reads as 128: ascii() refuses those in
  -- multibyte encodings other than UTF8, and all of them count as letters anyway).
  SELECT coalesce(array_agg(CASE WHEN octet_length(u.c) > 1 THEN 128 ELSE ascii(u.c) END
      ORDER BY u.k), '{}') INTO cp
    FROM unnest(ch) WITH ORDINALITY AS u(c, k);
  -- Sentinels past the end, so looking ahead never meets a NULL.
  cp := cp || ARRAY[0, 0, 0, 0];

  WHILE p <= n LOOP
    c := cp[p];

    -- Whitespace and comments.
    IF c IN (32, 9, 10, 13, 12, 11) THEN
      p := p + 1;
      CONTINUE;
    END IF;
    IF c = 45 AND cp[p + 1] = 45 THEN
      p := p + 2;
      WHILE p <= n AND cp[p] NOT IN (10, 13) LOOP
        p := p + 1;
      END LOOP;
      CONTINUE;
    END IF;
    IF c = 47 AND cp[p + 1] = 42 THEN
      q := p + 2;
      depth := 1;
      WHILE depth > 0 LOOP
        IF q > n THEN
          PERFORM @schema@.grammar_fail(
            'unterminated comment: expected "*/" to close "/*", found end of statement', p);
        END IF;
        IF cp[q] = 47 AND cp[q + 1] = 42 THEN
          depth := depth + 1;
          q := q + 2;
        ELSIF cp[q] = 42 AND cp[q + 1] = 47 THEN
          depth := depth - 1;
          q := q + 2;
        ELSE
          q := q + 1;
        END IF;
      END LOOP;
      p := q;
      CONTINUE;
    END IF;

    -- String literals: '...', E'...', B'...', X'...', N'...', U&'...' (pl: prefix length).
    pl := CASE
      WHEN c = 39 THEN 0
      WHEN c IN (69, 101, 66, 98, 88, 120, 78, 110) AND cp[p + 1] = 39 THEN 1
      WHEN c IN (85, 117) AND cp[p + 1] = 38 AND cp[p + 2] = 39 THEN 2
    END;
    IF pl IS NOT NULL THEN
      backslash := pl = 1 AND c IN (69, 101);
      body := '';
      FOR k IN p .. p + pl LOOP
        body := body || ch[k];
      END LOOP;
      seg := p;
      q := p + pl + 1;
      LOOP
        r := q;
        LOOP
          IF q > n THEN
            PERFORM @schema@.grammar_fail(
              'unterminated string literal: expected a closing quote, found end of statement',
              seg);
          END IF;
          IF cp[q] = 39 THEN
            EXIT WHEN cp[q + 1] <> 39;
            q := q + 2;
          ELSIF backslash AND cp[q] = 92 THEN
            q := q + 2;
          ELSE
            q := q + 1;
          END IF;
        END LOOP;
        FOR k IN r .. q - 1 LOOP
          body := body || ch[k];
        END LOOP;
        q := q + 1;
        -- Postgres joins literals separated by whitespace that holds a newline ('a'
        -- <newline> 'b' is 'ab'): the next segment continues this token.
        r := q;
        LOOP
          IF cp[r] IN (32, 9, 12) THEN
            r := r + 1;
          ELSIF cp[r] = 45 AND cp[r + 1] = 45 THEN
            r := r + 2;
            WHILE r <= n AND cp[r] NOT IN (10, 13) LOOP
              r := r + 1;
            END LOOP;
          ELSE
            EXIT;
          END IF;
        END LOOP;
        EXIT WHEN cp[r] NOT IN (10, 13);
        r := r + 1;
        LOOP
          IF cp[r] IN (32, 9, 10, 13, 12, 11) THEN
            r := r + 1;
          ELSIF cp[r] = 45 AND cp[r + 1] = 45 THEN
            pl := r + 2;
            WHILE pl <= n AND cp[pl] NOT IN (10, 13) LOOP
              pl := pl + 1;
            END LOOP;
            EXIT WHEN pl > n;
            r := pl + 1;
          ELSE
            EXIT;
          END IF;
        END LOOP;
        EXIT WHEN cp[r] <> 39;
        seg := r;
        q := r + 1;
      END LOOP;
      txt := body || '''';
      nt := nt + 1;
      toks[nt] := ROW('string', txt, txt, p)::@schema@.grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Quoted identifiers: "..." and U&"...".
    pl := CASE
      WHEN c = 34 THEN 0
      WHEN c IN (85, 117) AND cp[p + 1] = 38 AND cp[p + 2] = 34 THEN 2
    END;
    IF pl IS NOT NULL THEN
      q := p + pl + 1;
      LOOP
        IF q > n THEN
          PERFORM @schema@.grammar_fail(
            'unterminated quoted identifier: expected a closing ", found end of statement', p);
        END IF;
        IF cp[q] = 34 THEN
          EXIT WHEN cp[q + 1] <> 34;
          q := q + 2;
        ELSE
          q := q + 1;
        END IF;
      END LOOP;
      IF q = p + pl + 1 THEN
        PERFORM @schema@.grammar_fail(
          'zero-length quoted identifier: expected a name between the double quotes, found ""',
          p);
      END IF;
      txt := '';
      FOR k IN p .. q LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW(CASE WHEN pl = 0 THEN 'ident' ELSE 'uident' END, txt,
        replace(substr(txt, pl + 2, length(txt) - pl - 2), '""', '"'), p)::@schema@.grammar_token;
      p := q + 1;
      CONTINUE;
    END IF;

    -- Parameters ($1) and dollar-quoted strings ($tag$...$tag$).
    IF c = 36 THEN
      q := p + 1;
      IF cp[q] BETWEEN 48 AND 57 THEN
        WHILE cp[q] BETWEEN 48 AND 57 LOOP
          q := q + 1;
        END LOOP;
        txt := '';
      FOR k IN p .. q - 1 LOOP
        txt := txt || ch[k];
      END LOOP;
        PERFORM @schema@.grammar_fail(format(
          'parameters (%s) cannot appear in a statement: expected a value, found %s', txt, txt),
          p);
      END IF;
      IF cp[q] BETWEEN 65 AND 90 OR cp[q] BETWEEN 97 AND 122 OR cp[q] = 95 OR cp[q] > 127 THEN
        WHILE cp[q] BETWEEN 48 AND 57 OR cp[q] BETWEEN 65 AND 90 OR cp[q] BETWEEN 97 AND 122
            OR cp[q] = 95 OR cp[q] > 127 LOOP
          q := q + 1;
        END LOOP;
      END IF;
      IF cp[q] <> 36 THEN
        PERFORM @schema@.grammar_fail('unexpected character: expected a token, found "$"', p);
      END IF;
      txt := array_to_string(ch[p:q], '');
      r := strpos(array_to_string(ch[q + 1:n], ''), txt);
      IF r = 0 THEN
        PERFORM @schema@.grammar_fail(format(
          'unterminated dollar-quoted string: expected %s to close it, found end of statement',
          txt), p);
      END IF;
      q := q + r + length(txt) - 1;
      txt := '';
      FOR k IN p .. q LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW('string', txt, txt, p)::@schema@.grammar_token;
      p := q + 1;
      CONTINUE;
    END IF;

    -- Numbers, as Postgres 16+ reads them (0x/0o/0b integers, _ between digits).
    IF c BETWEEN 48 AND 57 OR (c = 46 AND cp[p + 1] BETWEEN 48 AND 57) THEN
      q := p;
      IF c = 48 AND cp[p + 1] IN (88, 120)
        AND (cp[p + 2] BETWEEN 48 AND 57 OR cp[p + 2] BETWEEN 65 AND 70 OR cp[p + 2] BETWEEN 97 AND 102
          OR (cp[p + 2] = 95 AND (cp[p + 3] BETWEEN 48 AND 57 OR cp[p + 3] BETWEEN 65 AND 70
            OR cp[p + 3] BETWEEN 97 AND 102))) THEN
        q := p + 2;
        WHILE cp[q] BETWEEN 48 AND 57 OR cp[q] BETWEEN 65 AND 70 OR cp[q] BETWEEN 97 AND 102
          OR (cp[q] = 95 AND (cp[q + 1] BETWEEN 48 AND 57 OR cp[q + 1] BETWEEN 65 AND 70
            OR cp[q + 1] BETWEEN 97 AND 102)) LOOP
          q := q + 1;
        END LOOP;
      ELSIF c = 48 AND cp[p + 1] IN (79, 111)
        AND (cp[p + 2] BETWEEN 48 AND 55 OR (cp[p + 2] = 95 AND cp[p + 3] BETWEEN 48 AND 55)) THEN
        q := p + 2;
        WHILE cp[q] BETWEEN 48 AND 55 OR (cp[q] = 95 AND cp[q + 1] BETWEEN 48 AND 55) LOOP
          q := q + 1;
        END LOOP;
      ELSIF c = 48 AND cp[p + 1] IN (66, 98)
        AND (cp[p + 2] IN (48, 49) OR (cp[p + 2] = 95 AND cp[p + 3] IN (48, 49))) THEN
        q := p + 2;
        WHILE cp[q] IN (48, 49) OR (cp[q] = 95 AND cp[q + 1] IN (48, 49)) LOOP
          q := q + 1;
        END LOOP;
      ELSE
        WHILE cp[q] BETWEEN 48 AND 57 OR (q > p AND cp[q] = 95 AND cp[q + 1] BETWEEN 48 AND 57)
        LOOP
          q := q + 1;
        END LOOP;
        IF cp[q] = 46 AND cp[q + 1] <> 46 THEN
          q := q + 1;
          IF cp[q] BETWEEN 48 AND 57 THEN
            WHILE cp[q] BETWEEN 48 AND 57 OR (cp[q] = 95 AND cp[q + 1] BETWEEN 48 AND 57) LOOP
              q := q + 1;
            END LOOP;
          END IF;
        END IF;
        IF cp[q] IN (69, 101) THEN
          r := CASE WHEN cp[q + 1] IN (43, 45) THEN q + 2 ELSE q + 1 END;
          IF cp[r] BETWEEN 48 AND 57 THEN
            q := r;
            WHILE cp[q] BETWEEN 48 AND 57 OR (cp[q] = 95 AND cp[q + 1] BETWEEN 48 AND 57) LOOP
              q := q + 1;
            END LOOP;
          END IF;
        END IF;
      END IF;
      txt := '';
      FOR k IN p .. q - 1 LOOP
        txt := txt || ch[k];
      END LOOP;
      IF cp[q] BETWEEN 65 AND 90 OR cp[q] BETWEEN 97 AND 122 OR cp[q] = 95 OR cp[q] > 127 THEN
        PERFORM @schema@.grammar_fail(format(
          'trailing junk after numeric literal: expected a space or an operator after %s, found %s',
          txt, to_jsonb(ch[q])::text), p);
      END IF;
      nt := nt + 1;
      toks[nt] := ROW('number', txt, txt, p)::@schema@.grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Unquoted words: keywords and identifiers. Only ASCII letters fold, as in Postgres.
    IF c BETWEEN 65 AND 90 OR c BETWEEN 97 AND 122 OR c = 95 OR c > 127 THEN
      q := p + 1;
      WHILE cp[q] BETWEEN 48 AND 57 OR cp[q] BETWEEN 65 AND 90 OR cp[q] BETWEEN 97 AND 122
          OR cp[q] = 95 OR cp[q] = 36 OR cp[q] > 127 LOOP
        q := q + 1;
      END LOOP;
      txt := '';
      FOR k IN p .. q - 1 LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW('word', txt,
        translate(txt, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'),
        p)::@schema@.grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Operators: a run of + - * / < > = ~ ! @ # % ^ & | ` ?, cut where a comment starts.
    IF c IN (43, 45, 42, 47, 60, 62, 61, 126, 33, 64, 35, 37, 94, 38, 124, 96, 63) THEN
      q := p + 1;
      WHILE cp[q] IN (43, 45, 42, 47, 60, 62, 61, 126, 33, 64, 35, 37, 94, 38, 124, 96, 63)
          AND NOT (cp[q] = 45 AND cp[q + 1] = 45) AND NOT (cp[q] = 47 AND cp[q + 1] = 42) LOOP
        q := q + 1;
      END LOOP;
      txt := '';
      FOR k IN p .. q - 1 LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW('op', txt, txt, p)::@schema@.grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Punctuation.
    IF c = 58 AND cp[p + 1] IN (58, 61) THEN
      q := p + 2;
    ELSIF c IN (40, 41, 91, 93, 44, 59, 46, 58) THEN
      q := p + 1;
    ELSE
      PERFORM @schema@.grammar_fail(format(
        'unexpected character: expected a token, found %s', to_jsonb(ch[p])::text), p);
    END IF;
    txt := '';
    FOR k IN p .. q - 1 LOOP
      txt := txt || ch[k];
    END LOOP;
    nt := nt + 1;
    toks[nt] := ROW('punct', txt, txt, p)::@schema@.grammar_token;
    p := q;
  END LOOP;
  nt := nt + 1;
  toks[nt] := ROW('eof', '', '', n + 1)::@schema@.grammar_token;
  RETURN toks;
END
$fn$;

-- How an error message names a token it found.
CREATE FUNCTION @schema@.grammar_describe(t @schema@.grammar_token) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT CASE
    WHEN t IS NULL OR t.kind = 'eof' THEN 'end of statement'
    WHEN t.kind IN ('ident', 'uident') THEN 'identifier ' || t.text
    WHEN t.kind = 'string' THEN 'string ' ||
      CASE WHEN length(t.text) > 40 THEN left(t.text, 37) || '...' ELSE t.text END
    WHEN t.kind = 'number' THEN 'number ' || t.text
    ELSE '"' || CASE WHEN length(t.text) > 40 THEN left(t.text, 37) || '...' ELSE t.text END
      || '"'
  END
$fn$;

-- Whether a token is the (unquoted) keyword kw, given in lower case.
CREATE FUNCTION @schema@.grammar_kw(t @schema@.grammar_token, kw text) RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT coalesce(t.kind = 'word' AND t.value = kw, false)
$fn$;

-- Raises "expected <expected>, found <token i>", unless token i is something the grammar
-- refuses on purpose, which gets its own message. context: 'select' after a SELECT item
-- (FROM there is a misplaced FROM), 'join' where a join may follow (a comma is a join).
CREATE FUNCTION @schema@.grammar_unexpected(
  toks @schema@.grammar_token[], i int, expected text, context text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token := toks[i];
  nx @schema@.grammar_token := toks[i + 1];
  what text;
BEGIN
  IF t.kind = 'word' THEN
    what := CASE
      WHEN t.value = 'order' AND @schema@.grammar_kw(nx, 'by') THEN 'ORDER BY'
      WHEN t.value IN ('limit', 'offset', 'union', 'intersect', 'except', 'window', 'fetch')
        THEN upper(t.value)
      WHEN t.value = 'for' AND @schema@.grammar_kw(nx, 'update') THEN 'FOR UPDATE'
      WHEN t.value = 'for' AND @schema@.grammar_kw(nx, 'share') THEN 'FOR SHARE'
      WHEN t.value = 'for' AND @schema@.grammar_kw(nx, 'no') THEN 'FOR NO KEY UPDATE'
      WHEN t.value = 'for' AND @schema@.grammar_kw(nx, 'key') THEN 'FOR KEY SHARE'
    END;
    IF what IS NOT NULL THEN
      PERFORM @schema@.grammar_fail(format(
        '%s is not supported in a transform: expected %s, found %s',
        what, expected, @schema@.grammar_describe(t)), t.pos);
    END IF;
    IF t.value IN ('right', 'full', 'cross', 'natural', 'using') THEN
      PERFORM @schema@.grammar_fail(format(
        'only INNER and LEFT joins with ON are supported: expected %s, found %s',
        expected, @schema@.grammar_describe(t)), t.pos);
    END IF;
    IF t.value = 'from' AND context = 'select' THEN
      PERFORM @schema@.grammar_fail(format(
        'FROM goes before SELECT: TRANSFORM target FROM source SELECT ... (expected %s, found %s)',
        expected, @schema@.grammar_describe(t)), t.pos);
    END IF;
  ELSIF t.text = ',' AND context = 'join' THEN
    PERFORM @schema@.grammar_fail(format(
      'only INNER and LEFT joins with ON are supported: expected %s, found ","', expected),
      t.pos);
  END IF;
  PERFORM @schema@.grammar_fail(
    format('expected %s, found %s', expected, @schema@.grammar_describe(t)), t.pos);
END
$fn$;

-- The name a token stands for, or a grammar error naming `what` was expected. colid: the
-- name is a table name or alias, where Postgres's reserved and type/function-name keywords
-- cannot appear unquoted (after AS, or after a dot, any word is a name). Names are not
-- truncated to Postgres's 63 bytes: the engine refuses a name that is too long.
CREATE FUNCTION @schema@.grammar_name(t @schema@.grammar_token, what text, colid boolean)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  v text;
BEGIN
  IF t.kind = 'word' AND NOT (colid AND @schema@.grammar_keyword_class(t.value) IS NOT NULL)
  THEN
    v := t.value;
  ELSIF t.kind = 'ident' THEN
    v := t.value;
  ELSIF t.kind = 'uident' THEN
    PERFORM @schema@.grammar_fail(format(
      'U&"..." identifiers are not supported here: expected %s in plain double quotes, found %s',
      what, @schema@.grammar_describe(t)), t.pos);
  ELSE
    PERFORM @schema@.grammar_fail(
      format('expected %s, found %s', what, @schema@.grammar_describe(t)), coalesce(t.pos, 1));
  END IF;
  RETURN v;
END
$fn$;

-- A possibly schema-qualified name at token i: (schema_name, rel_name, next token).
CREATE FUNCTION @schema@.grammar_qualified(
  toks @schema@.grammar_token[], i int, what text,
  OUT schema_name text, OUT rel_name text, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  rel_name := @schema@.grammar_name(toks[i], what, true);
  next := i + 1;
  IF toks[next].text = '.' AND toks[next].kind = 'punct' THEN
    schema_name := rel_name;
    rel_name := @schema@.grammar_name(toks[next + 1], what || ' after "."', false);
    next := next + 2;
  END IF;
END
$fn$;

-- An optional alias at token i: AS name, or a bare name that is no keyword of this grammar.
CREATE FUNCTION @schema@.grammar_alias(
  toks @schema@.grammar_token[], i int, OUT alias text, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token := toks[i];
BEGIN
  next := i;
  IF @schema@.grammar_kw(t, 'as') THEN
    alias := @schema@.grammar_name(toks[i + 1], 'an alias after AS', true);
    next := i + 2;
  ELSIF t.kind IN ('ident', 'uident')
    OR (t.kind = 'word' AND t.value <> 'without'
        AND @schema@.grammar_keyword_class(t.value) IS NULL) THEN
    alias := @schema@.grammar_name(t, 'an alias', true);
    next := i + 1;
  END IF;
END
$fn$;

-- Finds where the expression starting at token i ends: the first token, outside (), [] and
-- CASE ... END, that is a comma, a semicolon, the end, or a keyword that starts a clause
-- of this grammar (or one it refuses). Returns that token's index; i when it is empty.
-- Raises on unbalanced brackets and on a CASE without END.
CREATE FUNCTION @schema@.grammar_scan(toks @schema@.grammar_token[], i int) RETURNS int
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token;
  nx @schema@.grammar_token;
  opened @schema@.grammar_token[] := '{}';
  d int := 0;
  want text;
BEGIN
  LOOP
    t := toks[i];
    IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
      IF d > 0 THEN
        want := CASE opened[d].text WHEN '(' THEN '")"' WHEN '[' THEN '"]"' ELSE 'END' END;
        PERFORM @schema@.grammar_fail(format(
          'unbalanced %s: expected %s to close %s (character %s), found %s',
          CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE 'brackets' END,
          want, CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE '"' || opened[d].text || '"' END,
          opened[d].pos, @schema@.grammar_describe(t)), t.pos);
      END IF;
      RETURN i;
    END IF;
    IF t.kind = 'punct' THEN
      IF t.text IN ('(', '[') THEN
        d := d + 1;
        opened[d] := t;
      ELSIF t.text IN (')', ']') THEN
        IF d = 0 THEN
          PERFORM @schema@.grammar_fail(format(
            'unbalanced brackets: found "%s" without a matching "%s"',
            t.text, CASE t.text WHEN ')' THEN '(' ELSE '[' END), t.pos);
        END IF;
        IF opened[d].text <> (CASE t.text WHEN ')' THEN '(' ELSE '[' END) THEN
          want := CASE opened[d].text WHEN '(' THEN '")"' WHEN '[' THEN '"]"' ELSE 'END' END;
          PERFORM @schema@.grammar_fail(format(
            'unbalanced %s: expected %s to close %s (character %s), found "%s"',
            CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE 'brackets' END,
            want, CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE '"' || opened[d].text || '"' END,
            opened[d].pos, t.text), t.pos);
        END IF;
        d := d - 1;
      ELSIF t.text = ',' AND d = 0 THEN
        RETURN i;
      END IF;
    ELSIF t.kind = 'word' THEN
      IF t.value = 'case' THEN
        d := d + 1;
        opened[d] := t;
      ELSIF t.value = 'end' AND d > 0 AND opened[d].kind = 'word' THEN
        d := d - 1;
      ELSIF d = 0 THEN
        nx := toks[i + 1];
        IF t.value IN ('select', 'where', 'having', 'as', 'on', 'using', 'order', 'limit',
            'offset', 'union', 'intersect', 'except', 'window', 'fetch')
          OR (t.value = 'from' AND NOT @schema@.grammar_kw(toks[i - 1], 'distinct'))
          OR (t.value = 'group' AND @schema@.grammar_kw(nx, 'by'))
          OR (t.value = 'without' AND @schema@.grammar_kw(nx, 'source'))
          OR (t.value = 'for' AND nx.kind = 'word' AND nx.value IN ('update', 'share', 'no', 'key'))
          OR (t.value IN ('join', 'inner', 'left', 'right', 'full', 'cross', 'natural')
              AND coalesce(nx.text, '') <> '(')
        THEN
          RETURN i;
        END IF;
      END IF;
    END IF;
    i := i + 1;
  END LOOP;
END
$fn$;

-- The normalised text of tokens a .. b-1: one space between tokens, except none after
-- ( [ . :: : and before ) ] , . :: : and none between a name and its ( or [. Wherever
-- leaving the space out would let Postgres read the tokens differently, the space stays.
CREATE FUNCTION @schema@.grammar_text(toks @schema@.grammar_token[], a int, b int)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  res text := '';
  prev @schema@.grammar_token;
  t @schema@.grammar_token;
  space boolean;
BEGIN
  FOR k IN a .. b - 1 LOOP
    t := toks[k];
    IF k > a THEN
      space := CASE
        WHEN prev.kind = 'punct' AND prev.text IN ('(', '[') THEN false
        WHEN t.kind = 'punct' AND t.text IN (')', ']', ',') THEN false
        WHEN t.kind = 'punct' AND t.text IN ('::', ':') THEN right(prev.text, 1) = ':'
        WHEN prev.kind = 'punct' AND prev.text IN ('::', ':') THEN left(t.text, 1) IN (':', '=')
        WHEN t.kind = 'punct' AND t.text = '.' THEN prev.kind = 'number' OR prev.text = '.'
        WHEN prev.kind = 'punct' AND prev.text = '.' THEN t.kind = 'number' OR t.text = '.'
        WHEN t.kind = 'punct' AND t.text IN ('(', '[') THEN NOT (
          prev.kind IN ('ident', 'uident')
          OR (prev.kind = 'punct' AND prev.text IN (')', ']') AND t.text = '[')
          OR (prev.kind = 'word' AND prev.value NOT IN ('and', 'or', 'not', 'in', 'is', 'as',
            'then', 'when', 'else', 'case', 'over', 'filter', 'group', 'like', 'ilike',
            'similar', 'between', 'escape', 'from', 'where', 'by', 'on', 'select', 'having',
            'distinct', 'using', 'with', 'to', 'for', 'placing', 'all', 'any', 'some')))
        ELSE true
      END;
      IF space THEN
        res := res || ' ';
      END IF;
    END IF;
    res := res || t.text;
    prev := t;
  END LOOP;
  RETURN res;
END
$fn$;

-- After a statement's last part: the end, or ';' and then the end.
CREATE FUNCTION @schema@.grammar_end(
  toks @schema@.grammar_token[], i int, expected text, context text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF toks[i].kind = 'punct' AND toks[i].text = ';' THEN
    IF toks[i + 1].kind <> 'eof' THEN
      PERFORM @schema@.grammar_fail(format(
        'only one statement per call: expected end of statement after ";", found %s',
        @schema@.grammar_describe(toks[i + 1])), toks[i + 1].pos);
    END IF;
  ELSIF toks[i].kind <> 'eof' THEN
    PERFORM @schema@.grammar_unexpected(toks, i, expected, context);
  END IF;
END
$fn$;

CREATE FUNCTION @schema@.parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(statement);
  t @schema@.grammar_token := toks[1];
  i int;
  e int;
  start int;
  sch text;
  nm text;
  alias text;
  col text;
  jt text;
  expected text;
  target jsonb;
  from_ jsonb;
  joins jsonb := '[]';
  items jsonb := '[]';
  group_by jsonb := '[]';
  where_ text;
  having_ text;
  wsi boolean := false;
  label text;
  label_expr text;
  last @schema@.grammar_token;
  before @schema@.grammar_token;
BEGIN
  IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
    PERFORM @schema@.grammar_fail(format(
      'empty statement: expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      @schema@.grammar_describe(t)), t.pos);
  END IF;
  IF t.kind <> 'word' OR t.value NOT IN ('transform', 'pause', 'resume', 'drop', 'alter') THEN
    PERFORM @schema@.grammar_fail(format(
      'expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      @schema@.grammar_describe(t)), t.pos);
  END IF;

  IF t.value IN ('pause', 'resume') THEN
    IF NOT @schema@.grammar_kw(toks[2], 'transform') THEN
      PERFORM @schema@.grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    nm := @schema@.grammar_name(toks[3], 'a transform name', true);
    i := 4;
    IF toks[i].kind = 'punct' AND toks[i].text = '.' THEN
      col := @schema@.grammar_name(toks[i + 1], 'a column name after "."', false);
      i := i + 2;
      expected := 'end of statement';
    ELSE
      expected := '"." and a column name, or end of statement';
    END IF;
    PERFORM @schema@.grammar_end(toks, i, expected);
    RETURN jsonb_build_object('kind', t.value, 'transform', nm, 'column', col);
  END IF;

  IF t.value IN ('drop', 'alter') THEN
    IF NOT @schema@.grammar_kw(toks[2], 'transform') THEN
      PERFORM @schema@.grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM @schema@.grammar_qualified(toks, 3, 'a transform name') q;
    -- A qualified target keeps its schema (the engine refuses one that is not its target
    -- schema); the key is there only then, so unqualified statements have the plain shape.
    target := jsonb_build_object('transform', nm)
      || CASE WHEN sch IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('schema', sch) END;
    IF t.value = 'drop' THEN
      PERFORM @schema@.grammar_end(toks, i, 'end of statement');
      RETURN jsonb_build_object('kind', 'drop') || target;
    END IF;
    t := toks[i];
    IF @schema@.grammar_kw(t, 'add') THEN
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      e := @schema@.grammar_scan(toks, i);
      IF e = i THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'an expression after ADD COLUMN');
      END IF;
      IF NOT @schema@.grammar_kw(toks[e], 'as') THEN
        PERFORM @schema@.grammar_unexpected(toks, e, 'AS and the new column''s name');
      END IF;
      nm := @schema@.grammar_name(toks[e + 1], 'a column name after AS', false);
      PERFORM @schema@.grammar_end(toks, e + 2, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_add_column',
        'expr', @schema@.grammar_text(toks, i, e), 'name', nm) || target;
    ELSIF @schema@.grammar_kw(t, 'drop') THEN
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      nm := @schema@.grammar_name(toks[i], 'a column name', true);
      PERFORM @schema@.grammar_end(toks, i + 1, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_drop_column', 'name', nm) || target;
    ELSIF @schema@.grammar_kw(t, 'set') OR @schema@.grammar_kw(t, 'reset') THEN
      IF NOT @schema@.grammar_kw(toks[i + 1], 'without') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 1, 'WITHOUT SOURCE INDEX');
      END IF;
      IF NOT @schema@.grammar_kw(toks[i + 2], 'source') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 2, 'SOURCE INDEX');
      END IF;
      IF NOT @schema@.grammar_kw(toks[i + 3], 'index') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 3, 'INDEX');
      END IF;
      PERFORM @schema@.grammar_end(toks, i + 4, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_without_source_index',
        'value', t.value = 'set') || target;
    END IF;
    PERFORM @schema@.grammar_unexpected(toks, i, 'ADD, DROP, SET or RESET');
  END IF;

  -- TRANSFORM target FROM source [[AS] alias] {join} SELECT ... [WHERE] [GROUP BY] [HAVING]
  --   [WITHOUT SOURCE INDEX]
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM @schema@.grammar_qualified(toks, 2, 'a transform name') q;
  target := jsonb_build_object('schema', sch, 'name', nm);
  IF NOT @schema@.grammar_kw(toks[i], 'from') THEN
    PERFORM @schema@.grammar_unexpected(toks, i, 'FROM');
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM @schema@.grammar_qualified(toks, i + 1, 'a source table name') q;
  SELECT q.alias, q.next INTO alias, i FROM @schema@.grammar_alias(toks, i) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias);

  LOOP
    t := toks[i];
    IF @schema@.grammar_kw(t, 'join') THEN
      jt := 'inner';
      i := i + 1;
    ELSIF @schema@.grammar_kw(t, 'inner') THEN
      IF NOT @schema@.grammar_kw(toks[i + 1], 'join') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 1, 'JOIN after INNER');
      END IF;
      jt := 'inner';
      i := i + 2;
    ELSIF @schema@.grammar_kw(t, 'left') AND coalesce(toks[i + 1].text, '') <> '(' THEN
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'outer') THEN
        i := i + 1;
      END IF;
      IF NOT @schema@.grammar_kw(toks[i], 'join') THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'JOIN after LEFT');
      END IF;
      jt := 'left';
      i := i + 1;
    ELSE
      EXIT;
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM @schema@.grammar_qualified(toks, i, 'a table name after JOIN') q;
    SELECT q.alias, q.next INTO alias, i FROM @schema@.grammar_alias(toks, i) q;
    IF NOT @schema@.grammar_kw(toks[i], 'on') THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'ON and a join condition', 'join');
    END IF;
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', @schema@.grammar_text(toks, i, e)));
    i := e;
  END LOOP;

  IF NOT @schema@.grammar_kw(toks[i], 'select') THEN
    PERFORM @schema@.grammar_unexpected(toks, i,
      CASE WHEN jsonb_array_length(joins) = 0 AND alias IS NULL THEN 'an alias, JOIN or SELECT'
        ELSE 'JOIN or SELECT' END,
      'join');
  END IF;
  i := i + 1;
  IF @schema@.grammar_kw(toks[i], 'distinct') THEN
    PERFORM @schema@.grammar_fail(format(
      'SELECT DISTINCT is not supported: use GROUP BY (expected a select item, found %s)',
      @schema@.grammar_describe(toks[i])), toks[i].pos);
  END IF;
  IF @schema@.grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  LOOP
    start := i;
    e := @schema@.grammar_scan(toks, i);
    IF e = start THEN
      PERFORM @schema@.grammar_unexpected(toks, e, 'a select item', 'select');
    END IF;
    IF (e = start + 1 AND toks[start].text = '*')
      OR (e >= start + 2 AND toks[e - 1].text = '*' AND toks[e - 2].kind = 'punct'
          AND toks[e - 2].text = '.') THEN
      PERFORM @schema@.grammar_fail(format(
        'name each column: SELECT * is not supported (expected an expression, found %s)',
        @schema@.grammar_describe(toks[e - 1])), toks[start].pos);
    END IF;
    nm := NULL;
    label := NULL;
    label_expr := NULL;
    IF @schema@.grammar_kw(toks[e], 'as') THEN
      nm := @schema@.grammar_name(toks[e + 1], 'a column name after AS', false);
      i := e + 2;
    ELSE
      i := e;
      IF e >= start + 2 THEN
        last := toks[e - 1];
        before := toks[e - 2];
        IF (last.kind = 'ident'
            OR (last.kind = 'word' AND @schema@.grammar_keyword_class(last.value) IS NULL))
          AND before.kind <> 'op'
          AND NOT (before.kind = 'punct' AND before.text IN ('.', '::')) THEN
          label := @schema@.grammar_name(last, 'a column name', false);
          label_expr := @schema@.grammar_text(toks, start, e - 1);
        END IF;
      END IF;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', @schema@.grammar_text(toks, start, e), 'name', nm, 'bare_label', label,
      'label_expr', label_expr, 'position', toks[start].pos));
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;
  expected := '",", WHERE, GROUP BY, HAVING, WITHOUT SOURCE INDEX or end of statement';

  IF @schema@.grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := @schema@.grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, WITHOUT SOURCE INDEX or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'group') THEN
    IF NOT @schema@.grammar_kw(toks[i + 1], 'by') THEN
      PERFORM @schema@.grammar_unexpected(toks, i + 1, 'BY after GROUP');
    END IF;
    i := i + 2;
    IF @schema@.grammar_kw(toks[i], 'all') THEN
      PERFORM @schema@.grammar_fail(format(
        'GROUP BY ALL is not supported: expected the GROUP BY expressions, found %s',
        @schema@.grammar_describe(toks[i])), toks[i].pos);
    END IF;
    IF @schema@.grammar_kw(toks[i], 'distinct') THEN
      PERFORM @schema@.grammar_fail(format(
        'grouping sets are not supported: expected the GROUP BY expressions, found %s',
        @schema@.grammar_describe(toks[i])), toks[i].pos);
    END IF;
    LOOP
      IF ((@schema@.grammar_kw(toks[i], 'rollup') OR @schema@.grammar_kw(toks[i], 'cube'))
          AND toks[i + 1].text = '(')
        OR (@schema@.grammar_kw(toks[i], 'grouping') AND @schema@.grammar_kw(toks[i + 1], 'sets'))
        OR (toks[i].text = '(' AND toks[i + 1].text = ')')
      THEN
        PERFORM @schema@.grammar_fail(format(
          'grouping sets are not supported: expected a GROUP BY expression, found %s',
          @schema@.grammar_describe(toks[i])), toks[i].pos);
      END IF;
      e := @schema@.grammar_scan(toks, i);
      IF e = i THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'a GROUP BY expression');
      END IF;
      group_by := group_by || jsonb_build_array(@schema@.grammar_text(toks, i, e));
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", HAVING, WITHOUT SOURCE INDEX or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'having') THEN
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := @schema@.grammar_text(toks, i, e);
    i := e;
    expected := 'WITHOUT SOURCE INDEX or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'without') THEN
    IF NOT @schema@.grammar_kw(toks[i + 1], 'source') THEN
      PERFORM @schema@.grammar_unexpected(toks, i + 1, 'SOURCE INDEX after WITHOUT');
    END IF;
    IF NOT @schema@.grammar_kw(toks[i + 2], 'index') THEN
      PERFORM @schema@.grammar_unexpected(toks, i + 2, 'INDEX after WITHOUT SOURCE');
    END IF;
    wsi := true;
    i := i + 3;
    expected := 'end of statement';
  END IF;

  PERFORM @schema@.grammar_end(toks, i, expected,
    CASE WHEN where_ IS NULL AND having_ IS NULL AND jsonb_array_length(group_by) = 0
      THEN 'select' END);
  RETURN jsonb_build_object(
    'kind', 'transform', 'target', target, 'from', from_, 'joins', joins, 'select', items,
    'where', where_, 'group_by', group_by, 'having', having_, 'without_source_index', wsi);
END
$fn$;

-- A name as it is written in a normalised statement: quoted only where needed.
CREATE FUNCTION @schema@.grammar_render_name(schema_name text, rel_name text) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT CASE WHEN schema_name IS NULL THEN quote_ident(rel_name)
    ELSE quote_ident(schema_name) || '.' || quote_ident(rel_name) END
$fn$;

CREATE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  kind text := ast ->> 'kind';
  res text;
  j jsonb;
  target text;
BEGIN
  IF kind = 'transform' THEN
    res := 'TRANSFORM '
      || @schema@.grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
      || ' FROM '
      || @schema@.grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
      || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '');
    FOR j IN SELECT value FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) LOOP
      res := res
        || CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
        || @schema@.grammar_render_name(j ->> 'schema', j ->> 'name')
        || coalesce(' AS ' || quote_ident(j ->> 'alias'), '')
        || ' ON ' || (j ->> 'on');
    END LOOP;
    res := res || ' SELECT ' || (
      SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
        ', ' ORDER BY ordinality)
      FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY);
    res := res
      || coalesce(' WHERE ' || (ast ->> 'where'), '')
      || coalesce(' GROUP BY ' || (
        SELECT string_agg(value, ', ' ORDER BY ordinality)
        FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '')
      || coalesce(' HAVING ' || (ast ->> 'having'), '')
      || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX'
           ELSE '' END;
  ELSIF kind IN ('pause', 'resume') THEN
    res := upper(kind) || ' TRANSFORM ' || quote_ident(ast ->> 'transform')
      || coalesce('.' || quote_ident(ast ->> 'column'), '');
  ELSIF kind IN ('drop', 'alter_add_column', 'alter_drop_column', 'alter_without_source_index')
  THEN
    target := @schema@.grammar_render_name(ast ->> 'schema', ast ->> 'transform');
    res := CASE kind
      WHEN 'drop' THEN 'DROP TRANSFORM ' || target
      WHEN 'alter_add_column' THEN 'ALTER TRANSFORM ' || target || ' ADD COLUMN '
        || (ast ->> 'expr') || ' AS ' || quote_ident(ast ->> 'name')
      WHEN 'alter_drop_column' THEN 'ALTER TRANSFORM ' || target || ' DROP COLUMN '
        || quote_ident(ast ->> 'name')
      ELSE 'ALTER TRANSFORM ' || target
        || CASE WHEN (ast ->> 'value')::boolean THEN ' SET' ELSE ' RESET' END
        || ' WITHOUT SOURCE INDEX'
    END;
  END IF;
  IF res IS NULL THEN
    RAISE EXCEPTION 'render_statement: not a statement AST: %', left(ast::text, 200)
      USING ERRCODE = '22023';
  END IF;
  RETURN res;
END
$fn$;
