import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';

/**
 * Changes to a source that the ledger cannot carry: DDL. The staging worker looks for them
 * on every reconcile pass (ENGINE.md, I7; the policy is ADR 0008):
 * - a source renamed or moved to another schema is followed (capture and the drain read it
 *   by OID; the catalog and the statement take its new name);
 * - a read column dropped, renamed or retyped (a rewrite fires no trigger), a source
 *   dropped, its primary key changed, row level security enabled on it (unless the
 *   definition says WITHOUT ROW SECURITY: ADR 0034), or, for a definition that reads whole
 *   rows, a column added or dropped: the transforms reading it stop (paused, reason `capture_failure`,
 *   with a sentence in `status().captureFailure`). RESUME binds the statement to the
 *   sources as they are then, and rebuilds.
 * Capture itself never fails meanwhile (see trigger-sql.ts): what it records until the
 * transform is rebuilt does not matter.
 *
 * Targets are checked too: one dropped, a column of it dropped, renamed or retyped, its key
 * or guard trigger removed stops the transform (`captureFailure.kind: 'halt'`); RESUME
 * repairs what it can (`_repair_target`) and rebuilds.
 */
export async function checkSourceChanges(
  session: Session,
  schema: string,
  log: Logger,
): Promise<void> {
  const s = quoteIdent(schema);
  const renamed = await session.query<{ target: string }>(
    `SELECT ${s}._follow_source_renames() AS target`,
  );
  for (const { target } of renamed) log.info({ target }, 'a source was renamed: followed');
  // Read columns renamed or retyped while the definition still holds: followed (ADR 0047);
  // the target is re-derived by refillFollowed once capture is reconciled. What cannot be
  // followed is stopped just below, as before.
  const followed = await session.query<{ target: string; refused: string | null }>(
    `SELECT target, refused FROM ${s}._follow_source_columns()`,
  );
  for (const { target, refused } of followed) {
    if (refused === null) log.info({ target }, 'a source column was renamed or retyped: followed');
    else log.info({ target, refused }, 'a source column change cannot be followed');
  }

  const stopped = await session.query<{ target: string; error: string }>(
    `WITH sources AS (
       SELECT ts.transform_id, ts.ordinal, ts.source_oid, ts.key_columns, ts.read_attrs,
              quote_ident(ts.source_schema) || '.' || quote_ident(ts.source_name) AS display,
              coalesce((t.spec->>'whole_row')::boolean, false) AS whole_row,
              coalesce((t.spec->'ast'->>'without_row_security')::boolean, false) AS without_row_security,
              coalesce(c.relrowsecurity, false) AS row_security,
              c.oid IS NOT NULL AS present
         FROM ${s}.transform_sources ts
         JOIN ${s}.transforms t ON t.id = ts.transform_id
         LEFT JOIN pg_class c ON c.oid = ts.source_oid
        WHERE t.capture_failure IS NULL AND ts.read_attrs IS NOT NULL),
     problems AS (
       SELECT transform_id, ordinal, format('source table %s was dropped', display) AS error,
              NULL::text AS col, false AS followable
         FROM sources WHERE NOT present
       UNION ALL
       SELECT src.transform_id, src.ordinal,
              CASE WHEN a.attnum IS NULL OR a.attisdropped
                     THEN format('column %I of %s was dropped', r->>'name', src.display)
                   WHEN a.attname <> r->>'name'
                     THEN format('column %I of %s was renamed to %I', r->>'name', src.display, a.attname)
                   ELSE format('column %I of %s changed type from %s to %s', r->>'name', src.display,
                               r->>'type', format_type(a.atttypid, a.atttypmod))
              END,
              src.display || '.' || quote_ident(r->>'name'),
              -- Renamed or retyped (the column is there): what _follow_source_columns follows.
              NOT (a.attnum IS NULL OR a.attisdropped)
         FROM sources src
         CROSS JOIN LATERAL jsonb_array_elements(src.read_attrs) r
         LEFT JOIN pg_attribute a ON a.attrelid = src.source_oid AND a.attnum = (r->>'attnum')::int
        WHERE src.present
          AND (a.attnum IS NULL OR a.attisdropped OR a.attname <> r->>'name'
               OR format_type(a.atttypid, a.atttypmod) <> r->>'type')
       UNION ALL
       SELECT src.transform_id, src.ordinal,
              format('column %I was added to %s, and the definition reads whole rows of it',
                     a.attname, src.display),
              src.display || '.' || quote_ident(a.attname), false
         FROM sources src
         JOIN pg_attribute a ON a.attrelid = src.source_oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE src.present AND src.whole_row
          AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(src.read_attrs) r
                           WHERE (r->>'attnum')::int = a.attnum)
       UNION ALL
       SELECT src.transform_id, src.ordinal,
              CASE WHEN pk.cols IS NULL THEN format('source table %s has no primary key any more', src.display)
                   ELSE format('the primary key of %s changed from (%s) to (%s)', src.display,
                               array_to_string(src.key_columns, ', '), array_to_string(pk.cols, ', '))
              END,
              NULL, false
         FROM sources src
         LEFT JOIN LATERAL (
           SELECT array_agg(a.attname ORDER BY k.i) AS cols
             FROM pg_index x
             CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
            WHERE x.indrelid = src.source_oid AND x.indisprimary) pk ON true
        WHERE src.present AND pk.cols IS DISTINCT FROM src.key_columns
       UNION ALL
       -- The definition was refused over it then (ADR 0034): every role that may read the
       -- target would read every row, whatever the new policies say.
       SELECT src.transform_id, src.ordinal,
              format('row level security was enabled on %s: define the transform WITHOUT ROW SECURITY (ALTER TRANSFORM … SET WITHOUT ROW SECURITY) to accept that its target holds every row Trellis''s role reads, then RESUME it',
                     src.display),
              NULL, false
         FROM sources src
        WHERE src.present AND src.row_security AND NOT src.without_row_security),
     -- Transforms this pass tried to follow and could not.
     refused AS (
       SELECT x.id FROM ${s}.transforms x
         JOIN unnest($1::text[], $2::text[]) AS r(target, refused) ON r.target = x.target_name
        WHERE r.refused IS NOT NULL),
     failures AS (
       SELECT transform_id,
              (array_agg(error ORDER BY ordinal, error))[1]
                || CASE WHEN count(*) > 1 THEN format(' (and %s more changes)', count(*) - 1) ELSE '' END AS error,
              coalesce(array_agg(DISTINCT col) FILTER (WHERE col IS NOT NULL), '{}') AS columns
         FROM problems GROUP BY transform_id
         -- A column renamed or retyped stops a transform only once following it was tried
         -- and refused: one whose DDL committed after this pass's follow (a statement of
         -- its own) is followed by the next pass, not stopped by this one.
        HAVING bool_or(NOT followable) OR transform_id IN (SELECT id FROM refused))
     UPDATE ${s}.transforms t
        SET paused_at = coalesce(t.paused_at, now()),
            -- An operator's pause stays theirs; RESUME rebinds whatever the reason.
            pause_reason = CASE WHEN t.paused_at IS NULL THEN 'capture_failure' ELSE t.pause_reason END,
            -- Why it was not followed, beside what changed (when that was tried).
            capture_failure = jsonb_build_object('kind', 'capture', 'error', f.error || coalesce(
                                (SELECT '; not followed: ' || r.refused
                                   FROM unnest($1::text[], $2::text[]) AS r(target, refused)
                                  WHERE r.target = t.target_name AND r.refused IS NOT NULL), ''),
                                                 'columns', to_jsonb(f.columns), 'detected_at', now()),
            updated_at = now()
       FROM failures f
      WHERE t.id = f.transform_id
     RETURNING t.target_name AS target, f.error`,
    [followed.map((f) => f.target), followed.map((f) => f.refused)],
  );
  // The targets: changed outside Trellis so the drain cannot keep them (a halt).
  const halted = await session.query<{ target: string; error: string }>(
    `UPDATE ${s}.transforms t
        SET paused_at = coalesce(t.paused_at, now()),
            pause_reason = CASE WHEN t.paused_at IS NULL THEN 'capture_failure' ELSE t.pause_reason END,
            capture_failure = jsonb_build_object('kind', 'halt', 'error', p.error,
                                                 'columns', to_jsonb(p.columns), 'detected_at', now()),
            updated_at = now()
       FROM ${s}._target_problems() p
      WHERE t.id = p.transform_id
     RETURNING t.target_name AS target, p.error`,
  );
  // The pause itself is logged once, as a state change, by the catalog watch.
  for (const { target, error } of [...stopped, ...halted]) {
    log.debug({ target, error }, `transform ${target} stopped: ${error}`);
  }
}
