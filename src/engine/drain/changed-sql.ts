import type { TransformPlan } from './plan.js';
import { q, requireSourceIds } from './sql-parts.js';

/**
 * Ledger rows (xid column `xid`) of the range after snapshot `lo` up to snapshot `hi`:
 * those of transactions `hi` sees and `lo` does not. The xid bounds let the ledger's
 * BRIN index skip the rest; visibility decides.
 */
export function inRange(xid: string, lo: string, hi: string): string {
  return `${xid} >= pg_snapshot_xmin(${lo}::pg_snapshot)::text::bigint
     AND ${xid} < pg_snapshot_xmax(${hi}::pg_snapshot)::text::bigint
     AND pg_visible_in_snapshot(${xid}::text::xid8, ${hi}::pg_snapshot)
     AND NOT pg_visible_in_snapshot(${xid}::text::xid8, ${lo}::pg_snapshot)`;
}

/**
 * The key of ledger key `k` (see 0007_pipeline.sql) as the text[] of its columns: a
 * one-column key is stored as its text, a wider one as its text[]'s text form.
 */
function decodedKey(plan: TransformPlan, k: string): string {
  const wide = requireSourceIds(plan)
    .filter((src) => src.keyColumns.length > 1)
    .map((src) => src.sourceId);
  const one = `ARRAY[${k}]`;
  return wide.length
    ? `CASE WHEN l.source_id IN (${[...new Set(wide)].join(', ')}) THEN ${k}::text[] ELSE ${one} END`
    : one;
}

/**
 * The changed keys of one ledger range (after tick `$1`'s snapshot, up to tick `$2`'s),
 * for this transform's sources, less the keys held back from the whole of it (a key changed twice
 * appears twice; consumers dedupe on typed keys, far cheaper than on text[]). A page narrows it to a
 * block range (`$3`..`$4`, end exclusive, as tids) of one ledger generation, read by TID
 * range alone: the fence (OFFSET 0) keeps the planner from preferring the xid index,
 * whose estimates for a young ledger are far off, and scanning the whole range per page.
 * With `buckets`, it keeps the keys whose hash falls in bucket `$5` (`$3` unpaged).
 * A TRUNCATE's ledger row (NULL keys) yields no key.
 */
export function changedFromLedger(
  schema: string,
  plan: TransformPlan,
  generation: number | null,
  buckets = 1,
): string {
  const s = q(schema);
  const ids = requireSourceIds(plan).map((src) => src.sourceId);
  const from =
    generation === null
      ? `${s}.ledger l`
      : `(SELECT * FROM ${s}.${q(`ledger_${generation}`)} WHERE ctid >= $3::tid AND ctid < $4::tid OFFSET 0) l`;
  const bucketParam = generation === null ? '$3' : '$5';
  const filters = [
    ...(plan.hasHeldKeys
      ? [
          `NOT EXISTS (SELECT 1 FROM ${s}.held_keys h
                      WHERE h.transform_id = ${plan.id} AND h.column_name = ''
                        AND h.source_id = c.source_id AND h.key = c.key)`,
        ]
      : []),
    ...(buckets > 1
      ? [`(hashtext(c.key::text) & 2147483647) % ${buckets} = ${bucketParam}::int`]
      : []),
  ];
  const where = filters.length ? `\n   WHERE ${filters.join('\n     AND ')}` : '';
  return `SELECT c.source_id, c.key
    FROM (SELECT l.source_id, ${decodedKey(plan, 'u.k')} AS key
            FROM ${from} CROSS JOIN LATERAL unnest(l.keys) AS u(k)
           WHERE l.source_id IN (${[...new Set(ids)].join(', ')})
             AND ${inRange('l.xid', '$1', '$2')}) c${where}`;
}

/** Changed keys given explicitly as `$1`: a JSON array of `{"s": source_id, "k": [text, ...]}`. */
export function changedFromList(): string {
  return `SELECT (e->>'s')::int AS source_id, ARRAY(SELECT jsonb_array_elements_text(e->'k')) AS key
    FROM jsonb_array_elements($1::jsonb) e`;
}
