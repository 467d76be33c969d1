-- Bit-string and hex-string literals (B'…', X'…') as Postgres reads them: a doubled quote
-- does not continue them (Postgres's scanner doubles quotes only in '…', E'…', N'…' and
-- U&'…'), so B'01''x' is B'01' followed by 'x', as Postgres would run it. The tokenizer
-- read one literal there, and a value Postgres then refused with a raw syntax error (the
-- grammar's token-soup property test found it in ALTER … SET (timezone = B'01''UTC')).
-- grammar_tokenize as in 0003 (its only body), the change marked "0051".
CREATE OR REPLACE FUNCTION @schema@.grammar_tokenize(statement text) RETURNS @schema@.grammar_token[]
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
  doubled boolean; -- 0051: whether '' continues the literal (not in B'…', X'…')
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
      doubled := NOT (pl = 1 AND c IN (66, 98, 88, 120)); -- 0051
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
            EXIT WHEN cp[q + 1] <> 39 OR NOT doubled; -- 0051
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

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
