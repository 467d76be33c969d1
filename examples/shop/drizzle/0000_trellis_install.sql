-- Written by `trellis generate install` (trellis-pg 0.1.0).
-- trellis-pg: install or upgrade the Trellis catalog schema "trellis" to version 18.
-- Safe to run again, and safe beside Trellis.migrate(): it is version-guarded and locked.
DO $trellis_install$
DECLARE
  newer int;
  boss_version int;
BEGIN
  PERFORM pg_advisory_xact_lock(1953654124, hashtext('trellis'));
  IF to_regclass('"trellis".migrations') IS NULL AND to_regclass('"trellis".job') IS NOT NULL
     AND to_regclass('"trellis".queue') IS NOT NULL AND to_regclass('"trellis".version') IS NOT NULL THEN
    RAISE EXCEPTION 'schema % holds another Trellis instance''s background jobs (pg-boss): choose another catalog schema',
      'trellis' USING ERRCODE = 'TRC01';
  END IF;
  CREATE SCHEMA IF NOT EXISTS "trellis";
  CREATE TABLE IF NOT EXISTS "trellis".migrations (
    version int PRIMARY KEY,
    name text NOT NULL,
    breaking boolean NOT NULL DEFAULT false,
    applied_at timestamptz NOT NULL DEFAULT now()
  );
  SELECT max(version) INTO newer FROM "trellis".migrations WHERE version > 18 AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (18): upgrade trellis-pg',
      'trellis', newer USING ERRCODE = 'TRI01';
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 1) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (1, 'catalog', false);
    EXECUTE $trellis_m1$-- The instance's settings: one row, written by the first install.
CREATE TABLE "trellis".config (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  -- Where `apply()` creates targets. Handles connecting with another targetSchema are refused.
  target_schema name NOT NULL,
  installed_at timestamptz NOT NULL DEFAULT now()
);
$trellis_m1$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 2) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (2, 'transforms', false);
    EXECUTE $trellis_m2$-- Registered transforms: what `apply()` records for the engine that maintains them.

CREATE TABLE "trellis".transforms (
  id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  target_schema name NOT NULL,
  target_name name NOT NULL,
  -- The target table. Kept by OID so a rename of the target schema is followed.
  target_oid oid NOT NULL,
  -- The normalised statement: re-applying it defines the same transform (schema dumps).
  statement text NOT NULL,
  -- The parsed statement with every name resolved (see 0004_apply.sql).
  spec jsonb NOT NULL,
  -- Whether the SELECT list aggregates (GROUP BY, or aggregates without it: one row).
  aggregates boolean NOT NULL,
  without_source_index boolean NOT NULL DEFAULT false,
  -- The schemas names in expressions resolved through when the transform was defined; the
  -- engine re-derives rows with exactly this search_path.
  search_path text NOT NULL,
  -- Set while the whole transform is paused; reason: operator, build_failure,
  -- capture_failure, disruption, schema_change, quarantine.
  paused_at timestamptz,
  pause_reason text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (target_schema, target_name)
);

-- The tables a transform reads: ordinal 0 is the FROM source, then each JOIN in order.
CREATE TABLE "trellis".transform_sources (
  transform_id int NOT NULL REFERENCES "trellis".transforms ON DELETE CASCADE,
  ordinal int NOT NULL,
  source_oid oid NOT NULL,
  source_schema name NOT NULL,
  source_name name NOT NULL,
  -- The name expressions use for this source (its table name when no alias was given).
  alias name NOT NULL,
  -- NULL for the FROM source; 'inner' or 'left' for a join.
  join_type text CHECK (join_type IN ('inner', 'left')),
  join_condition text,
  -- The source's primary key, and its column types (format_type).
  key_columns name[] NOT NULL,
  key_types text[] NOT NULL,
  -- The target columns holding this source's key; NULL when the transform aggregates.
  target_key_columns name[],
  -- Every column of this source the definition reads (capture watches these).
  read_columns name[] NOT NULL,
  -- This side's columns in the equi-join conditions, and in the GROUP BY (index gaps).
  join_columns name[] NOT NULL DEFAULT '{}',
  group_columns name[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (transform_id, ordinal)
);

CREATE INDEX transform_sources_by_source ON "trellis".transform_sources (source_oid);

-- The target's columns, in order: the SELECT list, then any key columns Trellis added.
CREATE TABLE "trellis".transform_columns (
  transform_id int NOT NULL REFERENCES "trellis".transforms ON DELETE CASCADE,
  ordinal int NOT NULL,
  name name NOT NULL,
  expression text NOT NULL,
  -- format_type() of the column, as Postgres typed the expression; and its collation.
  type text NOT NULL,
  collation_name text,
  is_key boolean NOT NULL,
  -- Added by Trellis to carry the target's key; not in the SELECT list.
  implicit boolean NOT NULL DEFAULT false,
  -- The source columns the expression reads: [{"source": ordinal, "column": name}, ...].
  reads jsonb NOT NULL DEFAULT '[]',
  paused_at timestamptz,
  pause_reason text,
  PRIMARY KEY (transform_id, ordinal),
  UNIQUE (transform_id, name)
);
$trellis_m2$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 3) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (3, 'grammar', false);
    EXECUTE $trellis_m3$-- The statement grammar: tokenizer, parser and renderer (see CONTRACT.md, "Statements").
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
CREATE TYPE "trellis".grammar_token AS (kind text, text text, value text, pos int);

-- Raises a grammar error: SQLSTATE TRP01, the position in the message and as DETAIL JSON.
CREATE FUNCTION "trellis".grammar_fail(message text, pos int) RETURNS void
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
CREATE FUNCTION "trellis".grammar_keyword_class(word text) RETURNS text
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
CREATE FUNCTION "trellis".grammar_tokenize(statement text) RETURNS "trellis".grammar_token[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  ch text[] := coalesce(string_to_array(statement, NULL), '{}');
  n int := coalesce(array_length(string_to_array(statement, NULL), 1), 0);
  cp int[];
  toks "trellis".grammar_token[] := '{}';
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
          PERFORM "trellis".grammar_fail(
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
            PERFORM "trellis".grammar_fail(
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
      toks[nt] := ROW('string', txt, txt, p)::"trellis".grammar_token;
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
          PERFORM "trellis".grammar_fail(
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
        PERFORM "trellis".grammar_fail(
          'zero-length quoted identifier: expected a name between the double quotes, found ""',
          p);
      END IF;
      txt := '';
      FOR k IN p .. q LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW(CASE WHEN pl = 0 THEN 'ident' ELSE 'uident' END, txt,
        replace(substr(txt, pl + 2, length(txt) - pl - 2), '""', '"'), p)::"trellis".grammar_token;
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
        PERFORM "trellis".grammar_fail(format(
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
        PERFORM "trellis".grammar_fail('unexpected character: expected a token, found "$"', p);
      END IF;
      txt := array_to_string(ch[p:q], '');
      r := strpos(array_to_string(ch[q + 1:n], ''), txt);
      IF r = 0 THEN
        PERFORM "trellis".grammar_fail(format(
          'unterminated dollar-quoted string: expected %s to close it, found end of statement',
          txt), p);
      END IF;
      q := q + r + length(txt) - 1;
      txt := '';
      FOR k IN p .. q LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW('string', txt, txt, p)::"trellis".grammar_token;
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
        PERFORM "trellis".grammar_fail(format(
          'trailing junk after numeric literal: expected a space or an operator after %s, found %s',
          txt, to_jsonb(ch[q])::text), p);
      END IF;
      nt := nt + 1;
      toks[nt] := ROW('number', txt, txt, p)::"trellis".grammar_token;
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
        p)::"trellis".grammar_token;
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
      toks[nt] := ROW('op', txt, txt, p)::"trellis".grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Punctuation.
    IF c = 58 AND cp[p + 1] IN (58, 61) THEN
      q := p + 2;
    ELSIF c IN (40, 41, 91, 93, 44, 59, 46, 58) THEN
      q := p + 1;
    ELSE
      PERFORM "trellis".grammar_fail(format(
        'unexpected character: expected a token, found %s', to_jsonb(ch[p])::text), p);
    END IF;
    txt := '';
    FOR k IN p .. q - 1 LOOP
      txt := txt || ch[k];
    END LOOP;
    nt := nt + 1;
    toks[nt] := ROW('punct', txt, txt, p)::"trellis".grammar_token;
    p := q;
  END LOOP;
  nt := nt + 1;
  toks[nt] := ROW('eof', '', '', n + 1)::"trellis".grammar_token;
  RETURN toks;
END
$fn$;

-- How an error message names a token it found.
CREATE FUNCTION "trellis".grammar_describe(t "trellis".grammar_token) RETURNS text
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
CREATE FUNCTION "trellis".grammar_kw(t "trellis".grammar_token, kw text) RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT coalesce(t.kind = 'word' AND t.value = kw, false)
$fn$;

-- Raises "expected <expected>, found <token i>", unless token i is something the grammar
-- refuses on purpose, which gets its own message. context: 'select' after a SELECT item
-- (FROM there is a misplaced FROM), 'join' where a join may follow (a comma is a join).
CREATE FUNCTION "trellis".grammar_unexpected(
  toks "trellis".grammar_token[], i int, expected text, context text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token := toks[i];
  nx "trellis".grammar_token := toks[i + 1];
  what text;
BEGIN
  IF t.kind = 'word' THEN
    what := CASE
      WHEN t.value = 'order' AND "trellis".grammar_kw(nx, 'by') THEN 'ORDER BY'
      WHEN t.value IN ('limit', 'offset', 'union', 'intersect', 'except', 'window', 'fetch')
        THEN upper(t.value)
      WHEN t.value = 'for' AND "trellis".grammar_kw(nx, 'update') THEN 'FOR UPDATE'
      WHEN t.value = 'for' AND "trellis".grammar_kw(nx, 'share') THEN 'FOR SHARE'
      WHEN t.value = 'for' AND "trellis".grammar_kw(nx, 'no') THEN 'FOR NO KEY UPDATE'
      WHEN t.value = 'for' AND "trellis".grammar_kw(nx, 'key') THEN 'FOR KEY SHARE'
    END;
    IF what IS NOT NULL THEN
      PERFORM "trellis".grammar_fail(format(
        '%s is not supported in a transform: expected %s, found %s',
        what, expected, "trellis".grammar_describe(t)), t.pos);
    END IF;
    IF t.value IN ('right', 'full', 'cross', 'natural', 'using') THEN
      PERFORM "trellis".grammar_fail(format(
        'only INNER and LEFT joins with ON are supported: expected %s, found %s',
        expected, "trellis".grammar_describe(t)), t.pos);
    END IF;
    IF t.value = 'from' AND context = 'select' THEN
      PERFORM "trellis".grammar_fail(format(
        'FROM goes before SELECT: TRANSFORM target FROM source SELECT ... (expected %s, found %s)',
        expected, "trellis".grammar_describe(t)), t.pos);
    END IF;
  ELSIF t.text = ',' AND context = 'join' THEN
    PERFORM "trellis".grammar_fail(format(
      'only INNER and LEFT joins with ON are supported: expected %s, found ","', expected),
      t.pos);
  END IF;
  PERFORM "trellis".grammar_fail(
    format('expected %s, found %s', expected, "trellis".grammar_describe(t)), t.pos);
END
$fn$;

-- The name a token stands for, or a grammar error naming `what` was expected. colid: the
-- name is a table name or alias, where Postgres's reserved and type/function-name keywords
-- cannot appear unquoted (after AS, or after a dot, any word is a name). Names are not
-- truncated to Postgres's 63 bytes: the engine refuses a name that is too long.
CREATE FUNCTION "trellis".grammar_name(t "trellis".grammar_token, what text, colid boolean)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  v text;
BEGIN
  IF t.kind = 'word' AND NOT (colid AND "trellis".grammar_keyword_class(t.value) IS NOT NULL)
  THEN
    v := t.value;
  ELSIF t.kind = 'ident' THEN
    v := t.value;
  ELSIF t.kind = 'uident' THEN
    PERFORM "trellis".grammar_fail(format(
      'U&"..." identifiers are not supported here: expected %s in plain double quotes, found %s',
      what, "trellis".grammar_describe(t)), t.pos);
  ELSE
    PERFORM "trellis".grammar_fail(
      format('expected %s, found %s', what, "trellis".grammar_describe(t)), coalesce(t.pos, 1));
  END IF;
  RETURN v;
END
$fn$;

-- A possibly schema-qualified name at token i: (schema_name, rel_name, next token).
CREATE FUNCTION "trellis".grammar_qualified(
  toks "trellis".grammar_token[], i int, what text,
  OUT schema_name text, OUT rel_name text, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  rel_name := "trellis".grammar_name(toks[i], what, true);
  next := i + 1;
  IF toks[next].text = '.' AND toks[next].kind = 'punct' THEN
    schema_name := rel_name;
    rel_name := "trellis".grammar_name(toks[next + 1], what || ' after "."', false);
    next := next + 2;
  END IF;
END
$fn$;

-- An optional alias at token i: AS name, or a bare name that is no keyword of this grammar.
CREATE FUNCTION "trellis".grammar_alias(
  toks "trellis".grammar_token[], i int, OUT alias text, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token := toks[i];
BEGIN
  next := i;
  IF "trellis".grammar_kw(t, 'as') THEN
    alias := "trellis".grammar_name(toks[i + 1], 'an alias after AS', true);
    next := i + 2;
  ELSIF t.kind IN ('ident', 'uident')
    OR (t.kind = 'word' AND t.value <> 'without'
        AND "trellis".grammar_keyword_class(t.value) IS NULL) THEN
    alias := "trellis".grammar_name(t, 'an alias', true);
    next := i + 1;
  END IF;
END
$fn$;

-- Finds where the expression starting at token i ends: the first token, outside (), [] and
-- CASE ... END, that is a comma, a semicolon, the end, or a keyword that starts a clause
-- of this grammar (or one it refuses). Returns that token's index; i when it is empty.
-- Raises on unbalanced brackets and on a CASE without END.
CREATE FUNCTION "trellis".grammar_scan(toks "trellis".grammar_token[], i int) RETURNS int
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token;
  nx "trellis".grammar_token;
  opened "trellis".grammar_token[] := '{}';
  d int := 0;
  want text;
BEGIN
  LOOP
    t := toks[i];
    IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
      IF d > 0 THEN
        want := CASE opened[d].text WHEN '(' THEN '")"' WHEN '[' THEN '"]"' ELSE 'END' END;
        PERFORM "trellis".grammar_fail(format(
          'unbalanced %s: expected %s to close %s (character %s), found %s',
          CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE 'brackets' END,
          want, CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE '"' || opened[d].text || '"' END,
          opened[d].pos, "trellis".grammar_describe(t)), t.pos);
      END IF;
      RETURN i;
    END IF;
    IF t.kind = 'punct' THEN
      IF t.text IN ('(', '[') THEN
        d := d + 1;
        opened[d] := t;
      ELSIF t.text IN (')', ']') THEN
        IF d = 0 THEN
          PERFORM "trellis".grammar_fail(format(
            'unbalanced brackets: found "%s" without a matching "%s"',
            t.text, CASE t.text WHEN ')' THEN '(' ELSE '[' END), t.pos);
        END IF;
        IF opened[d].text <> (CASE t.text WHEN ')' THEN '(' ELSE '[' END) THEN
          want := CASE opened[d].text WHEN '(' THEN '")"' WHEN '[' THEN '"]"' ELSE 'END' END;
          PERFORM "trellis".grammar_fail(format(
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
          OR (t.value = 'from' AND NOT "trellis".grammar_kw(toks[i - 1], 'distinct'))
          OR (t.value = 'group' AND "trellis".grammar_kw(nx, 'by'))
          OR (t.value = 'without' AND "trellis".grammar_kw(nx, 'source'))
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
CREATE FUNCTION "trellis".grammar_text(toks "trellis".grammar_token[], a int, b int)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  res text := '';
  prev "trellis".grammar_token;
  t "trellis".grammar_token;
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
CREATE FUNCTION "trellis".grammar_end(
  toks "trellis".grammar_token[], i int, expected text, context text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF toks[i].kind = 'punct' AND toks[i].text = ';' THEN
    IF toks[i + 1].kind <> 'eof' THEN
      PERFORM "trellis".grammar_fail(format(
        'only one statement per call: expected end of statement after ";", found %s',
        "trellis".grammar_describe(toks[i + 1])), toks[i + 1].pos);
    END IF;
  ELSIF toks[i].kind <> 'eof' THEN
    PERFORM "trellis".grammar_unexpected(toks, i, expected, context);
  END IF;
END
$fn$;

CREATE FUNCTION "trellis".parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(statement);
  t "trellis".grammar_token := toks[1];
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
  last "trellis".grammar_token;
  before "trellis".grammar_token;
BEGIN
  IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
    PERFORM "trellis".grammar_fail(format(
      'empty statement: expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      "trellis".grammar_describe(t)), t.pos);
  END IF;
  IF t.kind <> 'word' OR t.value NOT IN ('transform', 'pause', 'resume', 'drop', 'alter') THEN
    PERFORM "trellis".grammar_fail(format(
      'expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      "trellis".grammar_describe(t)), t.pos);
  END IF;

  IF t.value IN ('pause', 'resume') THEN
    IF NOT "trellis".grammar_kw(toks[2], 'transform') THEN
      PERFORM "trellis".grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    nm := "trellis".grammar_name(toks[3], 'a transform name', true);
    i := 4;
    IF toks[i].kind = 'punct' AND toks[i].text = '.' THEN
      col := "trellis".grammar_name(toks[i + 1], 'a column name after "."', false);
      i := i + 2;
      expected := 'end of statement';
    ELSE
      expected := '"." and a column name, or end of statement';
    END IF;
    PERFORM "trellis".grammar_end(toks, i, expected);
    RETURN jsonb_build_object('kind', t.value, 'transform', nm, 'column', col);
  END IF;

  IF t.value IN ('drop', 'alter') THEN
    IF NOT "trellis".grammar_kw(toks[2], 'transform') THEN
      PERFORM "trellis".grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM "trellis".grammar_qualified(toks, 3, 'a transform name') q;
    -- A qualified target keeps its schema (the engine refuses one that is not its target
    -- schema); the key is there only then, so unqualified statements have the plain shape.
    target := jsonb_build_object('transform', nm)
      || CASE WHEN sch IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('schema', sch) END;
    IF t.value = 'drop' THEN
      PERFORM "trellis".grammar_end(toks, i, 'end of statement');
      RETURN jsonb_build_object('kind', 'drop') || target;
    END IF;
    t := toks[i];
    IF "trellis".grammar_kw(t, 'add') THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'an expression after ADD COLUMN');
      END IF;
      IF NOT "trellis".grammar_kw(toks[e], 'as') THEN
        PERFORM "trellis".grammar_unexpected(toks, e, 'AS and the new column''s name');
      END IF;
      nm := "trellis".grammar_name(toks[e + 1], 'a column name after AS', false);
      PERFORM "trellis".grammar_end(toks, e + 2, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_add_column',
        'expr', "trellis".grammar_text(toks, i, e), 'name', nm) || target;
    ELSIF "trellis".grammar_kw(t, 'drop') THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      nm := "trellis".grammar_name(toks[i], 'a column name', true);
      PERFORM "trellis".grammar_end(toks, i + 1, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_drop_column', 'name', nm) || target;
    ELSIF "trellis".grammar_kw(t, 'set') OR "trellis".grammar_kw(t, 'reset') THEN
      IF NOT "trellis".grammar_kw(toks[i + 1], 'without') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1, 'WITHOUT SOURCE INDEX');
      END IF;
      IF NOT "trellis".grammar_kw(toks[i + 2], 'source') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'SOURCE INDEX');
      END IF;
      IF NOT "trellis".grammar_kw(toks[i + 3], 'index') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 3, 'INDEX');
      END IF;
      PERFORM "trellis".grammar_end(toks, i + 4, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_without_source_index',
        'value', t.value = 'set') || target;
    END IF;
    PERFORM "trellis".grammar_unexpected(toks, i, 'ADD, DROP, SET or RESET');
  END IF;

  -- TRANSFORM target FROM source [[AS] alias] {join} SELECT ... [WHERE] [GROUP BY] [HAVING]
  --   [WITHOUT SOURCE INDEX]
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM "trellis".grammar_qualified(toks, 2, 'a transform name') q;
  target := jsonb_build_object('schema', sch, 'name', nm);
  IF NOT "trellis".grammar_kw(toks[i], 'from') THEN
    PERFORM "trellis".grammar_unexpected(toks, i, 'FROM');
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM "trellis".grammar_qualified(toks, i + 1, 'a source table name') q;
  SELECT q.alias, q.next INTO alias, i FROM "trellis".grammar_alias(toks, i) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias);

  LOOP
    t := toks[i];
    IF "trellis".grammar_kw(t, 'join') THEN
      jt := 'inner';
      i := i + 1;
    ELSIF "trellis".grammar_kw(t, 'inner') THEN
      IF NOT "trellis".grammar_kw(toks[i + 1], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1, 'JOIN after INNER');
      END IF;
      jt := 'inner';
      i := i + 2;
    ELSIF "trellis".grammar_kw(t, 'left') AND coalesce(toks[i + 1].text, '') <> '(' THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'outer') THEN
        i := i + 1;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'JOIN after LEFT');
      END IF;
      jt := 'left';
      i := i + 1;
    ELSE
      EXIT;
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM "trellis".grammar_qualified(toks, i, 'a table name after JOIN') q;
    SELECT q.alias, q.next INTO alias, i FROM "trellis".grammar_alias(toks, i) q;
    IF NOT "trellis".grammar_kw(toks[i], 'on') THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'ON and a join condition', 'join');
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', "trellis".grammar_text(toks, i, e)));
    i := e;
  END LOOP;

  IF NOT "trellis".grammar_kw(toks[i], 'select') THEN
    PERFORM "trellis".grammar_unexpected(toks, i,
      CASE WHEN jsonb_array_length(joins) = 0 AND alias IS NULL THEN 'an alias, JOIN or SELECT'
        ELSE 'JOIN or SELECT' END,
      'join');
  END IF;
  i := i + 1;
  IF "trellis".grammar_kw(toks[i], 'distinct') THEN
    PERFORM "trellis".grammar_fail(format(
      'SELECT DISTINCT is not supported: use GROUP BY (expected a select item, found %s)',
      "trellis".grammar_describe(toks[i])), toks[i].pos);
  END IF;
  IF "trellis".grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  LOOP
    start := i;
    e := "trellis".grammar_scan(toks, i);
    IF e = start THEN
      PERFORM "trellis".grammar_unexpected(toks, e, 'a select item', 'select');
    END IF;
    IF (e = start + 1 AND toks[start].text = '*')
      OR (e >= start + 2 AND toks[e - 1].text = '*' AND toks[e - 2].kind = 'punct'
          AND toks[e - 2].text = '.') THEN
      PERFORM "trellis".grammar_fail(format(
        'name each column: SELECT * is not supported (expected an expression, found %s)',
        "trellis".grammar_describe(toks[e - 1])), toks[start].pos);
    END IF;
    nm := NULL;
    label := NULL;
    label_expr := NULL;
    IF "trellis".grammar_kw(toks[e], 'as') THEN
      nm := "trellis".grammar_name(toks[e + 1], 'a column name after AS', false);
      i := e + 2;
    ELSE
      i := e;
      IF e >= start + 2 THEN
        last := toks[e - 1];
        before := toks[e - 2];
        IF (last.kind = 'ident'
            OR (last.kind = 'word' AND "trellis".grammar_keyword_class(last.value) IS NULL))
          AND before.kind <> 'op'
          AND NOT (before.kind = 'punct' AND before.text IN ('.', '::')) THEN
          label := "trellis".grammar_name(last, 'a column name', false);
          label_expr := "trellis".grammar_text(toks, start, e - 1);
        END IF;
      END IF;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', "trellis".grammar_text(toks, start, e), 'name', nm, 'bare_label', label,
      'label_expr', label_expr, 'position', toks[start].pos));
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;
  expected := '",", WHERE, GROUP BY, HAVING, WITHOUT SOURCE INDEX or end of statement';

  IF "trellis".grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, WITHOUT SOURCE INDEX or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'group') THEN
    IF NOT "trellis".grammar_kw(toks[i + 1], 'by') THEN
      PERFORM "trellis".grammar_unexpected(toks, i + 1, 'BY after GROUP');
    END IF;
    i := i + 2;
    IF "trellis".grammar_kw(toks[i], 'all') THEN
      PERFORM "trellis".grammar_fail(format(
        'GROUP BY ALL is not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    IF "trellis".grammar_kw(toks[i], 'distinct') THEN
      PERFORM "trellis".grammar_fail(format(
        'grouping sets are not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    LOOP
      IF (("trellis".grammar_kw(toks[i], 'rollup') OR "trellis".grammar_kw(toks[i], 'cube'))
          AND toks[i + 1].text = '(')
        OR ("trellis".grammar_kw(toks[i], 'grouping') AND "trellis".grammar_kw(toks[i + 1], 'sets'))
        OR (toks[i].text = '(' AND toks[i + 1].text = ')')
      THEN
        PERFORM "trellis".grammar_fail(format(
          'grouping sets are not supported: expected a GROUP BY expression, found %s',
          "trellis".grammar_describe(toks[i])), toks[i].pos);
      END IF;
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'a GROUP BY expression');
      END IF;
      group_by := group_by || jsonb_build_array("trellis".grammar_text(toks, i, e));
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", HAVING, WITHOUT SOURCE INDEX or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'having') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'WITHOUT SOURCE INDEX or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'without') THEN
    IF NOT "trellis".grammar_kw(toks[i + 1], 'source') THEN
      PERFORM "trellis".grammar_unexpected(toks, i + 1, 'SOURCE INDEX after WITHOUT');
    END IF;
    IF NOT "trellis".grammar_kw(toks[i + 2], 'index') THEN
      PERFORM "trellis".grammar_unexpected(toks, i + 2, 'INDEX after WITHOUT SOURCE');
    END IF;
    wsi := true;
    i := i + 3;
    expected := 'end of statement';
  END IF;

  PERFORM "trellis".grammar_end(toks, i, expected,
    CASE WHEN where_ IS NULL AND having_ IS NULL AND jsonb_array_length(group_by) = 0
      THEN 'select' END);
  RETURN jsonb_build_object(
    'kind', 'transform', 'target', target, 'from', from_, 'joins', joins, 'select', items,
    'where', where_, 'group_by', group_by, 'having', having_, 'without_source_index', wsi);
END
$fn$;

-- A name as it is written in a normalised statement: quoted only where needed.
CREATE FUNCTION "trellis".grammar_render_name(schema_name text, rel_name text) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT CASE WHEN schema_name IS NULL THEN quote_ident(rel_name)
    ELSE quote_ident(schema_name) || '.' || quote_ident(rel_name) END
$fn$;

CREATE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
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
      || "trellis".grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
      || ' FROM '
      || "trellis".grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
      || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '');
    FOR j IN SELECT value FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) LOOP
      res := res
        || CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
        || "trellis".grammar_render_name(j ->> 'schema', j ->> 'name')
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
    target := "trellis".grammar_render_name(ast ->> 'schema', ast ->> 'transform');
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
$trellis_m3$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 4) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (4, 'analysis', false);
    EXECUTE $trellis_m4$-- Validation by Postgres itself. A TRANSFORM is checked by having Postgres analyse
-- queries built from its parts (as temporary views, which are parsed and typed but never
-- run), then reading back what Postgres decided: output names and types, the columns and
-- functions the query depends on (pg_depend), and flags of its query tree (pg_rewrite).

-- Raises one of Trellis's own errors (codes in src/engine/sqlstate.ts).
CREATE FUNCTION "trellis"._fail(code text, message text, hint text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  IF hint IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
  END IF;
  RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, HINT = hint;
END
$fn$;

-- What Postgres makes of `query` (a SELECT): raises a validation error prefixed with `what`
-- when Postgres refuses it. Returns
--   columns:  [{name, type, type_oid, typtype, collation}] in output order
--   reads:    [{rel, attnum, attname}] columns the query reads (pg_depend)
--   relids:   the relations in its range tables, once per occurrence (subqueries included)
--   whole_row: whether it reads some table's whole row (then every column counts as read)
--   functions, operator_functions: function OIDs it calls
--   has_aggs, has_window, has_srf, has_sublinks: flags of the top-level query
--   plain: {source, attnum} when the first output is a bare column of the `source`-th table
--          in FROM (0-based), else null (FROM must be a comma list of tables for these
--          positions to hold: explicit JOINs add range-table entries of their own)
--   equalities: [{left, left_attnum, right, right_attnum}] bare-column equalities
-- With `tolerate_grouping`, a grouping error (a column neither grouped nor aggregated)
-- returns NULL instead, so the caller can ask again with the GROUP BY.
CREATE FUNCTION "trellis"._analyze_query(query text, what text, tolerate_grouping boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  view_oid oid;
  rule_oid oid;
  action text;
  tlist text;
  own_rtes int;
  plain jsonb;
  m text[];
  result jsonb;
BEGIN
  DROP VIEW IF EXISTS pg_temp.trellis_analysis;
  BEGIN
    EXECUTE 'CREATE TEMP VIEW trellis_analysis AS ' || query;
  EXCEPTION
    WHEN insufficient_privilege OR query_canceled OR lock_not_available THEN
      RAISE;
    WHEN grouping_error THEN
      IF tolerate_grouping THEN
        RETURN NULL;
      END IF;
      PERFORM "trellis"._fail('TRV01', what || ': ' || SQLERRM);
    -- Also invalid_schema_name (3F000: a schema-qualified function, type or regnamespace
    -- literal naming no schema, as in `o.c(1)` or `1::nope.t`) and program_limit_exceeded
    -- (54xxx: nesting too deep, too many output columns): both say what is wrong with the
    -- statement, and would otherwise leak as internal `database` errors.
    WHEN syntax_error_or_access_rule_violation OR data_exception OR feature_not_supported
         OR invalid_schema_name OR program_limit_exceeded THEN
      PERFORM "trellis"._fail('TRV01', what || ': ' || SQLERRM);
  END;
  view_oid := 'pg_temp.trellis_analysis'::regclass;
  SELECT r.oid, r.ev_action::text INTO rule_oid, action
    FROM pg_rewrite r WHERE r.ev_class = view_oid;

  -- Postgres 15 stores two range-table entries (OLD, NEW) for the view itself before the
  -- query's own tables; later versions store none. Count them to map indexes to tables.
  SELECT count(*) INTO own_rtes
    FROM regexp_matches(action, ':rtekind 0 :relid ' || view_oid || ' ', 'g');
  -- The first :targetList in the text is the top-level one when FROM has no conditions,
  -- which is how callers ask about a single expression.
  tlist := substr(action, position(':targetList (' IN action) + length(':targetList ('));
  m := regexp_match(tlist, '^\{TARGETENTRY :expr \{VAR :varno (\d+) :varattno (\d+) ');
  IF m IS NOT NULL THEN
    plain := jsonb_build_object('source', m[1]::int - 1 - own_rtes, 'attnum', m[2]::int);
  END IF;

  SELECT jsonb_build_object(
    'columns', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'name', a.attname,
               'type', format_type(a.atttypid, a.atttypmod),
               'type_oid', a.atttypid,
               'typtype', t.typtype,
               'collation', CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN
                 (SELECT quote_ident(cn.nspname) || '.' || quote_ident(co.collname)
                    FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                   WHERE co.oid = a.attcollation) END)
             ORDER BY a.attnum), '[]')
        FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
       WHERE a.attrelid = view_oid AND a.attnum > 0 AND NOT a.attisdropped),
    'reads', (
      SELECT coalesce(jsonb_agg(DISTINCT jsonb_build_object(
               'rel', d.refobjid, 'attnum', d.refobjsubid, 'attname', a.attname)), '[]')
        FROM pg_depend d
        JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
       WHERE d.classid = 'pg_rewrite'::regclass AND d.objid = rule_oid
         AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> view_oid
         AND d.refobjsubid > 0),
    'relids', (
      SELECT coalesce(jsonb_agg(r[1]::oid), '[]')
        FROM regexp_matches(action, ':rtekind 0 :relid (\d+) ', 'g') AS r
       WHERE r[1]::oid <> view_oid),
    'whole_row', action ~ '\{VAR :varno \d+ :varattno 0 ',
    -- Functions and operators come from the query tree itself: pg_depend does not record
    -- dependencies on built-in (pinned) objects such as random().
    'functions', (
      SELECT coalesce(jsonb_agg(DISTINCT f[1]::oid), '[]')
        FROM regexp_matches(action, ':(?:funcid|aggfnoid|winfnoid) (\d+)', 'g') AS f),
    'operator_functions', (
      SELECT coalesce(jsonb_agg(DISTINCT o.oprcode::oid), '[]')
        FROM regexp_matches(action, ':opno (\d+)', 'g') AS r
        JOIN pg_operator o ON o.oid = r[1]::oid),
    -- Equalities between two bare columns (join conditions), as source positions in FROM
    -- (0-based) and attribute numbers: what a join needs indexed.
    'equalities', (
      SELECT coalesce(jsonb_agg(DISTINCT jsonb_build_object(
               'left', e[2]::int - 1 - own_rtes, 'left_attnum', e[3]::int,
               'right', e[4]::int - 1 - own_rtes, 'right_attnum', e[5]::int)), '[]')
        FROM regexp_matches(action,
               '\{OPEXPR :opno (\d+) :opfuncid \d+ :opresulttype \d+ :opretset \w+ :opcollid \d+ :inputcollid \d+ :args \(\{VAR :varno (\d+) :varattno (\d+) [^}]*:varlevelsup 0 [^}]*\} \{VAR :varno (\d+) :varattno (\d+) [^}]*:varlevelsup 0 [^}]*\}\)',
               'g') AS e
        JOIN pg_operator o ON o.oid = e[1]::oid
       WHERE o.oprname = '=' AND e[2] <> e[4]),
    'has_aggs', substring(action FROM ':hasAggs (true|false)') = 'true',
    'has_window', substring(action FROM ':hasWindowFuncs (true|false)') = 'true',
    'has_srf', substring(action FROM ':hasTargetSRFs (true|false)') = 'true',
    'has_sublinks', substring(action FROM ':hasSubLinks (true|false)') = 'true',
    'plain', plain
  ) INTO result;
  DROP VIEW pg_temp.trellis_analysis;
  RETURN result;
END
$fn$;

-- A FROM/JOIN table of a statement, resolved through Postgres (search_path included):
-- {oid, schema, name, alias, qualified, key_columns, key_types, key_notnull}.
CREATE FUNCTION "trellis"._resolve_source(src jsonb, role text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  written text;
  rel regclass;
  r record;
  keys name[];
  key_types text[];
BEGIN
  written := CASE WHEN src->>'schema' IS NULL THEN quote_ident(src->>'name')
                  ELSE quote_ident(src->>'schema') || '.' || quote_ident(src->>'name') END;
  rel := to_regclass(written);
  IF rel IS NULL THEN
    PERFORM "trellis"._fail('TRV01', format('%s table %s does not exist', role, written));
  END IF;
  SELECT c.relkind, c.relpersistence, n.nspname, c.relname INTO r
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
  IF r.relkind NOT IN ('r', 'p') THEN
    PERFORM "trellis"._fail('TRV01', format('%s %s is a %s: sources must be tables', role, written,
      CASE r.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
        WHEN 'f' THEN 'foreign table' WHEN 'S' THEN 'sequence' ELSE 'relation of kind ' || r.relkind::text END));
  END IF;
  IF r.relpersistence = 't' THEN
    PERFORM "trellis"._fail('TRV01', format('%s %s is a temporary table: sources must be permanent tables', role, written));
  END IF;
  IF r.nspname = 'trellis' THEN
    PERFORM "trellis"._fail('TRV01', format('%s %s is one of Trellis''s own tables', role, written));
  END IF;
  -- Another transform's target in the middle of its build may be without its key (see
  -- _restore_deferred_ddl in 0007_pipeline.sql, which exists by the time this runs).
  PERFORM "trellis"._restore_deferred_ddl(rel);
  SELECT array_agg(a.attname ORDER BY k.i), array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY k.i)
    INTO keys, key_types
    FROM pg_index x
    CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
    JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
   WHERE x.indrelid = rel AND x.indisprimary;
  IF keys IS NULL THEN
    PERFORM "trellis"._fail('TRV01',
      format('%s %I.%I has no primary key: Trellis keys target rows by their source rows'' keys',
             role, r.nspname, r.relname),
      'add one, e.g. ALTER TABLE ' || quote_ident(r.nspname) || '.' || quote_ident(r.relname) || ' ADD PRIMARY KEY (...)');
  END IF;
  RETURN jsonb_build_object(
    'oid', rel::oid, 'schema', r.nspname, 'name', r.relname,
    'alias', coalesce(src->>'alias', r.relname),
    'qualified', quote_ident(r.nspname) || '.' || quote_ident(r.relname),
    'key_columns', to_jsonb(keys), 'key_types', to_jsonb(key_types));
END
$fn$;
$trellis_m4$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 5) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (5, 'transform_analysis', false);
    EXECUTE $trellis_m5$-- Analysis of a parsed TRANSFORM (see 0003 for the AST): resolves its tables, has
-- Postgres check every part (naming the part when it refuses one), decides the output
-- names, types and the target's key, and records what each column reads. Creates nothing.
--
-- The key: a projection or join is keyed by the primary keys of the rows it joins (one
-- target row per source row combination); an aggregate by its GROUP BY expressions (a
-- grand total has no key: one row). A key the SELECT list does not carry as a bare column
-- is added as an implicit column, named after the source column (or alias_column when
-- that name is taken).
--
-- Returns the spec the catalog stores:
--   {ast, sources: [{ordinal, oid, schema, name, alias, qualified, join_type, on,
--                    key_columns, key_types, target_key_columns, read_columns}],
--    from_sql, aggregates,
--    columns: [{name, expression, type, collation, is_key, implicit, notnull,
--               reads: [{source, column}]}],
--    key: [names], key_nullable,
--    groups: [{expr, type, collation, plain, reads}],
--    joins: [{join, left, left_attnum, right, right_attnum}]}
-- and per source also join_columns and group_columns (the columns an index should lead
-- with for the drain to find rows by join condition or group).
CREATE FUNCTION "trellis"._analyze_transform(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  sources jsonb;
  src jsonb;
  j jsonb;
  n int;
  i int;
  k int;
  from_sql text;
  cross_sql text;
  group_list text := '';
  grouping text;
  has_group boolean := jsonb_array_length(ast->'group_by') > 0;
  aggregates boolean;
  item jsonb;
  expr text;
  name text;
  info jsonb;
  items jsonb := '[]';
  groups jsonb := '[]';
  full_sql text;
  full_info jsonb;
  columns jsonb := '[]';
  col jsonb;
  key_names text[] := '{}';
  key_nullable boolean := false;
  taken text[];
  implicit_name text;
  found_name text;
  resolved_select jsonb := '[]';
  joins jsonb := '[]';
  group_specs jsonb := '[]';
  bad record;
  -- Names Postgres reserves for system columns: no target column can have one (CREATE
  -- TABLE would fail with an internal error), so they are refused, or never chosen.
  system_columns text[] := ARRAY['tableoid', 'xmin', 'cmin', 'xmax', 'cmax', 'ctid'];
BEGIN
  -- Tables, in order: the FROM source, then each joined table.
  sources := jsonb_build_array(
    "trellis"._resolve_source(ast->'from', 'source')
      || jsonb_build_object('ordinal', 0, 'join_type', NULL, 'on', NULL));
  i := 0;
  FOR j IN SELECT value FROM jsonb_array_elements(ast->'joins') LOOP
    i := i + 1;
    sources := sources || jsonb_build_array(
      "trellis"._resolve_source(j, 'joined')
        || jsonb_build_object('ordinal', i, 'join_type', j->>'type', 'on', j->>'on'));
  END LOOP;
  n := jsonb_array_length(sources);
  SELECT e->>'alias' AS alias INTO bad
    FROM jsonb_array_elements(sources) e GROUP BY e->>'alias' HAVING count(*) > 1 LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRV01',
      format('the name %I stands for two tables: give each an alias', bad.alias));
  END IF;

  -- FROM with its join conditions, each checked as it is added; and the same tables as a
  -- comma list (no join conditions, and no range-table entries but the tables'), to ask
  -- Postgres about one expression at a time.
  from_sql := (sources->0->>'qualified') || ' AS ' || quote_ident(sources->0->>'alias');
  cross_sql := from_sql;
  FOR i IN 1 .. n - 1 LOOP
    src := sources->i;
    from_sql := from_sql
      || CASE src->>'join_type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
      || (src->>'qualified') || ' AS ' || quote_ident(src->>'alias')
      || ' ON (' || (src->>'on') || ')';
    PERFORM "trellis"._analyze_query('SELECT 1 FROM ' || from_sql,
      format('in JOIN %s ON %s', src->>'qualified', src->>'on'));
    cross_sql := cross_sql || ', ' || (src->>'qualified') || ' AS ' || quote_ident(src->>'alias');
    -- The join's equi-join columns on either side (for source index gaps).
    info := "trellis"._analyze_query('SELECT 1 FROM ' || cross_sql || ' WHERE (' || (src->>'on') || ')',
      format('in JOIN %s ON %s', src->>'qualified', src->>'on'));
    FOR j IN SELECT value FROM jsonb_array_elements(info->'equalities') LOOP
      IF (j->>'left')::int <= i AND (j->>'right')::int <= i
         AND ((j->>'left')::int = i OR (j->>'right')::int = i) THEN
        joins := joins || jsonb_build_array(j || jsonb_build_object('join', i));
      END IF;
    END LOOP;
  END LOOP;

  IF ast->>'where' IS NOT NULL THEN
    PERFORM "trellis"._analyze_query(
      'SELECT 1 FROM ' || from_sql || ' WHERE (' || (ast->>'where') || ')', 'in WHERE');
  END IF;

  -- GROUP BY expressions, each on its own.
  k := 0;
  FOR expr IN SELECT value FROM jsonb_array_elements_text(ast->'group_by') LOOP
    k := k + 1;
    IF expr ~ '^\s*\d+\s*$' THEN
      PERFORM "trellis"._fail('TRV01', format(
        'GROUP BY item %s is a number: write the expression it stands for (output positions are not supported)', k));
    END IF;
    PERFORM "trellis"._analyze_query('SELECT 1 FROM ' || from_sql || ' GROUP BY ' || expr,
      format('in GROUP BY item %s (%s)', k, expr));
    info := "trellis"._analyze_query('SELECT ' || expr || ' FROM ' || cross_sql,
      format('in GROUP BY item %s (%s)', k, expr));
    groups := groups || jsonb_build_array(jsonb_build_object('expr', expr, 'info', info));
    group_list := group_list || CASE WHEN k > 1 THEN ', ' ELSE '' END || expr;
  END LOOP;

  -- SELECT items, each on its own: output name, type, what it reads.
  k := 0;
  aggregates := has_group OR ast->>'having' IS NOT NULL;
  FOR item IN SELECT value FROM jsonb_array_elements(ast->'select') LOOP
    k := k + 1;
    expr := item->>'expr';
    info := "trellis"._analyze_query('SELECT ' || expr || ' FROM ' || cross_sql,
      format('in SELECT item %s (%s)', k, expr), true);
    IF info IS NULL THEN
      -- Mixes grouped columns and aggregates: ask again with the grouping.
      aggregates := true;
      info := "trellis"._analyze_query(
        'SELECT ' || expr || ' FROM ' || from_sql || ' GROUP BY ' || coalesce(nullif(group_list, ''), '()'),
        format('in SELECT item %s (%s)', k, expr));
      info := info || jsonb_build_object('has_aggs', true, 'plain', NULL);
    END IF;
    name := item->>'name';
    IF name IS NULL AND item->>'bare_label' IS NOT NULL
       AND info->'columns'->0->>'name' = item->>'bare_label' THEN
      -- Postgres read the last word as the column's label.
      name := item->>'bare_label';
      expr := item->>'label_expr';
    END IF;
    IF name IS NULL THEN
      name := info->'columns'->0->>'name';
      IF name = '?column?' THEN
        PERFORM "trellis"._fail('TRV01', format(
          'SELECT item %s (%s) needs a name: write it as %s AS name', k, expr, expr));
      END IF;
    END IF;
    IF octet_length(name) > 63 THEN
      PERFORM "trellis"._fail('TRV01', format('column name %s is longer than 63 bytes', name));
    END IF;
    IF name = ANY (system_columns) THEN
      PERFORM "trellis"._fail('TRV01', format(
        'SELECT item %s (%s) would be a column named %I, a name Postgres reserves for a system column: choose another name',
        k, expr, name));
    END IF;
    IF (info->>'has_window')::boolean THEN
      PERFORM "trellis"._fail('TRV01', format(
        'SELECT item %s (%s) uses a window function: not supported in a transform (a row''s value would depend on other rows)', k, expr));
    END IF;
    IF (info->>'has_srf')::boolean THEN
      PERFORM "trellis"._fail('TRV01', format(
        'SELECT item %s (%s) calls a set-returning function: not supported in a transform', k, expr));
    END IF;
    IF (info->>'has_aggs')::boolean THEN
      aggregates := true;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object('expr', expr, 'name', name, 'info', info));
    resolved_select := resolved_select || jsonb_build_array(jsonb_build_object(
      'expr', expr, 'name', name, 'bare_label', NULL, 'label_expr', NULL, 'position', item->'position'));
  END LOOP;

  SELECT x->>'name' AS name INTO bad
    FROM jsonb_array_elements(items) x GROUP BY x->>'name' HAVING count(*) > 1 LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRV01', format('two columns are named %I: give each its own name', bad.name));
  END IF;

  grouping := coalesce(nullif(group_list, ''), '()');
  IF aggregates THEN
    k := 0;
    FOR item IN SELECT value FROM jsonb_array_elements(items) LOOP
      k := k + 1;
      PERFORM "trellis"._analyze_query(
        'SELECT ' || (item->>'expr') || ' FROM ' || from_sql || ' GROUP BY ' || grouping,
        format('in SELECT item %s (%s)', k, item->>'expr'));
    END LOOP;
  END IF;
  IF ast->>'having' IS NOT NULL THEN
    PERFORM "trellis"._analyze_query(
      'SELECT 1 FROM ' || from_sql || ' GROUP BY ' || grouping || ' HAVING (' || (ast->>'having') || ')',
      'in HAVING');
  END IF;

  -- Output columns, in SELECT order.
  taken := ARRAY(SELECT x->>'name' FROM jsonb_array_elements(items) x) || system_columns;
  FOR item IN SELECT value FROM jsonb_array_elements(items) LOOP
    columns := columns || jsonb_build_array(jsonb_build_object(
      'name', item->>'name', 'expression', item->>'expr',
      'type', item->'info'->'columns'->0->>'type',
      'collation', item->'info'->'columns'->0->'collation',
      'is_key', false, 'implicit', false, 'notnull', false,
      'plain', item->'info'->'plain',
      'reads', "trellis"._reads_by_source(item->'info', sources)));
  END LOOP;

  -- The key.
  IF NOT aggregates THEN
    FOR i IN 0 .. n - 1 LOOP
      src := sources->i;
      FOR k IN 0 .. jsonb_array_length(src->'key_columns') - 1 LOOP
        found_name := NULL;
        SELECT c->>'name' INTO found_name
          FROM jsonb_array_elements(columns) c
         WHERE (c->'plain'->>'source')::int = i
           AND (c->'plain'->>'attnum')::int = (
             SELECT a.attnum FROM pg_attribute a
              WHERE a.attrelid = (src->>'oid')::oid AND a.attname = src->'key_columns'->>k)
           AND NOT (c->>'is_key')::boolean
         LIMIT 1;
        IF found_name IS NULL THEN
          implicit_name := src->'key_columns'->>k;
          IF implicit_name = ANY (taken) THEN
            implicit_name := (src->>'alias') || '_' || implicit_name;
          END IF;
          IF implicit_name = ANY (taken) OR octet_length(implicit_name) > 63 THEN
            PERFORM "trellis"._fail('TRV01', format(
              'the target needs a column for %s.%I (part of its key), and the name %I is taken: select %s.%I under a name of your choice',
              src->>'alias', src->'key_columns'->>k, implicit_name, src->>'alias', src->'key_columns'->>k));
          END IF;
          taken := taken || implicit_name;
          SELECT columns || jsonb_build_array(jsonb_build_object(
                   'name', implicit_name,
                   'expression', quote_ident(src->>'alias') || '.' || quote_ident(a.attname),
                   'type', format_type(a.atttypid, a.atttypmod),
                   'collation', CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN
                     (SELECT quote_ident(cn.nspname) || '.' || quote_ident(co.collname)
                        FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                       WHERE co.oid = a.attcollation) END,
                   'is_key', true, 'implicit', true, 'notnull', false,
                   'plain', jsonb_build_object('source', i, 'attnum', a.attnum),
                   'reads', jsonb_build_array(jsonb_build_object('source', i, 'column', a.attname))))
            INTO columns
            FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
           WHERE a.attrelid = (src->>'oid')::oid AND a.attname = src->'key_columns'->>k;
          found_name := implicit_name;
        ELSE
          columns := (SELECT jsonb_agg(CASE WHEN c->>'name' = found_name
                                            THEN c || '{"is_key": true}' ELSE c END ORDER BY o)
                        FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o));
        END IF;
        key_names := key_names || found_name;
        sources := jsonb_set(sources, ARRAY[i::text, 'target_key_columns'],
          coalesce(sources->i->'target_key_columns', '[]') || to_jsonb(found_name));
        IF src->>'join_type' = 'left' THEN
          key_nullable := true;
        END IF;
      END LOOP;
    END LOOP;
  ELSE
    k := 0;
    FOR j IN SELECT value FROM jsonb_array_elements(groups) LOOP
      k := k + 1;
      found_name := NULL;
      IF j->'info'->'plain' IS NOT NULL AND j->'info'->'plain' <> 'null' THEN
        SELECT c->>'name' INTO found_name FROM jsonb_array_elements(columns) c
         WHERE c->'plain' = j->'info'->'plain' AND NOT (c->>'is_key')::boolean LIMIT 1;
      END IF;
      IF found_name IS NULL THEN
        SELECT c->>'name' INTO found_name FROM jsonb_array_elements(columns) c
         WHERE c->>'expression' = j->>'expr' AND NOT (c->>'is_key')::boolean LIMIT 1;
      END IF;
      IF found_name IS NULL THEN
        implicit_name := j->'info'->'columns'->0->>'name';
        IF implicit_name = ANY (taken) AND j->'info'->'plain' IS NOT NULL AND j->'info'->'plain' <> 'null' THEN
          implicit_name := (sources->((j->'info'->'plain'->>'source')::int)->>'alias') || '_' || implicit_name;
        END IF;
        IF implicit_name = '?column?' OR implicit_name = ANY (taken) THEN
          PERFORM "trellis"._fail('TRV01', format(
            'GROUP BY item %s (%s) is the target''s key: add it to the SELECT list under a name', k, j->>'expr'));
        END IF;
        taken := taken || implicit_name;
        columns := columns || jsonb_build_array(jsonb_build_object(
          'name', implicit_name, 'expression', j->>'expr',
          'type', j->'info'->'columns'->0->>'type',
          'collation', j->'info'->'columns'->0->'collation',
          'is_key', true, 'implicit', true, 'notnull', false,
          'plain', j->'info'->'plain',
          'reads', "trellis"._reads_by_source(j->'info', sources)));
        found_name := implicit_name;
      ELSE
        columns := (SELECT jsonb_agg(CASE WHEN c->>'name' = found_name
                                          THEN c || '{"is_key": true}' ELSE c END ORDER BY o)
                      FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o));
      END IF;
      key_names := key_names || found_name;
    END LOOP;
  END IF;

  -- Key columns that can never be NULL: source keys on the non-nullable side of every
  -- join, and GROUP BY expressions that are bare NOT NULL columns of such a source.
  columns := (
    SELECT jsonb_agg(c || jsonb_build_object('notnull',
             (c->>'is_key')::boolean
             AND c->'plain' IS NOT NULL AND c->'plain' <> 'null'
             AND coalesce(sources->((c->'plain'->>'source')::int)->>'join_type', 'inner') <> 'left'
             AND (SELECT a.attnotnull FROM pg_attribute a
                   WHERE a.attrelid = (sources->((c->'plain'->>'source')::int)->>'oid')::oid
                     AND a.attnum = (c->'plain'->>'attnum')::int))
           ORDER BY o)
      FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o));
  key_nullable := EXISTS (
    SELECT 1 FROM jsonb_array_elements(columns) c
     WHERE (c->>'is_key')::boolean AND NOT (c->>'notnull')::boolean);

  -- GROUP BY expressions as the key map stores them: typed, and the bare source column
  -- each is, if any (for source index gaps).
  FOR j IN SELECT value FROM jsonb_array_elements(groups) LOOP
    group_specs := group_specs || jsonb_build_array(jsonb_build_object(
      'expr', j->>'expr',
      'type', j->'info'->'columns'->0->>'type',
      'collation', j->'info'->'columns'->0->'collation',
      'plain', j->'info'->'plain',
      'reads', "trellis"._reads_by_source(j->'info', sources)));
  END LOOP;

  -- The whole definition, as Postgres sees it.
  full_sql := 'SELECT ' || (
      SELECT string_agg((c->>'expression') || ' AS ' || quote_ident(c->>'name'), ', ' ORDER BY o)
        FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o))
    || ' FROM ' || from_sql
    || coalesce(' WHERE (' || (ast->>'where') || ')', '')
    || CASE WHEN has_group THEN ' GROUP BY ' || group_list ELSE '' END
    || coalesce(' HAVING (' || (ast->>'having') || ')', '');
  full_info := "trellis"._analyze_query(full_sql, 'in the definition');

  -- Every table it reads must be a source, read only where the statement names it:
  -- changes to any other table would never reach the target.
  SELECT r.relid::oid::regclass AS rel, count(*) AS uses INTO bad
    FROM jsonb_array_elements_text(full_info->'relids') AS r(relid)
   GROUP BY r.relid
  HAVING count(*) > (SELECT count(*) FROM jsonb_array_elements(sources) s WHERE (s->>'oid') = r.relid)
   LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the definition reads %s in a subquery: subqueries that read tables are not supported (changes to what they read would not reach the target)',
      bad.rel));
  END IF;
  SELECT p.oid::regprocedure AS fn INTO bad
    FROM pg_proc p
   WHERE p.provolatile = 'v'
     AND p.oid IN (SELECT f::oid FROM jsonb_array_elements_text(full_info->'functions') f
                   UNION SELECT f::oid FROM jsonb_array_elements_text(full_info->'operator_functions') f)
   LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the definition calls the volatile function %s: a re-derived row must come out the same every time',
      bad.fn));
  END IF;
  SELECT c->>'name' AS name, c->>'type' AS type INTO bad
    FROM jsonb_array_elements(full_info->'columns') c WHERE c->>'typtype' = 'p' LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRV01', format(
      'column %I would have type %s, which a table column cannot have: cast it to a concrete type',
      bad.name, bad.type));
  END IF;
  -- Final types come from the whole definition (a GROUP BY can change nothing here, but
  -- this is the query the engine runs).
  columns := (
    SELECT jsonb_agg(c || jsonb_build_object('type', f->>'type', 'collation', f->'collation') ORDER BY o)
      FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o)
      JOIN jsonb_array_elements(full_info->'columns') WITH ORDINALITY AS y(f, p) ON p = o);

  -- What each source must capture: every column the definition reads, and its key.
  FOR i IN 0 .. n - 1 LOOP
    src := sources->i;
    sources := jsonb_set(sources, ARRAY[i::text, 'read_columns'], to_jsonb(ARRAY(
      SELECT DISTINCT a.attname::text FROM pg_attribute a
       WHERE a.attrelid = (src->>'oid')::oid AND a.attnum > 0 AND NOT a.attisdropped
         AND ((full_info->>'whole_row')::boolean
              OR a.attname::text IN (SELECT jsonb_array_elements_text(src->'key_columns'))
              OR a.attnum IN (SELECT (r->>'attnum')::int FROM jsonb_array_elements(full_info->'reads') r
                               WHERE (r->>'rel')::oid = (src->>'oid')::oid))
       ORDER BY 1)));
    sources := jsonb_set(sources, ARRAY[i::text, 'join_columns'], to_jsonb(ARRAY(
      SELECT DISTINCT a.attname::text
        FROM jsonb_array_elements(joins) e
        JOIN pg_attribute a ON a.attrelid = (src->>'oid')::oid
         AND a.attnum = CASE WHEN (e->>'left')::int = i THEN (e->>'left_attnum')::int
                             ELSE (e->>'right_attnum')::int END
       WHERE (e->>'left')::int = i OR (e->>'right')::int = i
       ORDER BY 1)));
    sources := jsonb_set(sources, ARRAY[i::text, 'group_columns'], to_jsonb(ARRAY(
      SELECT DISTINCT r->>'column'
        FROM jsonb_array_elements(group_specs) g, jsonb_array_elements(g->'reads') r
       WHERE (r->>'source')::int = i
       ORDER BY 1)));
    IF NOT (sources->i ? 'target_key_columns') THEN
      sources := jsonb_set(sources, ARRAY[i::text, 'target_key_columns'],
        CASE WHEN aggregates THEN 'null'::jsonb ELSE '[]'::jsonb END);
    END IF;
  END LOOP;

  RETURN jsonb_build_object(
    'ast', jsonb_set(
      jsonb_set(ast, '{select}', resolved_select),
      '{from,schema}', to_jsonb(sources->0->>'schema'))
      || jsonb_build_object('joins', coalesce((
           SELECT jsonb_agg(jn || jsonb_build_object('schema', sources->(o::int)->>'schema') ORDER BY o)
             FROM jsonb_array_elements(ast->'joins') WITH ORDINALITY AS x(jn, o)), '[]')),
    'sources', sources,
    'from_sql', from_sql,
    'aggregates', aggregates,
    'columns', columns,
    'key', to_jsonb(key_names),
    'key_nullable', key_nullable,
    'groups', group_specs,
    'joins', joins);
END
$fn$;

-- The columns a query (analysed by _analyze_query) reads, as [{source, column}] of the
-- statement's sources; a whole-row reference counts as every column.
CREATE FUNCTION "trellis"._reads_by_source(info jsonb, sources jsonb)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(jsonb_agg(DISTINCT jsonb_build_object('source', (s->>'ordinal')::int, 'column', a.attname)), '[]')
    FROM jsonb_array_elements(sources) s
    JOIN pg_attribute a ON a.attrelid = (s->>'oid')::oid AND a.attnum > 0 AND NOT a.attisdropped
   WHERE (info->>'whole_row')::boolean
      OR EXISTS (SELECT 1 FROM jsonb_array_elements(info->'reads') r
                  WHERE (r->>'rel')::oid = (s->>'oid')::oid AND (r->>'attnum')::int = a.attnum)
$fn$;
$trellis_m5$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 6) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (6, 'apply', false);
    EXECUTE $trellis_m6$-- apply(statement): every statement of the grammar, callable from SQL so a transform can
-- be defined inside any migration's transaction, atomically with the DDL around it.

-- Targets are written by Trellis only. A statement-level guard on each target refuses
-- every other INSERT, UPDATE, DELETE and TRUNCATE (ENABLE ALWAYS: replication mode does
-- not lift it). The engine's own writes set trellis.maintaining to its catalog schema for
-- their transaction.
CREATE FUNCTION "trellis".guard_target()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF current_setting('trellis.maintaining', true) IS DISTINCT FROM 'trellis' THEN
    RAISE EXCEPTION 'table %.% is a Trellis target: only Trellis writes to it', TG_TABLE_SCHEMA, TG_TABLE_NAME
      USING ERRCODE = 'TRW01',
            HINT = 'change the rows of its sources, or the transform (ALTER TRANSFORM), instead';
  END IF;
  RETURN NULL;
END
$fn$;

-- The transform a statement names, or a not_found error. A statement may write the
-- target schema-qualified; any schema but the instance's target schema names nothing.
CREATE FUNCTION "trellis"._transform_named(ast jsonb)
RETURNS "trellis".transforms LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms;
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
BEGIN
  IF ast->>'schema' IS NOT NULL AND ast->>'schema' <> tschema THEN
    PERFORM "trellis"._fail('TRN01', format(
      'there is no transform %I.%I: transforms live in schema %I', ast->>'schema', ast->>'transform', tschema));
  END IF;
  SELECT * INTO t FROM "trellis".transforms x
   WHERE x.target_name = ast->>'transform' AND x.target_schema = tschema;
  IF NOT FOUND THEN
    PERFORM "trellis"._fail('TRN01', format('there is no transform named %I', ast->>'transform'));
  END IF;
  RETURN t;
END
$fn$;

-- Creates the target table for an analysed spec: typed as Postgres typed the definition,
-- keyed by its key, guarded against writes from anyone but Trellis.
CREATE FUNCTION "trellis"._create_target(target_schema name, target_name text, spec jsonb)
RETURNS oid LANGUAGE plpgsql AS $fn$
DECLARE
  qualified text := quote_ident(target_schema) || '.' || quote_ident(target_name);
  ddl text;
  keys text;
  src jsonb;
BEGIN
  keys := (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(spec->'key') k);
  ddl := 'CREATE TABLE ' || qualified || ' (' || (
    SELECT string_agg(quote_ident(c->>'name') || ' ' || (c->>'type')
             || coalesce(' COLLATE ' || (c->>'collation'), '')
             || CASE WHEN (c->>'notnull')::boolean THEN ' NOT NULL' ELSE '' END, ', ' ORDER BY o)
      FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o));
  IF keys IS NOT NULL AND NOT (spec->>'key_nullable')::boolean THEN
    ddl := ddl || ', PRIMARY KEY (' || keys || ')';
  ELSIF keys IS NOT NULL THEN
    IF current_setting('server_version_num')::int < 150000 THEN
      PERFORM "trellis"._fail('TRV01',
        'this target''s key can be NULL (a LEFT JOIN or a nullable GROUP BY expression), which needs Postgres 15 or newer (UNIQUE NULLS NOT DISTINCT)');
    END IF;
    ddl := ddl || ', UNIQUE NULLS NOT DISTINCT (' || keys || ')';
  END IF;
  BEGIN
    EXECUTE ddl || ')';
  EXCEPTION
    WHEN insufficient_privilege OR query_canceled OR lock_not_available THEN
      RAISE;
    -- A key column of a type without a btree operator class (GROUP BY xmin groups by xid,
    -- which only hashes): there is no primary key or unique constraint to build on it.
    WHEN undefined_object THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the target''s key (%s) cannot be indexed: %s', keys, SQLERRM),
        'group by an expression of a type that sorts, e.g. cast it to text');
    -- The analysis let it through, but Postgres will not create the table (too many
    -- columns, say): a validation error naming the target, not an internal one.
    WHEN syntax_error_or_access_rule_violation OR program_limit_exceeded OR feature_not_supported
         OR data_exception THEN
      PERFORM "trellis"._fail('TRV01', format('the target %s cannot be created: %s', qualified, SQLERRM));
  END;
  IF keys IS NULL THEN
    -- A grand total: one row at most.
    EXECUTE 'CREATE UNIQUE INDEX ON ' || qualified || ' ((true))';
  END IF;
  -- Joined tables' keys: the drain finds the target rows a changed row touches by them.
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') WHERE (value->>'ordinal')::int > 0 LOOP
    IF jsonb_typeof(src->'target_key_columns') = 'array' THEN
      EXECUTE 'CREATE INDEX ON ' || qualified || ' (' || (
        SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(src->'target_key_columns') k) || ')';
    END IF;
  END LOOP;
  EXECUTE 'CREATE TRIGGER trellis_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON '
    || qualified || ' FOR EACH STATEMENT EXECUTE FUNCTION "trellis".guard_target()';
  EXECUTE 'ALTER TABLE ' || qualified || ' ENABLE ALWAYS TRIGGER trellis_guard';
  RETURN qualified::regclass::oid;
END
$fn$;

-- The key map of a GROUP BY transform: one row per source row combination (join row)
-- that passes WHERE, holding every source's key (k<source>_<n>) and its group (g<n>).
-- When a source row changes, its old groups are read here; the drain keeps it in step.
-- Indexed by each source's key, to find the rows a changed source row was part of.
CREATE FUNCTION "trellis"._create_key_map(transform_id int, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  map_sql text := 'trellis';
  src jsonb;
BEGIN
  map_sql := quote_ident(map_sql) || '.' || quote_ident('map_' || transform_id);
  EXECUTE 'CREATE TABLE ' || map_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT (s->>'ordinal')::int AS o1, k.o AS o2,
             quote_ident(format('k%s_%s', s->>'ordinal', k.o)) || ' ' || k.t AS col
        FROM jsonb_array_elements(spec->'sources') s,
             jsonb_array_elements_text(s->'key_types') WITH ORDINALITY AS k(t, o)
      UNION ALL
      SELECT 1000000, g.o, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '')
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)) c) || ')';
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') LOOP
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || (
      SELECT string_agg(quote_ident(format('k%s_%s', src->>'ordinal', k.o)), ', ' ORDER BY k.o)
        FROM jsonb_array_elements_text(src->'key_types') WITH ORDINALITY AS k(t, o)) || ')';
  END LOOP;
END
$fn$;

-- Writes a transform's catalog rows from its spec.
CREATE FUNCTION "trellis"._register(transform_id int, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  DELETE FROM "trellis".transform_sources WHERE transform_sources.transform_id = _register.transform_id;
  INSERT INTO "trellis".transform_sources (
      transform_id, ordinal, source_oid, source_schema, source_name, alias, join_type,
      join_condition, key_columns, key_types, target_key_columns, read_columns,
      join_columns, group_columns)
  SELECT _register.transform_id, (s->>'ordinal')::int, (s->>'oid')::oid, s->>'schema', s->>'name',
         s->>'alias', s->>'join_type', s->>'on',
         ARRAY(SELECT jsonb_array_elements_text(s->'key_columns'))::name[],
         ARRAY(SELECT jsonb_array_elements_text(s->'key_types')),
         CASE WHEN jsonb_typeof(s->'target_key_columns') = 'array'
              THEN ARRAY(SELECT jsonb_array_elements_text(s->'target_key_columns'))::name[] END,
         ARRAY(SELECT jsonb_array_elements_text(s->'read_columns'))::name[],
         ARRAY(SELECT jsonb_array_elements_text(coalesce(s->'join_columns', '[]')))::name[],
         ARRAY(SELECT jsonb_array_elements_text(coalesce(s->'group_columns', '[]')))::name[]
    FROM jsonb_array_elements(spec->'sources') s;
END
$fn$;

CREATE FUNCTION "trellis"._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
  tname text := ast->'target'->>'name';
  spec jsonb;
  v_oid oid;
  new_id int;
  normalised text;
BEGIN
  IF ast->'target'->>'schema' IS NOT NULL AND ast->'target'->>'schema' <> tschema THEN
    PERFORM "trellis"._fail('TRV01', format(
      'targets live in schema %I (the instance''s target schema): write the target as %I', tschema, tname));
  END IF;
  IF octet_length(tname) > 63 THEN
    PERFORM "trellis"._fail('TRV01', format('target name %s is longer than 63 bytes', tname));
  END IF;
  IF EXISTS (SELECT 1 FROM "trellis".transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM "trellis"._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  IF to_regclass(quote_ident(tschema) || '.' || quote_ident(tname)) IS NOT NULL THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the target %I.%I would clash with an existing relation of that name: choose another target name',
      tschema, tname));
  END IF;
  -- A table brings a row type of its name, so a type of that name (an enum, a domain...)
  -- is a clash too; but not an array type Postgres made for another type (CREATE TABLE
  -- renames it out of the way).
  IF EXISTS (SELECT 1 FROM pg_type ty JOIN pg_namespace n ON n.oid = ty.typnamespace
              WHERE n.nspname = tschema AND ty.typname = tname
                AND NOT EXISTS (SELECT 1 FROM pg_type el
                                 WHERE el.oid = ty.typelem AND el.typarray = ty.oid)) THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the target %I.%I would clash with an existing type of that name: choose another target name',
      tschema, tname));
  END IF;

  spec := "trellis"._analyze_transform(ast);
  spec := jsonb_set(spec, '{ast,target}', jsonb_build_object('schema', NULL, 'name', tname));
  normalised := "trellis".render_statement(spec->'ast');
  v_oid := "trellis"._create_target(tschema, tname, spec);

  INSERT INTO "trellis".transforms (target_schema, target_name, target_oid, statement, spec,
                                   aggregates, without_source_index, search_path)
  VALUES (tschema, tname, v_oid, normalised, spec,
          (spec->>'aggregates')::boolean, coalesce((ast->>'without_source_index')::boolean, false),
          array_to_string(ARRAY(SELECT quote_ident(s) FROM unnest(current_schemas(false)) AS s), ', '))
  RETURNING id INTO new_id;
  PERFORM "trellis"._register(new_id, spec);
  IF jsonb_array_length(coalesce(spec->'groups', '[]')) > 0 THEN
    PERFORM "trellis"._create_key_map(new_id, spec);
  END IF;
  INSERT INTO "trellis".transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  SELECT new_id, o::int - 1, c->>'name', c->>'expression', c->>'type', c->>'collation',
         (c->>'is_key')::boolean, (c->>'implicit')::boolean, c->'reads'
    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o);
  RETURN jsonb_build_object('kind', 'transform_defined', 'target', tname);
END
$fn$;

CREATE FUNCTION "trellis"._pause(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  col "trellis".transform_columns;
BEGIN
  IF ast->>'column' IS NULL THEN
    UPDATE "trellis".transforms
       SET paused_at = coalesce(paused_at, now()), pause_reason = coalesce(pause_reason, 'operator'),
           updated_at = now()
     WHERE id = t.id;
    RETURN jsonb_build_object('kind', 'paused', 'address', t.target_name);
  END IF;
  SELECT * INTO col FROM "trellis".transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'column';
  IF NOT FOUND THEN
    PERFORM "trellis"._fail('TRN01', format('transform %I has no column %I', t.target_name, ast->>'column'));
  END IF;
  IF col.is_key THEN
    PERFORM "trellis"._fail('TRV01', format(
      '%I.%I is part of the target''s key: pause the whole transform instead', t.target_name, col.name));
  END IF;
  UPDATE "trellis".transform_columns
     SET paused_at = coalesce(paused_at, now()), pause_reason = coalesce(pause_reason, 'operator')
   WHERE transform_id = t.id AND name = col.name;
  RETURN jsonb_build_object('kind', 'paused', 'address', t.target_name || '.' || col.name);
END
$fn$;

-- RESUME of a transform resumes it and every paused column of it; RESUME of a column
-- resumes that column. Returns the addresses that were paused and now are not.
CREATE FUNCTION "trellis"._resume(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  addresses text[] := '{}';
BEGIN
  IF ast->>'column' IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM "trellis".transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'column') THEN
    PERFORM "trellis"._fail('TRN01', format('transform %I has no column %I', t.target_name, ast->>'column'));
  END IF;
  IF ast->>'column' IS NULL AND t.paused_at IS NOT NULL THEN
    addresses := addresses || t.target_name::text;
    UPDATE "trellis".transforms SET paused_at = NULL, pause_reason = NULL, updated_at = now() WHERE id = t.id;
    -- A pause the ledger could not have covered (capture was broken or disrupted) resumes
    -- through a rebuild; any other resumes from where the transform stopped.
    IF t.pause_reason IN ('capture_failure', 'disruption') THEN
      PERFORM "trellis"._request_rebuild(t.id);
    ELSIF t.pause_reason = 'build_failure' THEN
      -- The cause was fixed: the build gets its attempts afresh, starting now.
      UPDATE "trellis".pipeline SET build_attempts = 0, build_next_at = NULL WHERE transform_id = t.id;
    END IF;
  END IF;
  WITH resumed AS (
    UPDATE "trellis".transform_columns SET paused_at = NULL, pause_reason = NULL
     WHERE transform_id = t.id AND paused_at IS NOT NULL
       AND (ast->>'column' IS NULL OR name = ast->>'column')
    RETURNING name)
  SELECT addresses || coalesce(array_agg(t.target_name || '.' || name ORDER BY name), '{}')
    INTO addresses FROM resumed;
  -- A paused column was left as it was while its rows changed: rebuild to catch it up.
  IF EXISTS (SELECT 1 FROM unnest(addresses) a WHERE a LIKE '%.%' AND a <> t.target_name::text) THEN
    PERFORM "trellis"._request_rebuild(t.id);
  END IF;
  -- Held keys are tried again: they go back into the ledger as changes of this transaction.
  IF ast->>'column' IS NULL THEN
    WITH released AS (
      DELETE FROM "trellis".held_keys h WHERE h.transform_id = t.id RETURNING h.source_id, h.key)
    INSERT INTO "trellis".ledger (gen, source_id, xid, keys)
    SELECT "trellis".ledger_generation(x.xid), r.source_id, x.xid,
           ARRAY[CASE WHEN cardinality(r.key) = 1 THEN r.key[1] ELSE r.key::text END]
      FROM released r, (SELECT pg_current_xact_id()::text::bigint AS xid) x;
  END IF;
  RETURN jsonb_build_object('kind', 'resumed', 'addresses', to_jsonb(addresses));
END
$fn$;

-- Raises a conflict for a DROP of `what` (a target, or target.column) that objects of the
-- app's depend on (a view, say): Trellis never drops what it did not create, so the app
-- must drop or change them first. `dependents` is the DROP's error detail, which lists them.
CREATE FUNCTION "trellis"._fail_dependents(what text, dependents text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM "trellis"._fail('TRC01', format(
    '%s is used by objects Trellis did not create (%s): drop or change them first',
    what, replace(coalesce(dependents, 'see pg_depend'), E'\n', '; ')));
END
$fn$;

CREATE FUNCTION "trellis"._drop(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  reader text;
  dependents text;
BEGIN
  SELECT r.target_name INTO reader
    FROM "trellis".transform_sources s JOIN "trellis".transforms r ON r.id = s.transform_id
   WHERE s.source_oid = t.target_oid AND r.id <> t.id LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRC01', format(
      'transform %I reads %I: drop it first', reader, t.target_name));
  END IF;
  DELETE FROM "trellis".transforms WHERE id = t.id;
  IF EXISTS (SELECT 1 FROM pg_class WHERE oid = t.target_oid) THEN
    BEGIN
      EXECUTE 'DROP TABLE ' || t.target_oid::regclass::text;
    EXCEPTION WHEN dependent_objects_still_exist THEN
      GET STACKED DIAGNOSTICS dependents = PG_EXCEPTION_DETAIL;
      PERFORM "trellis"._fail_dependents(t.target_name, dependents);
    END;
  END IF;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id);
  RETURN jsonb_build_object('kind', 'dropped', 'target', t.target_name);
END
$fn$;

-- The statement and spec after an ALTER: the spec's AST changed, the rest follows.
CREATE FUNCTION "trellis"._restate(t "trellis".transforms, ast jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  UPDATE "trellis".transforms
     SET spec = jsonb_set(spec, '{ast}', ast),
         statement = "trellis".render_statement(ast),
         without_source_index = coalesce((ast->>'without_source_index')::boolean, false),
         updated_at = now()
   WHERE id = t.id;
END
$fn$;

-- ALTER ... ADD COLUMN: the whole definition, with the new column, is validated again; the
-- column is added to the target, which is then rebuilt to fill it. Never part of the key.
CREATE FUNCTION "trellis"._alter_add_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  new_ast jsonb;
  spec jsonb;
  col jsonb;
BEGIN
  IF EXISTS (SELECT 1 FROM "trellis".transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'name') THEN
    PERFORM "trellis"._fail('TRV01', format('transform %I already has a column %I', t.target_name, ast->>'name'));
  END IF;
  new_ast := jsonb_set(t.spec->'ast', '{select}', (t.spec->'ast'->'select') || jsonb_build_array(
    jsonb_build_object('expr', ast->>'expr', 'name', ast->>'name', 'bare_label', NULL,
                       'label_expr', NULL, 'position', NULL)));
  spec := "trellis"._analyze_transform(new_ast);
  IF (spec->>'aggregates')::boolean <> t.aggregates THEN
    PERFORM "trellis"._fail('TRV01', format(
      'column %I would make transform %I %s: define a new transform instead', ast->>'name', t.target_name,
      CASE WHEN t.aggregates THEN 'stop aggregating' ELSE 'aggregate' END));
  END IF;
  SELECT c INTO col FROM jsonb_array_elements(spec->'columns') c WHERE c->>'name' = ast->>'name';
  BEGIN
    EXECUTE 'ALTER TABLE ' || t.target_oid::regclass::text || ' ADD COLUMN ' || quote_ident(col->>'name')
      || ' ' || (col->>'type') || coalesce(' COLLATE ' || (col->>'collation'), '');
  EXCEPTION WHEN program_limit_exceeded THEN
    -- Tables can have at most 1600 columns.
    PERFORM "trellis"._fail('TRV01', format('column %I cannot be added to %I: %s', col->>'name', t.target_name, SQLERRM));
  END;
  INSERT INTO "trellis".transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  VALUES (t.id, (SELECT max(ordinal) + 1 FROM "trellis".transform_columns WHERE transform_id = t.id),
          col->>'name', col->>'expression', col->>'type', col->>'collation', false, false, col->'reads');
  -- Sources may now be read in more columns.
  UPDATE "trellis".transform_sources s
     SET read_columns = ARRAY(SELECT jsonb_array_elements_text(n->'read_columns'))::name[]
    FROM jsonb_array_elements(spec->'sources') n
   WHERE s.transform_id = t.id AND s.ordinal = (n->>'ordinal')::int;
  PERFORM "trellis"._restate(t, new_ast);
  PERFORM "trellis"._request_rebuild(t.id);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

CREATE FUNCTION "trellis"._alter_drop_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  col "trellis".transform_columns;
  reader text;
  new_ast jsonb;
  dependents text;
BEGIN
  SELECT * INTO col FROM "trellis".transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'name';
  IF NOT FOUND THEN
    PERFORM "trellis"._fail('TRN01', format('transform %I has no column %I', t.target_name, ast->>'name'));
  END IF;
  IF col.is_key THEN
    PERFORM "trellis"._fail('TRV01', format(
      '%I.%I is part of the target''s key and cannot be dropped', t.target_name, col.name));
  END IF;
  SELECT r.target_name INTO reader
    FROM "trellis".transform_sources s JOIN "trellis".transforms r ON r.id = s.transform_id
   WHERE s.source_oid = t.target_oid AND col.name = ANY (s.read_columns) LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRC01', format('transform %I reads %I.%I: change it first', reader, t.target_name, col.name));
  END IF;
  new_ast := jsonb_set(t.spec->'ast', '{select}', coalesce((
    SELECT jsonb_agg(i ORDER BY o) FROM jsonb_array_elements(t.spec->'ast'->'select') WITH ORDINALITY AS x(i, o)
     WHERE i->>'name' <> col.name), '[]'));
  IF jsonb_array_length(new_ast->'select') = 0 THEN
    PERFORM "trellis"._fail('TRV01', format(
      '%I is the last column of transform %I''s SELECT list: drop the transform instead', col.name, t.target_name));
  END IF;
  BEGIN
    EXECUTE 'ALTER TABLE ' || t.target_oid::regclass::text || ' DROP COLUMN ' || quote_ident(col.name);
  EXCEPTION WHEN dependent_objects_still_exist THEN
    GET STACKED DIAGNOSTICS dependents = PG_EXCEPTION_DETAIL;
    PERFORM "trellis"._fail_dependents(t.target_name || '.' || col.name, dependents);
  END;
  DELETE FROM "trellis".transform_columns WHERE transform_id = t.id AND name = col.name;
  PERFORM "trellis"._restate(t, new_ast);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

CREATE FUNCTION "trellis"._alter_without_source_index(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
BEGIN
  PERFORM "trellis"._restate(t, jsonb_set(t.spec->'ast', '{without_source_index}', ast->'value'));
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- Applies one statement (see the grammar in 0003) and returns what it did:
--   {"kind": "transform_defined", "target"} | {"kind": "paused", "address"}
--   | {"kind": "resumed", "addresses"} | {"kind": "dropped", "target"} | {"kind": "altered", "target"}
-- Applies of one instance are serialised by an advisory lock held to the end of the
-- transaction, so the catalog never sees two statements interleave.
CREATE FUNCTION "trellis"._apply(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  ast jsonb;
BEGIN
  IF statement IS NULL THEN
    PERFORM "trellis"._fail('TRP01', 'the statement is NULL');
  END IF;
  ast := "trellis".parse_statement(statement);
  IF transform_only AND ast->>'kind' <> 'transform' THEN
    PERFORM "trellis"._fail('TRV01', format(
      'define() takes a TRANSFORM statement, not %s: use apply() for it', upper(split_part(ast->>'kind', '_', 1))));
  END IF;
  PERFORM pg_advisory_xact_lock(1953653104, hashtext('trellis'));
  CASE ast->>'kind'
    WHEN 'transform' THEN RETURN "trellis"._define(ast, statement);
    WHEN 'pause' THEN RETURN "trellis"._pause(ast);
    WHEN 'resume' THEN RETURN "trellis"._resume(ast);
    WHEN 'drop' THEN RETURN "trellis"._drop(ast);
    WHEN 'alter_add_column' THEN RETURN "trellis"._alter_add_column(ast);
    WHEN 'alter_drop_column' THEN RETURN "trellis"._alter_drop_column(ast);
    WHEN 'alter_without_source_index' THEN RETURN "trellis"._alter_without_source_index(ast);
  END CASE;
  PERFORM "trellis"._fail('TRP01', format('unknown statement kind %s', ast->>'kind'));
  RETURN NULL;
END
$fn$;

CREATE FUNCTION "trellis".apply(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT "trellis"._apply(statement, false)
$fn$;

-- apply() for a TRANSFORM only: refuses every other statement.
CREATE FUNCTION "trellis".define(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT "trellis"._apply(statement, true)
$fn$;
$trellis_m6$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 7) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (7, 'pipeline', false);
    EXECUTE $trellis_m7$-- The live pipeline's state: captured sources, the ledger and its ticks, each
-- transform's progress, open drain pages, and keys held back from a transform.
-- How they work together: src/engine/DESIGN.md.

-- Tables the staging worker captures: one row per source table any transform reads.
CREATE TABLE "trellis".sources (
  id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  source_oid oid NOT NULL UNIQUE,
  -- schema.table when capture was installed (for messages once the table is gone).
  qualified text NOT NULL,
  key_columns name[] NOT NULL,
  key_types text[] NOT NULL,
  -- The columns the installed UPDATE trigger compares: an UPDATE changing none of them
  -- captures nothing. Grows (widen) when a new transform reads more.
  captured_columns name[] NOT NULL DEFAULT '{}',
  installed_at timestamptz,
  -- pg_snapshot_xmax just after capture last changed: a transform whose backfill starts at a
  -- tick with xmin at or past it knows no writer still runs older trigger code.
  ready_xmax xid8,
  -- While an install, widen or uninstall waits on a lock: {operation, lock_mode, since}.
  wait jsonb
);

-- The ledger: (source, keys, xid) for every captured change, nothing else. A row holds the
-- keys of every row one statement changed (one row per key would make a bulk write pay a
-- ledger row per row). Each key is one text: a one-column key's own text form, a
-- wider key's text[] in its text form ('{1,abc}'); see src/engine/capture/trigger-sql.ts.
-- NULL keys mark a TRUNCATE of the source. xid is the writing transaction's id
-- (pg_current_xact_id() as a bigint, so a BRIN index can range over it: rows arrive
-- roughly in xid order, and a BRIN index costs writers next to nothing, where a btree
-- costs every captured row).
--
-- Partitioned into three generations by xid epoch: gen = (xid >> 16) % 3, a pure function
-- of the transaction, so a trigger needs no lookup to know where to write. A generation
-- whose rows every cursor has passed is TRUNCATEd (no DELETE, no bloat); the current
-- epoch's never is. See src/engine/staging/ledger-maintenance.ts.
CREATE TABLE "trellis".ledger (
  gen smallint NOT NULL,
  source_id int NOT NULL,
  xid bigint NOT NULL,
  keys text[]
) PARTITION BY LIST (gen);
CREATE TABLE "trellis".ledger_0 PARTITION OF "trellis".ledger FOR VALUES IN (0);
CREATE TABLE "trellis".ledger_1 PARTITION OF "trellis".ledger FOR VALUES IN (1);
CREATE TABLE "trellis".ledger_2 PARTITION OF "trellis".ledger FOR VALUES IN (2);
CREATE INDEX ledger_by_xid ON "trellis".ledger USING brin (xid)
  WITH (pages_per_range = 16, autosummarize = on);

-- The generation a transaction's ledger rows go to.
CREATE FUNCTION "trellis".ledger_generation(xid bigint)
RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
  SELECT ((xid >> 16) % 3)::smallint
$fn$;

-- Ticks seal segments: a tick records pg_current_snapshot(); the segment after tick A up
-- to tick B holds the ledger rows whose transactions B sees and A does not, so a
-- transaction committing out of xid order is never skipped (as in PgQ).
CREATE SEQUENCE "trellis".tick_seq;
CREATE TABLE "trellis".ticks (
  seq bigint PRIMARY KEY,
  snap pg_snapshot NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Each transform's progress through its lifecycle.
CREATE TABLE "trellis".pipeline (
  transform_id int PRIMARY KEY REFERENCES "trellis".transforms ON DELETE CASCADE,
  phase text NOT NULL DEFAULT 'waiting_to_backfill'
    CHECK (phase IN ('waiting_to_backfill', 'backfilling', 'catching_up', 'live')),
  -- Empty the target before the next backfill (a rebuild).
  rebuild boolean NOT NULL DEFAULT false,
  -- The last tick whose changes are all applied; NULL before the first backfill starts.
  cursor_tick bigint,
  -- Backfill progress: the last driving-table key filled, keys done and in all (estimate).
  backfill_position text[],
  -- A projection or join backfills in 'rows' chunks; a GROUP BY transform in one 'groups'
  -- statement that fills its key map too ('repair' re-derives its groups key by key when
  -- that fails on a row). See src/engine/drain/backfill.ts.
  backfill_stage text NOT NULL DEFAULT 'rows' CHECK (backfill_stage IN ('rows', 'groups', 'repair')),
  backfill_done bigint NOT NULL DEFAULT 0,
  -- A build into an empty target drops the target's (and key map's) indexes and key
  -- constraint, and adds them back when it is done: one index build instead of index
  -- inserts row by row. What re-creates them waits here meanwhile.
  deferred_ddl text[],
  backfill_total bigint,
  backfill_started_at timestamptz,
  live_since timestamptz,
  -- The range of ticks being drained, and its pages still to do.
  open_lo bigint,
  open_hi bigint,
  open_pages int,
  pages_left int,
  -- A failing backfill: attempts, latest error, when it is tried again.
  build_attempts int NOT NULL DEFAULT 0,
  build_error text,
  build_next_at timestamptz,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- A build that deferred its target's key (deferred_ddl above) puts it back now: a transform
-- being defined over that target needs its key, and will look rows up by it. Waits for the
-- chunk being filled (it holds the pipeline row).
CREATE FUNCTION "trellis"._restore_deferred_ddl(target oid)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  building int;
  ddl text;
BEGIN
  SELECT p.transform_id INTO building
    FROM "trellis".pipeline p JOIN "trellis".transforms t ON t.id = p.transform_id
   WHERE t.target_oid = target AND p.deferred_ddl IS NOT NULL
     FOR UPDATE OF p;
  IF building IS NULL THEN RETURN; END IF;
  FOR ddl IN SELECT unnest(deferred_ddl) FROM "trellis".pipeline WHERE transform_id = building LOOP
    EXECUTE ddl;
  END LOOP;
  UPDATE "trellis".pipeline SET deferred_ddl = NULL WHERE transform_id = building;
END
$fn$;

-- Pages of an open range not yet applied. A drain claims one with FOR UPDATE SKIP LOCKED
-- and deletes it in the transaction that applies it; a claim dies with its session.
CREATE TABLE "trellis".pages (
  transform_id int NOT NULL REFERENCES "trellis".pipeline ON DELETE CASCADE,
  page int NOT NULL,
  -- A big range is split by ledger blocks: generation gen, blocks blk_lo up to (not
  -- including) blk_hi. NULL for a range small enough to be one page.
  gen smallint,
  blk_lo bigint,
  blk_hi bigint,
  -- A page takes only the keys whose hash falls in its bucket (of `buckets`): pages of
  -- different buckets hold different keys, so they can be applied at once.
  bucket smallint NOT NULL DEFAULT 0,
  buckets smallint NOT NULL DEFAULT 1,
  attempts int NOT NULL DEFAULT 0,
  error text,
  sqlstate text,
  first_failed_at timestamptz,
  last_failed_at timestamptz,
  not_before timestamptz,
  PRIMARY KEY (transform_id, page)
);

-- One row per (transform, bucket): a drain applying a page locks its bucket's slot, so
-- pages of one bucket (which may share keys, and so target rows) apply one at a time.
CREATE TABLE "trellis".page_slots (
  transform_id int NOT NULL REFERENCES "trellis".pipeline ON DELETE CASCADE,
  bucket smallint NOT NULL,
  PRIMARY KEY (transform_id, bucket)
);

-- Source keys a transform's re-derivation failed on: held back from that transform (every
-- other key, and every other transform, goes on) until released.
CREATE TABLE "trellis".held_keys (
  transform_id int NOT NULL REFERENCES "trellis".transforms ON DELETE CASCADE,
  source_id int NOT NULL,
  key text[] NOT NULL,
  error text NOT NULL,
  sqlstate text,
  held_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (transform_id, source_id, key)
);

-- A transform's pipeline row comes with it.
CREATE FUNCTION "trellis"._pipeline_for_new_transform()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO "trellis".pipeline (transform_id) VALUES (NEW.id);
  RETURN NULL;
END
$fn$;
CREATE TRIGGER pipeline_for_new_transform AFTER INSERT ON "trellis".transforms
  FOR EACH ROW EXECUTE FUNCTION "trellis"._pipeline_for_new_transform();

-- Sends a transform back to be built again from its sources (after a change the ledger
-- cannot replay: a new column, a resumed column, a repaired capture, a TRUNCATE).
CREATE FUNCTION "trellis"._request_rebuild(transform_id int)
RETURNS void LANGUAGE sql AS $fn$
  UPDATE "trellis".pipeline
     SET phase = 'waiting_to_backfill', rebuild = true, backfill_stage = 'rows',
         open_lo = NULL, open_hi = NULL,
         open_pages = NULL, pages_left = NULL, backfill_position = NULL, backfill_done = 0,
         backfill_total = NULL, build_attempts = 0, build_error = NULL, build_next_at = NULL,
         updated_at = now()
   WHERE pipeline.transform_id = _request_rebuild.transform_id;
  DELETE FROM "trellis".pages WHERE pages.transform_id = _request_rebuild.transform_id;
$fn$;
$trellis_m7$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 8) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (8, 'source_index_gaps', false);
    EXECUTE $trellis_m8$-- Source indexes a transform's re-derivation needs and lacks. The drain finds the rows a
-- change touches through join conditions (both sides of each equality) and, for GROUP BY,
-- the rows of a group through its bare-column GROUP BY expressions: without an index
-- leading with one of those columns, each lookup reads the whole table. Trellis never
-- creates indexes on user tables: it reports the gap and the statement that closes it.
CREATE FUNCTION "trellis".source_index_gaps(p_transform_id int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH t AS (SELECT * FROM "trellis".transforms WHERE id = p_transform_id),
  sides AS (
    SELECT (e->>'left')::int AS src, (e->>'left_attnum')::int AS attnum,
           CASE WHEN (e->>'left')::int = (e->>'join')::int THEN 'join_joined' ELSE 'join_from' END AS role
      FROM t, jsonb_array_elements(coalesce(t.spec->'joins', '[]')) e
    UNION
    SELECT (e->>'right')::int, (e->>'right_attnum')::int,
           CASE WHEN (e->>'right')::int = (e->>'join')::int THEN 'join_joined' ELSE 'join_from' END
      FROM t, jsonb_array_elements(coalesce(t.spec->'joins', '[]')) e
    UNION
    SELECT (g->'plain'->>'source')::int, (g->'plain'->>'attnum')::int, 'group_by'
      FROM t, jsonb_array_elements(coalesce(t.spec->'groups', '[]')) g
     WHERE jsonb_typeof(g->'plain') = 'object'),
  needs AS (
    SELECT src, role, array_agg(attnum ORDER BY attnum) AS attnums FROM sides GROUP BY src, role)
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'table', ts.source_schema || '.' || ts.source_name,
           'columns', to_jsonb(cols.names),
           'role', n.role,
           'opted_out', t.without_source_index,
           'fix', format('CREATE INDEX CONCURRENTLY ON %I.%I (%s)', ts.source_schema, ts.source_name,
                         (SELECT string_agg(quote_ident(c), ', ') FROM unnest(cols.names) c)))
         ORDER BY ts.ordinal, n.role), '[]')
    FROM needs n
    CROSS JOIN t
    JOIN "trellis".transform_sources ts ON ts.transform_id = t.id AND ts.ordinal = n.src
    CROSS JOIN LATERAL (
      SELECT array_agg(a.attname::text ORDER BY a.attnum) AS names
        FROM pg_attribute a WHERE a.attrelid = ts.source_oid AND a.attnum = ANY (n.attnums)) cols
   WHERE NOT EXISTS (
     SELECT 1 FROM pg_index i
      WHERE i.indrelid = ts.source_oid AND i.indisvalid AND i.indkey[0] = ANY (n.attnums))
$fn$;
$trellis_m8$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 9) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (9, 'source_changes', false);
    EXECUTE $trellis_m9$-- Never silently wrong (issue #8, ADR 0008): what a transform needs to notice a change to
-- its sources that the ledger cannot carry (DDL), stop with a reason, and be rebuilt; key
-- maps that route a change through the join rows it was part of, filtered ones included;
-- and the checks a definition must now pass (reserved names, function volatility).

-- Why a transform stopped reading its sources correctly, while it is paused for it:
-- {kind: 'capture', error: a sentence naming table, column and change, columns:
-- ["schema.table.column", ...], detected_at}.
ALTER TABLE "trellis".transforms ADD COLUMN capture_failure jsonb;

-- The source columns a transform reads, as they were when it was defined (or last
-- rebuilt): [{name, attnum, type}]. The staging worker compares them with the table as it
-- is: a column dropped, renamed or retyped (or, for a definition reading whole rows, any
-- column added or removed) stops the transform.
ALTER TABLE "trellis".transform_sources ADD COLUMN read_attrs jsonb;

-- A key column's type as keys are cast back to it from the ledger's text: with its
-- collation when that is not the type's own. Keys are compared, deduplicated and looked
-- up the way the table's key compares them: under a case-blind collation 'a' and 'A' are
-- one key, and the drain must not re-derive that row twice.
CREATE FUNCTION "trellis"._key_type(rel oid, attnum int2)
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT format_type(a.atttypid, a.atttypmod)
         || CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation
                 THEN ' COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname) ELSE '' END
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
    LEFT JOIN pg_collation co ON co.oid = a.attcollation
    LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
   WHERE a.attrelid = rel AND a.attnum = _key_type.attnum
$fn$;

-- _resolve_source, as before (0004), with key types from _key_type.
CREATE OR REPLACE FUNCTION "trellis"._resolve_source(src jsonb, role text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  written text;
  rel regclass;
  r record;
  keys name[];
  key_types text[];
BEGIN
  written := CASE WHEN src->>'schema' IS NULL THEN quote_ident(src->>'name')
                  ELSE quote_ident(src->>'schema') || '.' || quote_ident(src->>'name') END;
  rel := to_regclass(written);
  IF rel IS NULL THEN
    PERFORM "trellis"._fail('TRV01', format('%s table %s does not exist', role, written));
  END IF;
  SELECT c.relkind, c.relpersistence, n.nspname, c.relname INTO r
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
  IF r.relkind NOT IN ('r', 'p') THEN
    PERFORM "trellis"._fail('TRV01', format('%s %s is a %s: sources must be tables', role, written,
      CASE r.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
        WHEN 'f' THEN 'foreign table' WHEN 'S' THEN 'sequence' ELSE 'relation of kind ' || r.relkind::text END));
  END IF;
  IF r.relpersistence = 't' THEN
    PERFORM "trellis"._fail('TRV01', format('%s %s is a temporary table: sources must be permanent tables', role, written));
  END IF;
  IF r.nspname = 'trellis' THEN
    PERFORM "trellis"._fail('TRV01', format('%s %s is one of Trellis''s own tables', role, written));
  END IF;
  -- Another transform's target in the middle of its build may be without its key (see
  -- _restore_deferred_ddl in 0007_pipeline.sql, which exists by the time this runs).
  PERFORM "trellis"._restore_deferred_ddl(rel);
  SELECT array_agg(a.attname ORDER BY k.i), array_agg("trellis"._key_type(a.attrelid, a.attnum) ORDER BY k.i)
    INTO keys, key_types
    FROM pg_index x
    CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
    JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
   WHERE x.indrelid = rel AND x.indisprimary;
  IF keys IS NULL THEN
    PERFORM "trellis"._fail('TRV01',
      format('%s %I.%I has no primary key: Trellis keys target rows by their source rows'' keys',
             role, r.nspname, r.relname),
      'add one, e.g. ALTER TABLE ' || quote_ident(r.nspname) || '.' || quote_ident(r.relname) || ' ADD PRIMARY KEY (...)');
  END IF;
  RETURN jsonb_build_object(
    'oid', rel::oid, 'schema', r.nspname, 'name', r.relname,
    'alias', coalesce(src->>'alias', r.relname),
    'qualified', quote_ident(r.nspname) || '.' || quote_ident(r.relname),
    'key_columns', to_jsonb(keys), 'key_types', to_jsonb(key_types));
END
$fn$;


-- Records read_attrs for every source of a transform, from the tables as they are now.
CREATE FUNCTION "trellis"._record_read_attrs(p_transform_id int)
RETURNS void LANGUAGE sql AS $fn$
  UPDATE "trellis".transform_sources ts
     SET read_attrs = (
       SELECT coalesce(jsonb_agg(jsonb_build_object(
                'name', a.attname, 'attnum', a.attnum,
                'type', format_type(a.atttypid, a.atttypmod)) ORDER BY a.attnum), '[]')
         FROM pg_attribute a
        WHERE a.attrelid = ts.source_oid AND a.attnum > 0 AND NOT a.attisdropped
          AND a.attname = ANY (ts.read_columns))
   WHERE ts.transform_id = p_transform_id;
$fn$;

-- Which key map a transform keeps (see _create_key_map): 'groups' for a GROUP BY, 'rows'
-- for a join with a WHERE, NULL for none.
CREATE FUNCTION "trellis"._key_map_kind(spec jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE
    WHEN jsonb_array_length(coalesce(spec->'groups', '[]')) > 0 THEN 'groups'
    WHEN jsonb_array_length(spec->'sources') > 1 AND spec->'ast'->>'where' IS NOT NULL THEN 'rows'
  END
$fn$;

-- The key map of a transform: one row per join row (source row combination), holding
-- every source's key (k<source>_<n>). The drain finds there the join rows a changed row
-- was part of: the old state, which the sources no longer show.
--  - 'groups' (GROUP BY): with the row's group (g<n>) and whether it passes WHERE
--    (passes); a join keeps every join row, a single table only those that pass.
--  - 'rows' (a join with a WHERE): every join row, before WHERE. A row a WHERE filtered
--    out is in no target row, yet a change to it can make another row appear: a LEFT JOIN
--    row that loses its last match turns into a NULL-extended row that may pass.
-- Joins without a WHERE need no map: the target holds every join row's keys.
-- Indexed by each source's key, to find the rows a changed source row was part of.
CREATE OR REPLACE FUNCTION "trellis"._create_key_map(transform_id int, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  map_sql text := quote_ident('trellis') || '.' || quote_ident('map_' || transform_id);
  kind text := "trellis"._key_map_kind(spec);
  src jsonb;
BEGIN
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
      SELECT 2000000, 0, 'passes boolean NOT NULL' WHERE kind = 'groups') c) || ')';
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') LOOP
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || (
      SELECT string_agg(quote_ident(format('k%s_%s', src->>'ordinal', k.o)), ', ' ORDER BY k.o)
        FROM jsonb_array_elements_text(src->'key_types') WITH ORDINALITY AS k(t, o)) || ')';
  END LOOP;
END
$fn$;

-- The checks a definition passes beyond what Postgres checks when it is analysed:
--  - no source alias starts with 'trellis#', the prefix of the names the engine gives its
--    own aliases and columns in generated SQL (src/engine/drain/sql-parts.ts), so an
--    expression can never resolve to one of them;
--  - every function it calls that is not built in (pg_catalog) is IMMUTABLE: a STABLE
--    one may read other tables, whose changes would never reach the target (VOLATILE
--    ones are refused by the analysis already).
-- Returns whether the definition reads some source's whole row.
CREATE FUNCTION "trellis"._check_definition(spec jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  bad record;
  full_info jsonb;
BEGIN
  SELECT s->>'alias' AS alias INTO bad FROM jsonb_array_elements(spec->'sources') s
   WHERE starts_with(s->>'alias', 'trellis#') LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): give the table another alias',
      bad.alias));
  END IF;
  full_info := "trellis"._analyze_query(
    'SELECT ' || (SELECT string_agg((c->>'expression') || ' AS ' || quote_ident(c->>'name'), ', ' ORDER BY o)
                    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o))
    || ' FROM ' || (spec->>'from_sql')
    || coalesce(' WHERE (' || (spec->'ast'->>'where') || ')', '')
    || CASE WHEN jsonb_array_length(spec->'ast'->'group_by') > 0
            THEN ' GROUP BY ' || (SELECT string_agg(g, ', ') FROM jsonb_array_elements_text(spec->'ast'->'group_by') g)
            ELSE '' END
    || coalesce(' HAVING (' || (spec->'ast'->>'having') || ')', ''),
    'in the definition');
  SELECT p.oid::regprocedure AS fn,
         CASE p.provolatile WHEN 's' THEN 'STABLE' ELSE 'VOLATILE' END AS volatility INTO bad
    FROM pg_proc p
   WHERE p.provolatile <> 'i' AND p.pronamespace <> 'pg_catalog'::regnamespace
     AND p.oid IN (SELECT f::oid FROM jsonb_array_elements_text(full_info->'functions') f
                   UNION SELECT f::oid FROM jsonb_array_elements_text(full_info->'operator_functions') f)
   LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the definition calls %s, which is %s: it may read other tables, and their changes would never reach the target. Use only IMMUTABLE functions of your own (declare it IMMUTABLE if its result depends on its arguments alone)',
      bad.fn, bad.volatility));
  END IF;
  RETURN (full_info->>'whole_row')::boolean;
END
$fn$;

CREATE OR REPLACE FUNCTION "trellis"._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
  tname text := ast->'target'->>'name';
  spec jsonb;
  v_oid oid;
  new_id int;
  normalised text;
BEGIN
  IF ast->'target'->>'schema' IS NOT NULL AND ast->'target'->>'schema' <> tschema THEN
    PERFORM "trellis"._fail('TRV01', format(
      'targets live in schema %I (the instance''s target schema): write the target as %I', tschema, tname));
  END IF;
  IF octet_length(tname) > 63 THEN
    PERFORM "trellis"._fail('TRV01', format('target name %s is longer than 63 bytes', tname));
  END IF;
  IF EXISTS (SELECT 1 FROM "trellis".transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM "trellis"._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  IF to_regclass(quote_ident(tschema) || '.' || quote_ident(tname)) IS NOT NULL THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the target %I.%I would clash with an existing relation of that name: choose another target name',
      tschema, tname));
  END IF;
  -- A table brings a row type of its name, so a type of that name (an enum, a domain...)
  -- is a clash too; but not an array type Postgres made for another type (CREATE TABLE
  -- renames it out of the way).
  IF EXISTS (SELECT 1 FROM pg_type ty JOIN pg_namespace n ON n.oid = ty.typnamespace
              WHERE n.nspname = tschema AND ty.typname = tname
                AND NOT EXISTS (SELECT 1 FROM pg_type el
                                 WHERE el.oid = ty.typelem AND el.typarray = ty.oid)) THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the target %I.%I would clash with an existing type of that name: choose another target name',
      tschema, tname));
  END IF;

  spec := "trellis"._analyze_transform(ast);
  spec := jsonb_set(spec, '{ast,target}', jsonb_build_object('schema', NULL, 'name', tname));
  spec := spec || jsonb_build_object(
    'whole_row', "trellis"._check_definition(spec),
    'key_map', "trellis"._key_map_kind(spec));
  normalised := "trellis".render_statement(spec->'ast');
  v_oid := "trellis"._create_target(tschema, tname, spec);

  INSERT INTO "trellis".transforms (target_schema, target_name, target_oid, statement, spec,
                                   aggregates, without_source_index, search_path)
  VALUES (tschema, tname, v_oid, normalised, spec,
          (spec->>'aggregates')::boolean, coalesce((ast->>'without_source_index')::boolean, false),
          array_to_string(ARRAY(SELECT quote_ident(s) FROM unnest(current_schemas(false)) AS s), ', '))
  RETURNING id INTO new_id;
  PERFORM "trellis"._register(new_id, spec);
  PERFORM "trellis"._record_read_attrs(new_id);
  PERFORM "trellis"._create_key_map(new_id, spec);
  INSERT INTO "trellis".transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  SELECT new_id, o::int - 1, c->>'name', c->>'expression', c->>'type', c->>'collation',
         (c->>'is_key')::boolean, (c->>'implicit')::boolean, c->'reads'
    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o);
  RETURN jsonb_build_object('kind', 'transform_defined', 'target', tname);
END
$fn$;

-- ALTER ... ADD COLUMN: as before (0006), and the new column's reads are recorded.
CREATE OR REPLACE FUNCTION "trellis"._alter_add_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  new_ast jsonb;
  spec jsonb;
  col jsonb;
BEGIN
  IF EXISTS (SELECT 1 FROM "trellis".transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'name') THEN
    PERFORM "trellis"._fail('TRV01', format('transform %I already has a column %I', t.target_name, ast->>'name'));
  END IF;
  new_ast := jsonb_set(t.spec->'ast', '{select}', (t.spec->'ast'->'select') || jsonb_build_array(
    jsonb_build_object('expr', ast->>'expr', 'name', ast->>'name', 'bare_label', NULL,
                       'label_expr', NULL, 'position', NULL)));
  spec := "trellis"._analyze_transform(new_ast);
  IF (spec->>'aggregates')::boolean <> t.aggregates THEN
    PERFORM "trellis"._fail('TRV01', format(
      'column %I would make transform %I %s: define a new transform instead', ast->>'name', t.target_name,
      CASE WHEN t.aggregates THEN 'stop aggregating' ELSE 'aggregate' END));
  END IF;
  IF "trellis"._check_definition(spec) AND NOT coalesce((t.spec->>'whole_row')::boolean, false) THEN
    UPDATE "trellis".transforms SET spec = spec || '{"whole_row": true}' WHERE id = t.id;
  END IF;
  SELECT c INTO col FROM jsonb_array_elements(spec->'columns') c WHERE c->>'name' = ast->>'name';
  BEGIN
    EXECUTE 'ALTER TABLE ' || t.target_oid::regclass::text || ' ADD COLUMN ' || quote_ident(col->>'name')
      || ' ' || (col->>'type') || coalesce(' COLLATE ' || (col->>'collation'), '');
  EXCEPTION WHEN program_limit_exceeded THEN
    -- Tables can have at most 1600 columns.
    PERFORM "trellis"._fail('TRV01', format('column %I cannot be added to %I: %s', col->>'name', t.target_name, SQLERRM));
  END;
  INSERT INTO "trellis".transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  VALUES (t.id, (SELECT max(ordinal) + 1 FROM "trellis".transform_columns WHERE transform_id = t.id),
          col->>'name', col->>'expression', col->>'type', col->>'collation', false, false, col->'reads');
  -- Sources may now be read in more columns.
  UPDATE "trellis".transform_sources s
     SET read_columns = ARRAY(SELECT jsonb_array_elements_text(n->'read_columns'))::name[]
    FROM jsonb_array_elements(spec->'sources') n
   WHERE s.transform_id = t.id AND s.ordinal = (n->>'ordinal')::int;
  PERFORM "trellis"._record_read_attrs(t.id);
  PERFORM "trellis"._restate(t, new_ast);
  PERFORM "trellis"._request_rebuild(t.id);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- A transform stopped by a capture failure binds its statement to its sources again, as
-- they are now (resolved with the search_path it was defined with): a source renamed back,
-- or a table created again under the old name, is read from then on. Refused, with the
-- transform left paused, when the statement no longer holds or would change the target's
-- columns (DROP TRANSFORM and define it again then).
CREATE FUNCTION "trellis"._rebind(t "trellis".transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  old_path text := current_setting('search_path');
  new_spec jsonb;
  now_cols text;
  was_cols text;
BEGIN
  PERFORM set_config('search_path', t.search_path, true);
  BEGIN
    new_spec := "trellis"._analyze_transform(t.spec->'ast');
  EXCEPTION WHEN SQLSTATE 'TRV01' THEN
    PERFORM set_config('search_path', old_path, true);
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I cannot resume: its definition no longer holds (%s). Fix the sources, or DROP TRANSFORM it and define it again',
      t.target_name, SQLERRM));
  END;
  PERFORM set_config('search_path', old_path, true);
  new_spec := jsonb_set(new_spec, '{ast,target}', t.spec->'ast'->'target');
  new_spec := new_spec || jsonb_build_object(
    'whole_row', "trellis"._check_definition(new_spec),
    'key_map', "trellis"._key_map_kind(new_spec));
  SELECT string_agg(format('%s %s %s', c->>'name', c->>'type', (c->>'is_key')::boolean), ', ' ORDER BY o) INTO now_cols
    FROM jsonb_array_elements(new_spec->'columns') WITH ORDINALITY AS x(c, o);
  SELECT string_agg(format('%s %s %s', c.name, c.type, c.is_key), ', ' ORDER BY c.ordinal) INTO was_cols
    FROM "trellis".transform_columns c WHERE c.transform_id = t.id;
  IF now_cols IS DISTINCT FROM was_cols THEN
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I cannot resume: as its sources are now, its definition gives the columns (%s), and its target has (%s). DROP TRANSFORM it and define it again',
      t.target_name, now_cols, was_cols));
  END IF;
  UPDATE "trellis".transforms SET spec = new_spec, capture_failure = NULL, updated_at = now()
   WHERE id = t.id;
  PERFORM "trellis"._register(t.id, new_spec);
  PERFORM "trellis"._record_read_attrs(t.id);
  -- Key types may have changed: the key map is made again (the rebuild fills it).
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id);
  PERFORM "trellis"._create_key_map(t.id, new_spec);
END
$fn$;

-- Transforms defined before this migration: their reads are recorded as the sources are
-- now; GROUP BY maps gain `passes` (every row they hold passed WHERE); a join with a WHERE
-- gets a map, and is rebuilt (as is a GROUP BY over a join with a WHERE, whose map lacked
-- the rows WHERE filtered out).
DO $migrate$
DECLARE
  t record;
BEGIN
  FOR t IN SELECT * FROM "trellis".transforms LOOP
    PERFORM "trellis"._record_read_attrs(t.id);
    UPDATE "trellis".transforms SET spec = spec || jsonb_build_object(
             'whole_row', false, 'key_map', "trellis"._key_map_kind(spec))
     WHERE id = t.id;
    IF "trellis"._key_map_kind(t.spec) = 'groups' THEN
      EXECUTE 'ALTER TABLE ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id)
        || ' ADD COLUMN passes boolean NOT NULL DEFAULT true';
    ELSIF "trellis"._key_map_kind(t.spec) = 'rows' THEN
      PERFORM "trellis"._create_key_map(t.id, t.spec);
    END IF;
    IF jsonb_array_length(t.spec->'sources') > 1 AND t.spec->'ast'->>'where' IS NOT NULL THEN
      PERFORM "trellis"._request_rebuild(t.id);
    END IF;
  END LOOP;
END
$migrate$;

-- A source renamed (or moved to another schema) is followed, as capture follows it (by
-- OID): the catalog's names, the statement's AST and its normalised text take the new
-- name, and a source written without an alias keeps its old name as one, so expressions
-- that qualify columns by it still mean the same. Returns the targets changed.
CREATE FUNCTION "trellis"._follow_source_renames()
RETURNS SETOF text LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
  path text[];
  new_spec jsonb;
BEGIN
  FOR r IN
    SELECT ts.transform_id, ts.ordinal, ts.source_schema, ts.source_name, n.nspname, c.relname
      FROM "trellis".transform_sources ts
      JOIN pg_class c ON c.oid = ts.source_oid JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE (n.nspname, c.relname) IS DISTINCT FROM (ts.source_schema, ts.source_name)
     ORDER BY ts.transform_id, ts.ordinal
  LOOP
    path := CASE WHEN r.ordinal = 0 THEN ARRAY['ast', 'from'] ELSE ARRAY['ast', 'joins', (r.ordinal - 1)::text] END;
    SELECT t.spec INTO new_spec FROM "trellis".transforms t WHERE t.id = r.transform_id FOR UPDATE;
    IF new_spec #>> (path || 'alias'::text) IS NULL THEN
      new_spec := jsonb_set(new_spec, path || 'alias'::text, to_jsonb(r.source_name::text));
    END IF;
    new_spec := jsonb_set(new_spec, path || 'schema'::text, to_jsonb(r.nspname::text));
    new_spec := jsonb_set(new_spec, path || 'name'::text, to_jsonb(r.relname::text));
    UPDATE "trellis".transforms t
       SET spec = new_spec, statement = "trellis".render_statement(new_spec->'ast'), updated_at = now()
     WHERE t.id = r.transform_id;
    UPDATE "trellis".transform_sources ts SET source_schema = r.nspname, source_name = r.relname
     WHERE ts.transform_id = r.transform_id AND ts.ordinal = r.ordinal;
    RETURN NEXT (SELECT t.target_name::text FROM "trellis".transforms t WHERE t.id = r.transform_id);
  END LOOP;
END
$fn$;
$trellis_m9$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 10) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (10, 'widen_wait', false);
    EXECUTE $trellis_m10$-- What a backfill waits on after capture of a source widens (ADR 0009).
--
-- A widen replaces the UPDATE trigger's function and takes no lock on the source, so a
-- transaction that already held a writer lock on the source when the widen committed may
-- still run the older function (cached in its session) and miss a change to a newly
-- captured column. A backfill of a transform reading such a column waits for exactly
-- those transactions, recorded here, instead of for every transaction older than the
-- widen in the whole cluster (ready_xmax, which this version no longer sets: a value an
-- older version set is still honoured).
ALTER TABLE "trellis".sources
  -- When capture last widened while that wait is open; NULL when nothing is waited on.
  ADD COLUMN widened_at timestamptz,
  -- The columns the widens being waited on added.
  ADD COLUMN widen_columns name[],
  -- The transactions waited on, [{vxid, pid}] as pg_locks shows them (pid null for a
  -- prepared transaction): those holding a lock of ROW EXCLUSIVE or stronger on the source
  -- or one of its partitions or inheritance children just after the widen committed. NULL until the staging worker
  -- has looked (its first pass after the widen).
  ADD COLUMN widen_holders jsonb;
$trellis_m10$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 11) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (11, 'quarantine', false);
    EXECUTE $trellis_m11$-- Quarantine per address (issue #9, ADR 0010): a key whose re-derivation fails is held at
-- the narrowest address that explains the failure. `column_name` is the target column
-- whose expression failed for the row ('' when no single column explains it: the key is
-- then held for the whole transform). A key held for a column still flows: its row is
-- written with every other column, and that column keeps its last value.
ALTER TABLE "trellis".held_keys ADD COLUMN column_name name NOT NULL DEFAULT '';
ALTER TABLE "trellis".held_keys DROP CONSTRAINT held_keys_pkey;
ALTER TABLE "trellis".held_keys ADD PRIMARY KEY (transform_id, source_id, key, column_name);
-- Samples page through an address's keys in (source, key) order.
CREATE INDEX held_keys_by_address ON "trellis".held_keys (transform_id, column_name, source_id, key);

-- A key as Trellis renders it everywhere (status, samples, logs, releaseKey): a one-column
-- key as its text, a wider one as its text[] literal ('{1,abc}'), as the ledger holds it.
CREATE FUNCTION "trellis".render_key(key text[])
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
  SELECT CASE WHEN cardinality(key) = 1 THEN key[1] ELSE key::text END
$fn$;

-- What RESUME does first for a transform stopped by a capture failure (of any kind): bind
-- its statement to its sources again (see _rebind in 0009). Later migrations add kinds.
CREATE FUNCTION "trellis"._resume_stopped(t "trellis".transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM "trellis"._rebind(t);
END
$fn$;

-- RESUME, as before (0006), and: a transform stopped by a capture failure is bound to its
-- sources again and rebuilt (_resume_stopped); RESUME of a column also releases the keys held for it (the
-- rebuild re-derives them), and RESUME of a transform retries the keys held for it and for
-- each of its columns.
CREATE OR REPLACE FUNCTION "trellis"._resume(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  addresses text[] := '{}';
BEGIN
  IF ast->>'column' IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM "trellis".transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'column') THEN
    PERFORM "trellis"._fail('TRN01', format('transform %I has no column %I', t.target_name, ast->>'column'));
  END IF;
  IF ast->>'column' IS NULL AND t.paused_at IS NOT NULL THEN
    -- A transform that stopped on a capture failure or disruption (whoever paused it) is
    -- bound to its sources again, and resumes through a rebuild: the ledger could not have
    -- covered what happened. Any other resumes from where it stopped.
    IF t.capture_failure IS NOT NULL THEN
      PERFORM "trellis"._resume_stopped(t);
    END IF;
    addresses := addresses || t.target_name::text;
    UPDATE "trellis".transforms SET paused_at = NULL, pause_reason = NULL, updated_at = now() WHERE id = t.id;
    IF t.capture_failure IS NOT NULL OR t.pause_reason IN ('capture_failure', 'disruption') THEN
      PERFORM "trellis"._request_rebuild(t.id);
    ELSIF t.pause_reason = 'build_failure' THEN
      -- The cause was fixed: the build gets its attempts afresh, starting now.
      UPDATE "trellis".pipeline SET build_attempts = 0, build_next_at = NULL WHERE transform_id = t.id;
    END IF;
  END IF;
  WITH resumed AS (
    UPDATE "trellis".transform_columns SET paused_at = NULL, pause_reason = NULL
     WHERE transform_id = t.id AND paused_at IS NOT NULL
       AND (ast->>'column' IS NULL OR name = ast->>'column')
    RETURNING name)
  SELECT addresses || coalesce(array_agg(t.target_name || '.' || name ORDER BY name), '{}')
    INTO addresses FROM resumed;
  -- A paused column was left as it was while its rows changed: rebuild to catch it up.
  IF EXISTS (SELECT 1 FROM unnest(addresses) a WHERE a LIKE '%.%' AND a <> t.target_name::text) THEN
    PERFORM "trellis"._request_rebuild(t.id);
  END IF;
  IF ast->>'column' IS NOT NULL THEN
    DELETE FROM "trellis".held_keys h WHERE h.transform_id = t.id AND h.column_name = ast->>'column';
  ELSE
    -- Held keys are tried again: they go back into the ledger as changes of this transaction.
    WITH released AS (
      DELETE FROM "trellis".held_keys h WHERE h.transform_id = t.id RETURNING h.source_id, h.key)
    INSERT INTO "trellis".ledger (gen, source_id, xid, keys)
    SELECT "trellis".ledger_generation(x.xid), r.source_id, x.xid,
           ARRAY[CASE WHEN cardinality(r.key) = 1 THEN r.key[1] ELSE r.key::text END]
      FROM (SELECT DISTINCT source_id, key FROM released) r,
           (SELECT pg_current_xact_id()::text::bigint AS xid) x;
  END IF;
  RETURN jsonb_build_object('kind', 'resumed', 'addresses', to_jsonb(addresses));
END
$fn$;

-- How many keys one address may hold before it pauses itself (pause_reason 'quarantine')
-- instead of holding keys without end. Instance-wide: every drain of the instance applies
-- the same. Handles set it with the connect option `quarantineThreshold`.
ALTER TABLE "trellis".config ADD COLUMN quarantine_threshold int NOT NULL DEFAULT 100
  CHECK (quarantine_threshold > 0);

-- Holds `key` of source `source_id` for `transform_id` at `column_name` ('' for the whole
-- transform), and pauses the address once it holds quarantine_threshold keys: a column
-- pauses (its rows flow on without it), a transform pauses whole. Returns whether it
-- paused.
CREATE FUNCTION "trellis"._hold_key(p_transform_id int, p_source_id int, p_key text[],
                                   p_column name, p_error text, p_sqlstate text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  threshold int := (SELECT quarantine_threshold FROM "trellis".config);
  held bigint;
BEGIN
  INSERT INTO "trellis".held_keys (transform_id, source_id, key, column_name, error, sqlstate)
  VALUES (p_transform_id, p_source_id, p_key, p_column, p_error, p_sqlstate)
  ON CONFLICT (transform_id, source_id, key, column_name)
    DO UPDATE SET error = EXCLUDED.error, sqlstate = EXCLUDED.sqlstate, held_at = now();
  SELECT count(*) INTO held FROM "trellis".held_keys
   WHERE transform_id = p_transform_id AND column_name = p_column;
  IF held < threshold THEN
    RETURN false;
  END IF;
  IF p_column = '' THEN
    UPDATE "trellis".transforms SET paused_at = now(), pause_reason = 'quarantine', updated_at = now()
     WHERE id = p_transform_id AND paused_at IS NULL;
  ELSE
    UPDATE "trellis".transform_columns SET paused_at = now(), pause_reason = 'quarantine'
     WHERE transform_id = p_transform_id AND name = p_column AND paused_at IS NULL;
  END IF;
  RETURN FOUND;
END
$fn$;
$trellis_m11$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 12) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (12, 'capture_disruptions', false);
    EXECUTE $trellis_m12$-- Capture disruptions (issue #9, ADR 0010): capture changed outside Trellis. The staging
-- worker compares what is installed with what it installed: each of the four triggers on
-- the source and on every partition or child that has capture (present, ENABLE ALWAYS, on
-- the function Trellis made), and the functions' source, whose digest is kept here.
ALTER TABLE "trellis".sources ADD COLUMN capture_digest text;

-- The digest of a source's four capture functions as they are now (NULL when one is gone).
CREATE FUNCTION "trellis"._capture_digest(p_source_id int)
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT CASE WHEN count(*) = 4 THEN md5(string_agg(p.prosrc || coalesce(array_to_string(p.proconfig, ','), ''), '|' ORDER BY p.proname)) END
    FROM pg_proc p
   WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = 'trellis')
     AND p.proname IN (format('capture_%s_insert', p_source_id), format('capture_%s_update', p_source_id),
                       format('capture_%s_delete', p_source_id), format('capture_%s_truncate', p_source_id))
$fn$;
$trellis_m12$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 13) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (13, 'partition_corrections', false);
    EXECUTE $trellis_m13$-- Rows that arrive or leave without DML (issue #9, ADR 0010): ATTACH PARTITION, DETACH
-- PARTITION, INHERIT / NO INHERIT, DROP of a partition. The staging worker keeps the
-- members of each captured source (its partitions and children at every level) and,
-- when they change, re-derives the keys of the rows that came or went (a correction).

-- A captured source's members as the staging worker last saw them. `members_at` on
-- sources says when they were first recorded (before that there is nothing to compare).
ALTER TABLE "trellis".sources ADD COLUMN members_at timestamptz;
CREATE TABLE "trellis".source_members (
  source_id int NOT NULL REFERENCES "trellis".sources ON DELETE CASCADE,
  relid oid NOT NULL,
  PRIMARY KEY (source_id, relid)
);

-- A node whose rows came (attached) or went (detached) while capture saw nothing: its
-- keys go into the ledger chunk by chunk, as changes of the source, in key order after
-- `position`; `keys_total` is an estimate (NULL until counted).
CREATE TABLE "trellis".corrections (
  source_id int NOT NULL REFERENCES "trellis".sources ON DELETE CASCADE,
  relid oid NOT NULL,
  -- schema.table of the node, for status() (the table may be renamed later).
  node text NOT NULL,
  since timestamptz NOT NULL DEFAULT now(),
  keys_total bigint,
  keys_done bigint NOT NULL DEFAULT 0,
  position text[],
  PRIMARY KEY (source_id, relid)
);

-- The partitions and children of a table at every level (not the table itself).
CREATE FUNCTION "trellis"._descendants(rel oid)
RETURNS SETOF oid LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE tree(relid) AS (
    SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = rel
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
  SELECT relid FROM tree
$fn$;

-- Records a source's members as they are now (at install, under its lock).
CREATE FUNCTION "trellis"._record_members(p_source_id int)
RETURNS void LANGUAGE sql AS $fn$
  DELETE FROM "trellis".source_members WHERE source_id = p_source_id;
  INSERT INTO "trellis".source_members (source_id, relid)
  SELECT src.id, d FROM "trellis".sources src, "trellis"._descendants(src.source_oid) d
   WHERE src.id = p_source_id;
  UPDATE "trellis".sources SET members_at = now() WHERE id = p_source_id;
$fn$;

-- Whether every source of a transform has its rows where capture last saw them: members
-- unchanged since the staging worker last looked, and no correction left to queue. A
-- watermark covers a transform only then (an ATTACH committed before the token may not
-- have been noticed yet).
CREATE FUNCTION "trellis"._sources_settled(p_transform_id int)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT NOT EXISTS (
    SELECT 1 FROM "trellis".transform_sources ts
      JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = p_transform_id
       AND (EXISTS (SELECT 1 FROM "trellis".corrections c WHERE c.source_id = src.id)
            OR (src.members_at IS NOT NULL AND EXISTS (
                  (SELECT d FROM "trellis"._descendants(src.source_oid) d
                   EXCEPT SELECT m.relid FROM "trellis".source_members m WHERE m.source_id = src.id)
                  UNION ALL
                  (SELECT m.relid FROM "trellis".source_members m WHERE m.source_id = src.id
                   EXCEPT SELECT d FROM "trellis"._descendants(src.source_oid) d)))))
$fn$;
$trellis_m13$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 14) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (14, 'halts', false);
    EXECUTE $trellis_m14$-- Halts (issue #9, ADR 0010): a target changed outside Trellis so the drain cannot keep it
-- (dropped, a column of it dropped, renamed or retyped, its key or its guard trigger
-- removed). The transform stops (captureFailure kind 'halt') with a sentence saying what
-- happened; RESUME repairs what it can and rebuilds, or refuses saying what to do.

-- Every live problem with a transform's target, one row per transform: the first problem
-- as a sentence (and how many more), and the target columns involved.
CREATE FUNCTION "trellis"._target_problems()
RETURNS TABLE (transform_id int, error text, columns text[]) LANGUAGE sql STABLE AS $fn$
  WITH targets AS (
    SELECT t.id, t.target_oid, t.target_schema, t.target_name,
           quote_ident(t.target_schema) || '.' || quote_ident(t.target_name) AS display,
           EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.target_oid) AS present,
           p.deferred_ddl IS NOT NULL AS building
      FROM "trellis".transforms t JOIN "trellis".pipeline p ON p.transform_id = t.id
     WHERE t.capture_failure IS NULL),
  problems AS (
    SELECT id, 1 AS o, format('the target %s was dropped', display) AS error, NULL::text AS col
      FROM targets WHERE NOT present
    UNION ALL
    SELECT tg.id, 2,
           CASE WHEN a.attname IS NULL THEN format('column %I of the target %s was dropped or renamed', c.name, tg.display)
                ELSE format('column %I of the target %s changed type from %s to %s', c.name, tg.display,
                            c.type, format_type(a.atttypid, a.atttypmod)) END,
           c.name::text
      FROM targets tg
      JOIN "trellis".transform_columns c ON c.transform_id = tg.id
      LEFT JOIN pg_attribute a ON a.attrelid = tg.target_oid AND a.attname = c.name
                              AND a.attnum > 0 AND NOT a.attisdropped
     WHERE tg.present
       AND (a.attname IS NULL OR format_type(a.atttypid, a.atttypmod) <> c.type)
    UNION ALL
    SELECT id, 3, format('the guard trigger on the target %s was dropped or disabled (the app may have written it)', display), NULL
      FROM targets tg
     WHERE present AND NOT EXISTS (SELECT 1 FROM pg_trigger g
                                    WHERE g.tgrelid = tg.target_oid AND g.tgname = 'trellis_guard' AND g.tgenabled = 'A')
    UNION ALL
    SELECT id, 4, format('the key of the target %s was dropped', display), NULL
      FROM targets tg
     WHERE present AND NOT building
       AND NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = tg.target_oid AND (x.indisprimary OR x.indisunique)))
  SELECT id,
         (array_agg(error ORDER BY o, error))[1]
           || CASE WHEN count(*) > 1 THEN format(' (and %s more)', count(*) - 1) ELSE '' END,
         coalesce(array_agg(DISTINCT col) FILTER (WHERE col IS NOT NULL), '{}')
    FROM problems GROUP BY id
$fn$;

-- RESUME of a halted transform: the target is made again if it was dropped; a column
-- dropped from it, its key or its guard trigger is added back; a column renamed or
-- retyped is refused (the app's objects may use it as it is now): rename or alter it
-- back, or DROP TRANSFORM and define it again. The rebuild then fills the target.
CREATE FUNCTION "trellis"._repair_target(t "trellis".transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  qualified text := quote_ident(t.target_schema) || '.' || quote_ident(t.target_name);
  c "trellis".transform_columns;
  a record;
  keys text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = t.target_oid) THEN
    IF to_regclass(qualified) IS NOT NULL THEN
      PERFORM "trellis"._fail('TRC01', format(
        'transform %I cannot resume: its target was dropped, and %s is now another table: drop or rename that table, or DROP TRANSFORM',
        t.target_name, qualified));
    END IF;
    UPDATE "trellis".transforms
       SET target_oid = "trellis"._create_target(t.target_schema, t.target_name, t.spec), capture_failure = NULL
     WHERE id = t.id;
    RETURN;
  END IF;
  FOR c IN SELECT * FROM "trellis".transform_columns x WHERE x.transform_id = t.id ORDER BY x.ordinal LOOP
    SELECT attname, format_type(atttypid, atttypmod) AS type INTO a
      FROM pg_attribute WHERE attrelid = t.target_oid AND attname = c.name AND attnum > 0 AND NOT attisdropped;
    IF NOT FOUND THEN
      IF EXISTS (SELECT 1 FROM pg_attribute p WHERE p.attrelid = t.target_oid AND p.attnum > 0
                   AND NOT p.attisdropped
                   AND NOT EXISTS (SELECT 1 FROM "trellis".transform_columns y
                                    WHERE y.transform_id = t.id AND y.name = p.attname)) THEN
        PERFORM "trellis"._fail('TRC01', format(
          'transform %I cannot resume: column %I of its target is missing, and the target has columns Trellis did not make (was it renamed?): rename it back to %I, or DROP TRANSFORM and define it again',
          t.target_name, c.name, c.name));
      END IF;
      EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s%s', qualified, c.name, c.type,
                     coalesce(' COLLATE ' || c.collation_name, ''));
    ELSIF a.type <> c.type THEN
      PERFORM "trellis"._fail('TRC01', format(
        'transform %I cannot resume: column %I of its target is %s, not %s: alter it back, or DROP TRANSFORM and define it again',
        t.target_name, c.name, a.type, c.type));
    END IF;
  END LOOP;
  IF NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = t.target_oid AND (x.indisprimary OR x.indisunique)) THEN
    keys := (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k);
    -- The rebuild empties the target first: the key can be added at once. (As Trellis:
    -- the guard, if it is there, lets only Trellis write.)
    PERFORM set_config('trellis.maintaining', 'trellis', true);
    EXECUTE 'TRUNCATE ' || qualified;
    IF keys IS NULL THEN
      EXECUTE 'CREATE UNIQUE INDEX ON ' || qualified || ' ((true))';
    ELSIF (t.spec->>'key_nullable')::boolean THEN
      EXECUTE 'ALTER TABLE ' || qualified || ' ADD UNIQUE NULLS NOT DISTINCT (' || keys || ')';
    ELSE
      EXECUTE 'ALTER TABLE ' || qualified || ' ADD PRIMARY KEY (' || keys || ')';
    END IF;
  END IF;
  EXECUTE 'DROP TRIGGER IF EXISTS trellis_guard ON ' || qualified;
  EXECUTE 'CREATE TRIGGER trellis_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON '
    || qualified || ' FOR EACH STATEMENT EXECUTE FUNCTION "trellis".guard_target()';
  EXECUTE 'ALTER TABLE ' || qualified || ' ENABLE ALWAYS TRIGGER trellis_guard';
  UPDATE "trellis".transforms SET capture_failure = NULL WHERE id = t.id;
END
$fn$;

CREATE OR REPLACE FUNCTION "trellis"._resume_stopped(t "trellis".transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  IF t.capture_failure->>'kind' = 'halt' THEN
    PERFORM "trellis"._repair_target(t);
  ELSE
    PERFORM "trellis"._rebind(t);
  END IF;
END
$fn$;
$trellis_m14$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 15) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (15, 'waits_and_writer_grants', false);
    EXECUTE $trellis_m15$-- Issue #8, items 9-11. What lets an idle instance cost next to nothing (ADR 0012):
-- convergence judged from the ledger rather than from a newer tick (so no tick is taken
-- while nothing is written; awaitConverged, ADR 0011), idle cursors moved together, and
-- workers that wait for work inside one statement instead of polling with a statement (a
-- commit) each time. And grant_writer() (ADR 0013): what a role that writes captured
-- tables needs, and nothing more.

-- Whether transform p_transform reflects every captured write `p_token` sees: it is past
-- its backfill, not paused, and no ledger row of its sources belongs to a transaction the
-- token sees and its cursor's tick does not. Such a row would still be waiting to be
-- applied; every row the tick sees has been (the cursor moves past a segment only once
-- its keys are re-derived, from a state at least as new). When the tick sees everything
-- the token sees, the ledger is not read at all. Custom plans: the snapshots' bounds
-- decide whether the ledger's BRIN index pays.
CREATE FUNCTION "trellis"._converged(p_transform int, p_token pg_snapshot)
RETURNS boolean LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
  cur pg_snapshot;
BEGIN
  SELECT k.snap INTO cur
    FROM "trellis".pipeline p
    JOIN "trellis".transforms t ON t.id = p.transform_id
    JOIN "trellis".ticks k ON k.seq = p.cursor_tick
   WHERE p.transform_id = p_transform AND t.paused_at IS NULL
     AND p.phase IN ('catching_up', 'live');
  IF cur IS NULL THEN
    RETURN false;
  END IF;
  IF pg_snapshot_xmax(cur) >= pg_snapshot_xmax(p_token)
     AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(cur) x
                      WHERE x < pg_snapshot_xmax(p_token)
                        AND x NOT IN (SELECT pg_snapshot_xip(p_token))) THEN
    RETURN true;
  END IF;
  RETURN NOT EXISTS (
    SELECT 1 FROM "trellis".ledger l
     WHERE l.source_id IN (SELECT src.id FROM "trellis".transform_sources ts
                             JOIN "trellis".sources src ON src.source_oid = ts.source_oid
                            WHERE ts.transform_id = p_transform)
       AND l.xid >= pg_snapshot_xmin(cur)::text::bigint
       AND l.xid < pg_snapshot_xmax(p_token)::text::bigint
       AND pg_visible_in_snapshot(l.xid::text::xid8, p_token)
       AND NOT pg_visible_in_snapshot(l.xid::text::xid8, cur));
END
$fn$;

-- Whether the staging worker should take a tick now: there is none yet; or captured
-- changes have committed that the newest tick does not see; or, at most every
-- p_keepalive_ms, a transform waits for a newer tick to move on (a backfill waiting for
-- its start tick T0, a finished backfill waiting to go live). With nothing written and
-- nothing waiting, no tick is taken: idle cursors have nothing to move over.
CREATE FUNCTION "trellis"._tick_needed(p_keepalive_ms int)
RETURNS boolean LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
  last_seq bigint;
  last_snap pg_snapshot;
  last_at timestamptz;
BEGIN
  SELECT seq, snap, at INTO last_seq, last_snap, last_at
    FROM "trellis".ticks ORDER BY seq DESC LIMIT 1;
  IF last_seq IS NULL THEN
    RETURN true;
  END IF;
  -- Rows of transactions still running are invisible here and wait for a later tick.
  IF EXISTS (SELECT 1 FROM "trellis".ledger l
              WHERE l.xid >= pg_snapshot_xmin(last_snap)::text::bigint
                AND NOT pg_visible_in_snapshot(l.xid::text::xid8, last_snap)) THEN
    RETURN true;
  END IF;
  RETURN last_at < clock_timestamp() - make_interval(secs => p_keepalive_ms / 1000.0)
     AND "trellis"._waiting_for_tick();
END
$fn$;

-- Some transform can move on only once a newer tick exists (see _tick_needed).
CREATE FUNCTION "trellis"._waiting_for_tick()
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT EXISTS (
    SELECT 1 FROM "trellis".pipeline p JOIN "trellis".transforms t ON t.id = p.transform_id
     WHERE t.paused_at IS NULL
       AND (p.phase = 'waiting_to_backfill'
            OR (p.phase = 'catching_up' AND p.open_lo IS NULL
                AND p.cursor_tick >= (SELECT max(seq) FROM "trellis".ticks))))
$fn$;

-- What the staging worker's reconcile pass reads, as one text: when it changes, the pass
-- runs. Trellis's catalog (transforms and their columns, their sources, captured
-- sources); of every source, its pg_class row (present, renamed, moved), columns (added,
-- dropped, renamed, retyped) and indexes (the primary key), and its partitions and
-- inheritance children at every level (created, attached, detached) with their triggers
-- (capture installed, removed, disabled); of every target, the same (dropped, a column
-- changed, its key or guard trigger removed: a halt, 0014); and the functions in this
-- schema (a capture function replaced). A row changed gets a new xmin, which changes the
-- sum of xmins (whatever the xid wraparound); a row removed or added changes a count.
-- VACUUM and ANALYZE update pg_class in place (and freezing keeps the raw xmin): they
-- change nothing here.
CREATE FUNCTION "trellis"._capture_fingerprint()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE src(oid) AS (SELECT DISTINCT source_oid FROM "trellis".transform_sources),
  tree(relid) AS (
    SELECT oid FROM src
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  rel(oid) AS (SELECT relid FROM tree UNION SELECT target_oid FROM "trellis".transforms)
  SELECT concat_ws('/',
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transforms),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transform_columns),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transform_sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".sources),
    (SELECT count(*) || ':' || coalesce(sum(c.xmin::text::bigint), 0)
       FROM pg_class c WHERE c.oid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(a.xmin::text::bigint), 0)
       FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM rel) AND a.attnum > 0),
    (SELECT count(*) || ':' || coalesce(sum(x.xmin::text::bigint), 0)
       FROM pg_index x WHERE x.indrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(g.xmin::text::bigint), 0)
       FROM pg_trigger g WHERE g.tgrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(p.xmin::text::bigint), 0)
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname = 'trellis'))
$fn$;

-- Something the staging worker's reconcile pass must come back to soon, whatever else
-- changes: a backfill not started yet, a widen whose writers it waits out (ADR 0009), or a
-- correction whose keys it puts into the ledger chunk by chunk (0013, ADR 0010).
CREATE FUNCTION "trellis"._capture_pending()
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT EXISTS (SELECT 1 FROM "trellis".sources WHERE widened_at IS NOT NULL)
      OR EXISTS (SELECT 1 FROM "trellis".corrections)
      OR EXISTS (SELECT 1 FROM "trellis".pipeline p JOIN "trellis".transforms t ON t.id = p.transform_id
                  WHERE p.phase = 'waiting_to_backfill' AND t.paused_at IS NULL)
$fn$;

-- The oldest cursor of any transform: what ledger maintenance can free depends on it
-- (src/engine/staging/ledger-maintenance.ts).
CREATE FUNCTION "trellis"._cursor_floor()
RETURNS bigint LANGUAGE sql STABLE AS $fn$
  SELECT min(cursor_tick) FROM "trellis".pipeline WHERE cursor_tick IS NOT NULL
$fn$;

-- The staging worker's wait: returns 'tick' as soon as a tick is needed, 'capture' as
-- soon as what capture depends on differs from p_fingerprint, 'maintain' (when
-- p_watch_floor) as soon as the oldest cursor differs from p_floor, or 'timeout' after
-- p_timeout_ms. It looks again only when some transaction has committed since (the
-- current snapshot changed), or while a transform waits for a tick (which time alone can
-- bring), so an idle database costs a snapshot and a sleep per look. It looks every
-- p_poll_ms for its first p_fast_ms, then less and less often, up to every p_max_poll_ms:
-- right after work, more tends to follow; a long idle stretch costs few wake-ups. The
-- whole wait is one statement, one commit.
CREATE FUNCTION "trellis"._await_staging_work(
  p_fingerprint text, p_floor bigint, p_watch_floor boolean, p_keepalive_ms int,
  p_timeout_ms int, p_poll_ms int, p_max_poll_ms int, p_fast_ms int)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
  started timestamptz := clock_timestamp();
  deadline timestamptz := started + make_interval(secs => p_timeout_ms / 1000.0);
  slow_from timestamptz := started + make_interval(secs => p_fast_ms / 1000.0);
  pause float8 := p_poll_ms;
  seen text;
  now_snap text;
  timed boolean := false;
  slept text;
BEGIN
  LOOP
    now_snap := pg_current_snapshot()::text;
    IF seen IS NULL OR now_snap <> seen OR timed THEN
      IF "trellis"._tick_needed(p_keepalive_ms) THEN
        RETURN 'tick';
      END IF;
      IF "trellis"._capture_fingerprint() IS DISTINCT FROM p_fingerprint THEN
        RETURN 'capture';
      END IF;
      IF p_watch_floor AND "trellis"._cursor_floor() IS DISTINCT FROM p_floor THEN
        RETURN 'maintain';
      END IF;
      timed := "trellis"._waiting_for_tick();
      seen := now_snap;
    END IF;
    EXIT WHEN clock_timestamp() >= deadline;
    -- An assignment, not PERFORM: a simple expression, no executor run per look.
    slept := pg_sleep(least(pause, greatest(1, extract(epoch FROM deadline - clock_timestamp()) * 1000)) / 1000.0)::text;
    IF clock_timestamp() >= slow_from THEN
      pause := least(p_max_poll_ms, pause * 1.5);
    END IF;
  END LOOP;
  RETURN 'timeout';
END
$fn$;

-- Whether any drain work is waiting: an open page, a transform behind the newest tick, or
-- a backfill. clock_timestamp(), not now(): it is checked again and again within one
-- statement by _await_drain_work.
CREATE FUNCTION "trellis"._has_drain_work()
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT EXISTS (SELECT 1 FROM "trellis".pages p JOIN "trellis".transforms t ON t.id = p.transform_id
                  WHERE t.paused_at IS NULL AND (p.not_before IS NULL OR p.not_before <= clock_timestamp()))
      OR EXISTS (SELECT 1 FROM "trellis".pipeline p JOIN "trellis".transforms t ON t.id = p.transform_id
                  WHERE t.paused_at IS NULL
                    AND ((p.phase IN ('catching_up', 'live') AND p.open_lo IS NULL
                          AND p.cursor_tick < (SELECT max(seq) FROM "trellis".ticks))
                         OR (p.phase = 'backfilling'
                             AND (p.build_next_at IS NULL OR p.build_next_at <= clock_timestamp()))))
$fn$;

-- When work that waits for a time (a page or build retried with backoff) comes due next.
CREATE FUNCTION "trellis"._next_drain_due()
RETURNS timestamptz LANGUAGE sql STABLE AS $fn$
  SELECT least(
    (SELECT min(p.not_before) FROM "trellis".pages p JOIN "trellis".transforms t ON t.id = p.transform_id
      WHERE t.paused_at IS NULL AND p.not_before > clock_timestamp()),
    (SELECT min(p.build_next_at) FROM "trellis".pipeline p JOIN "trellis".transforms t ON t.id = p.transform_id
      WHERE t.paused_at IS NULL AND p.phase = 'backfilling' AND p.build_next_at > clock_timestamp()))
$fn$;

-- A drain loop's wait: true as soon as there is drain work, false after p_timeout_ms.
-- Looks again only when some transaction has committed since the last look, or when
-- work retried with backoff comes due; p_poll_ms apart for p_fast_ms, then less and less
-- often, up to p_max_poll_ms (see _await_staging_work).
CREATE FUNCTION "trellis"._await_drain_work(
  p_timeout_ms int, p_poll_ms int, p_max_poll_ms int, p_fast_ms int)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  started timestamptz := clock_timestamp();
  deadline timestamptz := started + make_interval(secs => p_timeout_ms / 1000.0);
  slow_from timestamptz := started + make_interval(secs => p_fast_ms / 1000.0);
  pause float8 := p_poll_ms;
  seen text;
  now_snap text;
  due timestamptz;
  slept text;
BEGIN
  LOOP
    now_snap := pg_current_snapshot()::text;
    IF seen IS NULL OR now_snap <> seen OR clock_timestamp() >= due THEN
      IF "trellis"._has_drain_work() THEN
        RETURN true;
      END IF;
      due := "trellis"._next_drain_due();
      seen := now_snap;
    END IF;
    EXIT WHEN clock_timestamp() >= deadline;
    slept := pg_sleep(least(pause, greatest(1, extract(epoch FROM deadline - clock_timestamp()) * 1000)) / 1000.0)::text;
    IF clock_timestamp() >= slow_from THEN
      pause := least(p_max_poll_ms, pause * 1.5);
    END IF;
  END LOOP;
  RETURN false;
END
$fn$;

-- Grants `role` what writing to captured tables needs, and nothing more: the capture
-- triggers run as the writing role and insert its changes straight into the ledger's
-- partitions. So: USAGE on this schema, and INSERT on each ledger partition (no SELECT,
-- no UPDATE or DELETE, nothing on the catalog). Callable from a migration; run it as the
-- role that owns Trellis's schema (the one that migrated).
CREATE FUNCTION "trellis".grant_writer(role regrole)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  part regclass;
BEGIN
  IF role IS NULL THEN
    RAISE EXCEPTION 'grant_writer needs a role' USING ERRCODE = 'TRV01';
  END IF;
  -- GRANT without the grant option only warns and grants nothing: refuse instead.
  IF NOT has_schema_privilege('trellis', 'USAGE WITH GRANT OPTION') THEN
    RAISE EXCEPTION 'grant_writer: role % cannot grant access to Trellis''s schema %',
      current_user, 'trellis'
      USING ERRCODE = '42501', HINT = 'Run it as the role that owns that schema (the one that migrated).';
  END IF;
  EXECUTE format('GRANT USAGE ON SCHEMA %I TO %s', 'trellis', role);
  FOR part IN
    SELECT h.inhrelid::regclass FROM pg_inherits h
     WHERE h.inhparent = format('%I.ledger', 'trellis')::regclass
     ORDER BY 1
  LOOP
    IF NOT has_table_privilege(part, 'INSERT WITH GRANT OPTION') THEN
      RAISE EXCEPTION 'grant_writer: role % cannot grant INSERT on %', current_user, part
        USING ERRCODE = '42501', HINT = 'Run it as the role that owns Trellis''s schema (the one that migrated).';
    END IF;
    EXECUTE format('GRANT INSERT ON %s TO %s', part, role);
  END LOOP;
END
$fn$;

-- Moves, in one statement per cursor position, the cursor of every transform that has
-- nothing to apply up to the newest tick: live (or catching up, which then goes live),
-- not paused, no range open, and no ledger row of its sources in the range. Without
-- this, each tick would take a transaction per transform that has nothing to do (one at
-- a time: a write to one table made every other transform move its cursor alone).
-- Transforms another drain holds are skipped (SKIP LOCKED); one whose row changed since
-- this statement's snapshot is checked again on its newest version, as FOR UPDATE does.
-- Returns how many moved.
CREATE FUNCTION "trellis"._advance_idle_cursors()
RETURNS int LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
  hi_seq bigint;
  hi_snap pg_snapshot;
  lo record;
  moved int := 0;
  n int;
BEGIN
  SELECT seq, snap INTO hi_seq, hi_snap FROM "trellis".ticks ORDER BY seq DESC LIMIT 1;
  IF hi_seq IS NULL THEN
    RETURN 0;
  END IF;
  FOR lo IN
    SELECT k.seq, k.snap FROM "trellis".ticks k
     WHERE k.seq IN (SELECT p.cursor_tick
                       FROM "trellis".pipeline p JOIN "trellis".transforms t ON t.id = p.transform_id
                      WHERE p.phase IN ('catching_up', 'live') AND t.paused_at IS NULL
                        AND p.open_lo IS NULL AND p.cursor_tick < hi_seq)
     ORDER BY k.seq
  LOOP
    WITH changed AS (
      SELECT DISTINCT l.source_id FROM "trellis".ledger l
       WHERE l.xid >= pg_snapshot_xmin(lo.snap)::text::bigint
         AND l.xid < pg_snapshot_xmax(hi_snap)::text::bigint
         AND pg_visible_in_snapshot(l.xid::text::xid8, hi_snap)
         AND NOT pg_visible_in_snapshot(l.xid::text::xid8, lo.snap)),
    idle AS (
      SELECT p.transform_id
        FROM "trellis".pipeline p JOIN "trellis".transforms t ON t.id = p.transform_id
       WHERE p.cursor_tick = lo.seq AND p.phase IN ('catching_up', 'live')
         AND t.paused_at IS NULL AND p.open_lo IS NULL
         AND NOT EXISTS (
           SELECT 1 FROM "trellis".transform_sources ts
             JOIN "trellis".sources src ON src.source_oid = ts.source_oid
            WHERE ts.transform_id = p.transform_id
              AND src.id IN (SELECT source_id FROM changed))
         FOR UPDATE OF p SKIP LOCKED)
    UPDATE "trellis".pipeline p
       SET cursor_tick = hi_seq,
           live_since = CASE WHEN p.phase = 'catching_up' THEN now() ELSE p.live_since END,
           phase = CASE WHEN p.phase = 'catching_up' THEN 'live' ELSE p.phase END,
           updated_at = now()
      FROM idle
     WHERE p.transform_id = idle.transform_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    moved := moved + n;
  END LOOP;
  RETURN moved;
END
$fn$;
$trellis_m15$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 16) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (16, 'schema_dumps', false);
    EXECUTE $trellis_m16$-- Schema dumps (issue #13, ADR 0022). A schema-only pg_dump carries Trellis's schema, the
-- targets and the capture triggers, but no rows: loaded into a new database it has targets
-- and no transforms. The SQL dumpDefinitionsSql() appends registers each definition again
-- with restore_definition(), in the order they were defined, so the worker that starts on
-- the loaded database builds them. Only definitions are restored: the ledger, progress,
-- pauses, quarantine and claims are runtime state, and every restored transform starts at
-- waiting_to_backfill.

-- Capture left behind by the dumped database: triggers calling, and functions named for, a
-- source this catalog does not know (the dump's sources rows are runtime state, not
-- dumped). They would write ledger rows under ids that now mean other tables; the staging
-- worker installs capture afresh for every source a transform reads.
CREATE FUNCTION "trellis"._drop_stale_capture()
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT tg.tgname, tg.tgrelid::regclass::text AS rel
      FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
     WHERE NOT tg.tgisinternal
       AND p.pronamespace = quote_ident('trellis')::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate)$'
       AND NOT EXISTS (SELECT 1 FROM "trellis".sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
  END LOOP;
  FOR r IN
    SELECT p.oid::regprocedure::text AS fn
      FROM pg_proc p
     WHERE p.pronamespace = quote_ident('trellis')::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate)$'
       AND NOT EXISTS (SELECT 1 FROM "trellis".sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE 'DROP FUNCTION ' || r.fn;
  END LOOP;
END
$fn$;

-- Key maps of transforms this catalog does not have (the dumped database's ids): a restored
-- transform gets a new id, whose map_<id> name the dump may already use.
CREATE FUNCTION "trellis"._drop_stale_key_maps()
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT c.relname FROM pg_class c
     WHERE c.relnamespace = quote_ident('trellis')::regnamespace AND c.relkind = 'r'
       AND c.relname ~ '^map_[0-9]+$'
       AND NOT EXISTS (SELECT 1 FROM "trellis".transforms t
                        WHERE t.id = substring(c.relname FROM '^map_([0-9]+)$')::int)
  LOOP
    EXECUTE 'DROP TABLE ' || quote_ident('trellis') || '.' || quote_ident(r.relname);
  END LOOP;
END
$fn$;

-- Registers a dumped definition again: `statement` as the catalog held it, resolved with
-- the search_path it was defined under. The target the dump created is kept (with the
-- app's indexes, grants and the views that read it) when its columns are the ones the
-- definition gives now; without one, the target is created. The transform starts at
-- waiting_to_backfill, and its backfill empties the target first. A transform already
-- registered with the same statement is left as it is (a file loaded twice); with another
-- statement, the call fails (conflict).
-- Returns {"kind": "transform_restored" | "unchanged", "target"}.
CREATE FUNCTION "trellis".restore_definition(statement text, search_path text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  old_path text := current_setting('search_path');
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
  ast jsonb;
  tname text;
  existing "trellis".transforms;
  dumped oid;
  aside text;
  t "trellis".transforms;
  made text;
  kept text;
BEGIN
  IF tschema IS NULL THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the Trellis schema %I has no config row: load its migrations and config rows (dumpDefinitionsSql() writes them) first',
      'trellis'));
  END IF;
  ast := "trellis".parse_statement(statement);
  IF ast->>'kind' <> 'transform' THEN
    PERFORM "trellis"._fail('TRV01', 'restore_definition() takes a TRANSFORM statement');
  END IF;
  PERFORM pg_advisory_xact_lock(1953653104, hashtext('trellis'));
  tname := ast->'target'->>'name';
  SELECT * INTO existing FROM "trellis".transforms x
   WHERE x.target_schema = tschema AND x.target_name = tname;
  IF FOUND THEN
    IF existing.statement = restore_definition.statement THEN
      RETURN jsonb_build_object('kind', 'unchanged', 'target', tname);
    END IF;
    PERFORM "trellis"._fail('TRC01', format(
      'a transform named %I is already defined, with another statement: DROP TRANSFORM it first', tname));
  END IF;
  PERFORM "trellis"._drop_stale_capture();
  PERFORM "trellis"._drop_stale_key_maps();

  -- The dumped target moves aside while the statement is defined again (which makes a
  -- target of its own), then takes that one's place.
  dumped := to_regclass(quote_ident(tschema) || '.' || quote_ident(tname));
  IF dumped IS NOT NULL THEN
    aside := 'trellis_restoring_' || dumped::text;
    EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', tschema, tname, aside);
  END IF;
  PERFORM set_config('search_path', restore_definition.search_path, true);
  PERFORM "trellis"._define(ast, restore_definition.statement);
  PERFORM set_config('search_path', old_path, true);
  SELECT * INTO t FROM "trellis".transforms x WHERE x.target_schema = tschema AND x.target_name = tname;

  IF dumped IS NOT NULL THEN
    SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY a.attnum)
      INTO made FROM pg_attribute a WHERE a.attrelid = t.target_oid AND a.attnum > 0 AND NOT a.attisdropped;
    SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY a.attnum)
      INTO kept FROM pg_attribute a WHERE a.attrelid = dumped AND a.attnum > 0 AND NOT a.attisdropped;
    IF made IS DISTINCT FROM kept THEN
      PERFORM "trellis"._fail('TRC01', format(
        'the target %I.%I in this database has the columns (%s), but its definition gives (%s) here: the sources differ from the dumped database''s',
        tschema, tname, kept, made));
    END IF;
    EXECUTE 'DROP TABLE ' || t.target_oid::regclass::text;
    EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', tschema, aside, tname);
    UPDATE "trellis".transforms SET target_oid = dumped WHERE id = t.id RETURNING * INTO t;
    -- Its key and guard as Trellis makes them (the dump should have both).
    PERFORM "trellis"._repair_target(t);
  END IF;
  -- The backfill empties the target first: a dump with rows loads no stale ones.
  PERFORM "trellis"._request_rebuild(t.id);
  RETURN jsonb_build_object('kind', 'transform_restored', 'target', tname);
END
$fn$;
$trellis_m16$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 17) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (17, 'sql_reads', false);
    EXECUTE $trellis_m17$-- The catalog reads, callable from SQL: <schema>.status(target) RETURNS jsonb and
-- <schema>.definitions() RETURNS SETOF jsonb, for migrations and for people who live in
-- psql. Each returns exactly what the handle's status() and definitions() return, as JSON
-- (camelCase keys, times as ISO 8601 text): the handle calls these functions and only
-- turns the times into Dates, so the two cannot drift apart.
--
--   SELECT jsonb_pretty(trellis.status('customer_totals'));
--   SELECT d->>'target', d->>'statement' FROM trellis.definitions() d;

-- The sessions and prepared transactions a capture wait waits on: those holding or queued
-- for a lock in `p_modes` on the source `p_oid` (or a partition or inheritance child), in
-- this database; only the transactions `p_vxids` when given (a widen's recorded holders).
-- The staging worker's own session is not a blocker.
CREATE FUNCTION "trellis"._capture_wait_blockers(p_oid oid, p_modes text[], p_vxids text[])
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE tree(relid) AS (
    SELECT p_oid
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  locks AS (
    SELECT l.* FROM pg_locks l
     WHERE l.locktype = 'relation'
       AND l.relation IN (SELECT relid FROM tree)
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.mode = ANY (p_modes)
       AND (p_vxids IS NULL OR l.virtualtransaction = ANY (p_vxids))),
  sessions AS (
    SELECT DISTINCT ON (a.pid) a.pid, a.application_name, a.datname, a.state, a.xact_start,
           a.query_start, a.query
      FROM locks l JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.pid <> pg_backend_pid()
       -- the elected staging worker ("trst" advisory lock on this catalog schema)
       AND l.pid NOT IN (
         SELECT h.pid FROM pg_locks h
          WHERE h.locktype = 'advisory' AND h.granted AND h.classid = 1953657716::oid
            AND h.objid = ((hashtext('trellis')::bigint + 4294967296) % 4294967296)::oid)
     ORDER BY a.pid),
  -- A prepared transaction's locks have no pid: it is found by the transaction id lock it
  -- holds under the same virtual transaction id.
  prepared AS (
    SELECT DISTINCT ON (p.prepared, p.gid) p.gid, p.owner, p.database, p.prepared,
           p.transaction::text AS transaction
      FROM locks l
      JOIN pg_locks x ON x.locktype = 'transactionid' AND x.pid IS NULL
                     AND x.virtualtransaction = l.virtualtransaction
      JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
     WHERE l.pid IS NULL
     ORDER BY p.prepared, p.gid)
  SELECT jsonb_build_object(
    'blockers', coalesce((SELECT jsonb_agg(jsonb_build_object(
                   'pid', s.pid, 'applicationName', s.application_name, 'database', s.datname,
                   'state', s.state, 'xactStart', s.xact_start, 'queryStart', s.query_start,
                   'query', s.query) ORDER BY s.pid) FROM sessions s), '[]'),
    'prepared', coalesce((SELECT jsonb_agg(jsonb_build_object(
                   'gid', p.gid, 'owner', p.owner, 'database', p.database,
                   'prepared', p.prepared, 'transaction', p.transaction)
                   ORDER BY p.prepared, p.gid) FROM prepared p), '[]'))
$fn$;

-- Where a transform is (the handle's Status): lifecycle, held keys, paused columns, source
-- index gaps, corrections, failures, what capture waits on, backfill progress and lag.
-- Refuses an unknown transform with TRN01.
CREATE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
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
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
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
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.widened_at IS NOT NULL AND ts.read_columns && src.widen_columns
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
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
        'keysDone', p.backfill_done, 'keysTotal', p.backfill_total,
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)));
END
$fn$;

-- Every registered transform (the handle's Definition), one JSON object a row, by target.
CREATE FUNCTION "trellis".definitions()
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
               FROM "trellis".transform_sources s WHERE s.transform_id = t.id), '[]'),
           'columns', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'type', c.type, 'expression', c.expression,
                      'key', c.is_key, 'implicit', c.implicit)
                    ORDER BY c.ordinal)
               FROM "trellis".transform_columns c WHERE c.transform_id = t.id), '[]'),
           'options', jsonb_build_object('withoutSourceIndex', t.without_source_index),
           'aggregates', t.aggregates,
           'createdAt', t.created_at,
           'updatedAt', t.updated_at)
    FROM "trellis".transforms t
   ORDER BY t.target_name
$fn$;
$trellis_m17$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 18) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (18, 'self_checks', false);
    EXECUTE $trellis_m18$-- Self-checks (issue #11, ADR 0015): one row per transform for its latest check, so asking
-- again while one is unfinished returns it, and the next call after it finished replaces it
-- (the replaced job is gone: selfCheckJob returns null for it, as for a dropped transform,
-- whose row goes with it). The job itself runs on pg-boss, in the instance's jobs schema
-- (ADR 0014); its id is this row's id. What a row says is reconciled with pg-boss's own
-- state of the job when it is read (a worker that died mid-check leaves `running` here,
-- while pg-boss retries the job or gives up on it): see src/engine/selfcheck/read.ts.
CREATE TABLE "trellis".self_checks (
  id uuid PRIMARY KEY,
  transform_id int NOT NULL UNIQUE REFERENCES "trellis".transforms ON DELETE CASCADE,
  mode text NOT NULL CHECK (mode IN ('full', 'sample')),
  -- {sample, maxFindings, repair}: what was asked for.
  options jsonb NOT NULL,
  -- What the worker last recorded; queued until a worker takes it.
  state text NOT NULL DEFAULT 'queued'
    CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
  rows_compared bigint NOT NULL DEFAULT 0,
  -- Rows the check expects to compare (the target's row estimate, or the sample size).
  rows_total bigint,
  report jsonb,
  error text,
  -- How many times a worker has started it (pg-boss retries a check whose worker died).
  attempts int NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  finished_at timestamptz
);
$trellis_m18$;
  END IF;
  -- Postgres lets PUBLIC execute a new function: none of Trellis's is (ADR 0034), whichever
  -- migration made it. Only the owner calls them.
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
  INSERT INTO "trellis".config (target_schema) VALUES ('public')
    ON CONFLICT DO NOTHING;

  -- Background jobs (self-checks) run on pg-boss, in the schema trellis_jobs at pg-boss's
  -- schema version 24 (ADR 0014).
  IF to_regclass('trellis_jobs.migrations') IS NOT NULL THEN
    RAISE EXCEPTION 'schema trellis_jobs, where Trellis instance trellis keeps its jobs, holds another Trellis instance''s catalog: choose another catalog schema'
      USING ERRCODE = 'TRC01';
  END IF;
  IF to_regclass('trellis_jobs.version') IS NULL THEN
    EXECUTE $trellis_boss$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    
    CREATE SCHEMA IF NOT EXISTS trellis_jobs
  ;

    CREATE TYPE trellis_jobs.job_state AS ENUM (
      'created',
      'retry',
      'active',
      'completed',
      'cancelled',
      'failed'
    )
  ;

    CREATE TABLE trellis_jobs.version (
      version int primary key,
      maintained_on timestamp with time zone,
      cron_on timestamp with time zone,
      monitored_on timestamp with time zone
    )
  ;

    CREATE TABLE trellis_jobs.queue (
      name text,
      policy text,
      retry_limit int,
      retry_delay int,
      retry_backoff bool,
      expire_seconds int,
      retention_minutes int,
      dead_letter text REFERENCES trellis_jobs.queue (name),
      partition_name text,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.schedule (
      name text REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      cron text not null,
      timezone text,
      data jsonb,
      options jsonb,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.subscription (
      event text not null,
      name text not null REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY(event, name)
    )
  ;

    CREATE TABLE trellis_jobs.job (
      id uuid not null default gen_random_uuid(),
      name text not null,
      priority integer not null default(0),
      data jsonb,
      state trellis_jobs.job_state not null default('created'),
      retry_limit integer not null default(2),
      retry_count integer not null default(0),
      retry_delay integer not null default(0),
      retry_backoff boolean not null default false,
      start_after timestamp with time zone not null default now(),
      started_on timestamp with time zone,
      singleton_key text,
      singleton_on timestamp without time zone,
      expire_in interval not null default interval '15 minutes',
      created_on timestamp with time zone not null default now(),
      completed_on timestamp with time zone,
      keep_until timestamp with time zone NOT NULL default now() + interval '14 days',
      output jsonb,
      dead_letter text,
      policy text
    ) PARTITION BY LIST (name)
  ;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);
CREATE TABLE trellis_jobs.archive (LIKE trellis_jobs.job);
ALTER TABLE trellis_jobs.archive ADD PRIMARY KEY (name, id);
ALTER TABLE trellis_jobs.archive ADD archived_on timestamptz NOT NULL DEFAULT now();
CREATE INDEX archive_i1 ON trellis_jobs.archive(archived_on);

    CREATE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
      queue_created_on timestamptz;
    BEGIN

      WITH q as (
      INSERT INTO trellis_jobs.queue (
        name,
        policy,
        retry_limit,
        retry_delay,
        retry_backoff,
        expire_seconds,
        retention_minutes,
        dead_letter,
        partition_name
      )
      VALUES (
        queue_name,
        options->>'policy',
        (options->>'retryLimit')::int,
        (options->>'retryDelay')::int,
        (options->>'retryBackoff')::bool,
        (options->>'expireInSeconds')::int,
        (options->>'retentionMinutes')::int,
        options->>'deadLetter',
        table_name
      )
      ON CONFLICT DO NOTHING
      RETURNING created_on
      )
      SELECT created_on into queue_created_on from q;

      IF queue_created_on IS NULL THEN
        RETURN;
      END IF;

      EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
      EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
      EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;

    CREATE FUNCTION trellis_jobs.delete_queue(queue_name text)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar;
    BEGIN
      WITH deleted as (
        DELETE FROM trellis_jobs.queue
        WHERE name = queue_name
        RETURNING partition_name
      )
      SELECT partition_name from deleted INTO table_name;

      EXECUTE format('DROP TABLE IF EXISTS trellis_jobs.%I', table_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;
INSERT INTO trellis_jobs.version(version) VALUES ('24');
    $trellis_boss$;
  ELSE
    SELECT version INTO boss_version FROM trellis_jobs.version;
    IF boss_version >= 24 THEN
      NULL; -- up to date, or installed by a newer trellis-pg
  ELSIF boss_version = 23 THEN
    EXECUTE $trellis_boss_23$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_23$;
  ELSIF boss_version = 22 THEN
    EXECUTE $trellis_boss_22$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_22$;
  ELSIF boss_version = 21 THEN
    EXECUTE $trellis_boss_21$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ALTER COLUMN retry_limit SET DEFAULT 2;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_21$;
    ELSE
      RAISE EXCEPTION 'the jobs schema trellis_jobs is at pg-boss schema version %, which this trellis-pg cannot upgrade to 24', boss_version
        USING ERRCODE = 'TRI01';
    END IF;
  END IF;
  PERFORM trellis_jobs.create_queue('self_check', '{"policy": "standard"}'::json);

  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis_jobs" FROM PUBLIC;
END
$trellis_install$;
