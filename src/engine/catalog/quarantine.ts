import type { Session } from '../db/session.js';
import { applyKeysBisecting } from '../drain/apply-keys.js';
import { loadPlan } from '../drain/plan.js';
import { enterTransformWork } from '../drain/work-settings.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';

/**
 * The quarantine: keys whose re-derivation failed, held per address (`"transform"` or
 * `"transform.column"`, see drain/apply-keys.ts). Reads for operators, and the release of
 * one key. Keys are rendered by `<schema>.render_key` everywhere.
 */

/** One address's quarantine state, as `quarantined()` lists it. */
export interface QuarantineEntry {
  /** `"transform"` or `"transform.column"`. */
  address: string;
  count: number;
  /** When the key held longest was last poisoned. */
  oldestPoisonedAt: Date;
  /** Whether the address is paused (by the threshold, or an operator). */
  paused: boolean;
}

/** How many keys an address holds. */
export interface QuarantineCount {
  count: number;
  oldestPoisonedAt: Date | null;
}

/** One held key, as `sampleQuarantined()` pages them. */
export interface QuarantineSample {
  /** The source table, schema-qualified. */
  srcTable: string;
  /** The key, rendered (a one-column key's text; a wider key's text[] literal). */
  key: string;
  error: string;
  sqlstate: string | null;
  poisonedAt: Date;
}

/** One page of `sampleQuarantined()`, ordered by `(srcTable, key)`. */
export interface SamplePage {
  samples: QuarantineSample[];
  /** Pass back for the next page; null at the end. Opaque. */
  nextCursor: string | null;
}

/** A held key across transforms, as `poisonedSince()` lists them. */
export interface PoisonedRow {
  /** The address it is held at. */
  transform: string;
  srcTable: string;
  key: string;
  error: string;
  poisonedAt: Date;
}

/** What `releaseKey()` did: the key went through, or is held again with its new error. */
export type ReleaseResult =
  | { released: true }
  | { released: false; address: string; error: string; sqlstate: string | null };

interface Address {
  transformId: number;
  target: string;
  /** '' for the whole transform. */
  column: string;
}

/** The source table's name as samples show it (and `releaseKey` takes it). */
function srcTableSql(s: string): string {
  return `(SELECT n.nspname || '.' || c.relname FROM ${s}.sources src
             JOIN pg_class c ON c.oid = src.source_oid JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE src.id = h.source_id)`;
}

/** Resolves an address; `not_found` for an unknown transform or column. */
async function resolveAddress(session: Session, schema: string, address: string): Promise<Address> {
  const s = quoteIdent(schema);
  const dot = address.lastIndexOf('.');
  const [row] = await session.query<{ id: number; target: string; col: string }>(
    `SELECT t.id, t.target_name AS target, '' AS col FROM ${s}.transforms t WHERE t.target_name = $1
     UNION ALL
     SELECT t.id, t.target_name, c.name FROM ${s}.transforms t
       JOIN ${s}.transform_columns c ON c.transform_id = t.id
      WHERE t.target_name = $2 AND c.name = $3
     LIMIT 1`,
    [address, dot > 0 ? address.slice(0, dot) : null, dot > 0 ? address.slice(dot + 1) : null],
  );
  if (!row) {
    throw new TrellisError(
      'not_found',
      `there is no quarantine address ${address} (expected "transform" or "transform.column")`,
    );
  }
  return { transformId: row.id, target: row.target, column: row.col };
}

export async function quarantined(session: Session, schema: string): Promise<QuarantineEntry[]> {
  const s = quoteIdent(schema);
  const rows = await session.query<{
    address: string;
    count: string;
    oldest: Date;
    paused: boolean;
  }>(
    `SELECT CASE WHEN h.column_name = '' THEN t.target_name::text
                 ELSE t.target_name || '.' || h.column_name END AS address,
            count(*) AS count, min(h.held_at) AS oldest,
            bool_or(t.paused_at IS NOT NULL OR c.paused_at IS NOT NULL) AS paused
       FROM ${s}.held_keys h
       JOIN ${s}.transforms t ON t.id = h.transform_id
       LEFT JOIN ${s}.transform_columns c ON c.transform_id = h.transform_id AND c.name = h.column_name
      GROUP BY 1 ORDER BY 1`,
  );
  return rows.map((r) => ({
    address: r.address,
    count: Number(r.count),
    oldestPoisonedAt: r.oldest,
    paused: r.paused,
  }));
}

export async function quarantineStatus(
  session: Session,
  schema: string,
  address: string,
): Promise<QuarantineCount> {
  const a = await resolveAddress(session, schema, address);
  const [row] = await session.query<{ count: string; oldest: Date | null }>(
    `SELECT count(*) AS count, min(held_at) AS oldest FROM ${quoteIdent(schema)}.held_keys
      WHERE transform_id = $1 AND column_name = $2`,
    [a.transformId, a.column],
  );
  return { count: Number(row?.count ?? 0), oldestPoisonedAt: row?.oldest ?? null };
}

function encodeCursor(table: string, key: string[]): string {
  return Buffer.from(JSON.stringify([table, key])).toString('base64url');
}

function decodeCursor(cursor: string): [string, string[]] {
  try {
    const value = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
    if (
      Array.isArray(value) &&
      typeof value[0] === 'string' &&
      Array.isArray(value[1]) &&
      value[1].every((k) => typeof k === 'string')
    ) {
      return [value[0], value[1] as string[]];
    }
  } catch {
    // fall through
  }
  throw new TrellisError('validation', 'not a quarantine cursor: pass what nextCursor was');
}

/**
 * A page of an address's held keys, ordered by (source table, key). The cursor is the
 * last key of the page: keys added or released meanwhile shift nothing, so no key is
 * skipped or repeated.
 */
export async function sampleQuarantined(
  session: Session,
  schema: string,
  address: string,
  options: { limit?: number; cursor?: string | null } = {},
): Promise<SamplePage> {
  const limit = options.limit ?? 100;
  if (!Number.isInteger(limit) || limit < 1 || limit > 10_000) {
    throw new TrellisError('validation', `limit must be an integer from 1 to 10000, not ${limit}`);
  }
  const after = options.cursor ? decodeCursor(options.cursor) : null;
  const a = await resolveAddress(session, schema, address);
  const s = quoteIdent(schema);
  const rows = await session.query<{
    src_table: string;
    key: string[];
    rendered: string;
    error: string;
    sqlstate: string | null;
    held_at: Date;
  }>(
    `SELECT * FROM (
       SELECT ${srcTableSql(s)} AS src_table, h.key, ${s}.render_key(h.key) AS rendered,
              h.error, h.sqlstate, h.held_at
         FROM ${s}.held_keys h WHERE h.transform_id = $1 AND h.column_name = $2) x
      WHERE $3::text IS NULL OR (x.src_table, x.key) > ($3::text, $4::text[])
      ORDER BY x.src_table, x.key
      LIMIT $5`,
    [a.transformId, a.column, after?.[0] ?? null, after?.[1] ?? null, limit + 1],
  );
  const page = rows.slice(0, limit);
  const last = page[page.length - 1];
  return {
    samples: page.map((r) => ({
      srcTable: r.src_table,
      key: r.rendered,
      error: r.error,
      sqlstate: r.sqlstate,
      poisonedAt: r.held_at,
    })),
    nextCursor: rows.length > limit && last ? encodeCursor(last.src_table, last.key) : null,
  };
}

export async function poisonedSince(
  session: Session,
  schema: string,
  since: Date,
): Promise<PoisonedRow[]> {
  if (!(since instanceof Date) || Number.isNaN(since.getTime())) {
    throw new TrellisError('validation', 'since must be a valid Date');
  }
  const s = quoteIdent(schema);
  const rows = await session.query<{
    address: string;
    src_table: string;
    key: string;
    error: string;
    held_at: Date;
  }>(
    `SELECT CASE WHEN h.column_name = '' THEN t.target_name::text
                 ELSE t.target_name || '.' || h.column_name END AS address,
            ${srcTableSql(s)} AS src_table, ${s}.render_key(h.key) AS key, h.error, h.held_at
       FROM ${s}.held_keys h JOIN ${s}.transforms t ON t.id = h.transform_id
      WHERE h.held_at >= $1
      ORDER BY h.held_at, 1, 2, h.key`,
    [since],
  );
  return rows.map((r) => ({
    transform: r.address,
    srcTable: r.src_table,
    key: r.key,
    error: r.error,
    poisonedAt: r.held_at,
  }));
}

/**
 * Releases one key held at `address` and re-derives it now, in one transaction: it goes
 * through, or is held again (at the address that explains its new failure).
 */
export async function releaseKey(
  session: Session,
  schema: string,
  address: string,
  srcTable: string,
  key: string,
  log: Logger,
): Promise<ReleaseResult> {
  const s = quoteIdent(schema);
  return session.transaction(async () => {
    const a = await resolveAddress(session, schema, address);
    const [held] = await session.query<{ source_id: number; key: string[] }>(
      `DELETE FROM ${s}.held_keys h
        WHERE h.transform_id = $1 AND h.column_name = $2
          AND ${srcTableSql(s)} = $3 AND ${s}.render_key(h.key) = $4
       RETURNING h.source_id, h.key`,
      [a.transformId, a.column, srcTable, key],
    );
    if (!held) {
      throw new TrellisError(
        'not_found',
        `${address} holds no key ${key} of ${srcTable} (see sampleQuarantined)`,
      );
    }
    const plan = await loadPlan(session, schema, a.transformId);
    await enterTransformWork(session, schema, plan, true);
    await applyKeysBisecting(session, schema, plan, [{ s: held.source_id, k: held.key }], log);
    // Held again by this transaction (held_at is its start), wherever the failure is now.
    const [again] = await session.query<{
      address: string;
      error: string;
      sqlstate: string | null;
    }>(
      `SELECT CASE WHEN h.column_name = '' THEN $3::text ELSE $3 || '.' || h.column_name END AS address,
              h.error, h.sqlstate
         FROM ${s}.held_keys h
        WHERE h.transform_id = $1 AND h.source_id = $2 AND h.key = $4::text[]
          AND h.held_at >= now()
        LIMIT 1`,
      [a.transformId, held.source_id, a.target, held.key],
    );
    if (again) {
      return {
        released: false,
        address: again.address,
        error: again.error,
        sqlstate: again.sqlstate,
      };
    }
    log.info({ address, srcTable, key }, 'held key released');
    return { released: true };
  });
}
