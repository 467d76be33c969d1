-- Capture edges and definitions under load (issue #21 items 2, 8, 9 and 12).

-- Item 8: a statement deadlocking with the app's writers or the engine's workers (40P01),
-- or failing a serialization check (40001), is run again, up to 8 times with a short
-- jittered backoff, inside the caller's transaction (each attempt is a subtransaction: the
-- losing attempt's locks are released, so the other side goes on). Postgres picks the
-- victim that waited first; retried, the statement goes through once the other side
-- committed. Exhausted, it fails with TRT01 (the handle's `transient`), never as an
-- uncoded database error.
CREATE FUNCTION @schema@._apply_retrying(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  attempt int := 0;
  attempts constant int := 8;
  last_error text;
BEGIN
  LOOP
    attempt := attempt + 1;
    BEGIN
      RETURN @schema@._apply(statement, transform_only);
    EXCEPTION WHEN deadlock_detected OR serialization_failure THEN
      GET STACKED DIAGNOSTICS last_error = MESSAGE_TEXT;
      IF attempt >= attempts THEN
        RAISE EXCEPTION USING ERRCODE = 'TRT01',
          MESSAGE = format('the statement met concurrent work %s times in a row (%s): try it again',
                           attempts, last_error),
          HINT = 'Nothing was changed. Writers or the engine''s workers held the same rows; the statement can be repeated as it is.';
      END IF;
      PERFORM pg_sleep(0.02 * attempt + random() * 0.05 * attempt);
    END;
  END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.apply(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT @schema@._apply_retrying(statement, false)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.define(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT @schema@._apply_retrying(statement, true)
$fn$;
