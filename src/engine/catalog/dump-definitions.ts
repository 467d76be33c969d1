import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent, quoteLiteral } from '../identifiers.js';
import { jobsSchemaFor } from '../jobs/jobs-schema.js';

/**
 * The definitions as SQL for the end of a schema-only dump (ADR 0022). A schema-only
 * pg_dump carries Trellis's schema, the targets and the capture triggers but none of the
 * catalog's rows; this SQL writes back the rows that say what is installed (migrations,
 * config, and the jobs schema's pg-boss version and queues) and registers every transform
 * again, in the order they were defined (a chain's upstream first), with the search_path
 * and the settings each was defined under (ADR 0033). Runtime state (ledger, progress,
 * pauses, quarantine, claims) is left out: each transform loads as waiting_to_backfill and
 * the worker builds it. Safe to run twice.
 */
export async function dumpDefinitionsSql(session: Session, schema: string): Promise<string> {
  const s = quoteIdent(schema);
  const [restore] = await session.query<{ present: boolean }>(
    `SELECT to_regprocedure($1) IS NOT NULL AS present`,
    [`${s}.restore_definition(text,text)`],
  );
  if (!restore?.present) {
    throw new TrellisError(
      'conflict',
      `the Trellis schema ${schema} predates schema dumps (its restore_definition() is missing): run trellis migrate (or the install SQL) first, so the dump can load`,
    );
  }
  const [state] = await session.query<{ migrations: unknown[]; config: unknown | null }>(
    `SELECT (SELECT coalesce(jsonb_agg(to_jsonb(m) ORDER BY m.version), '[]') FROM ${s}.migrations m) AS migrations,
            -- The replication slot (WAL capture) belongs to this database: the loaded
            -- one makes its own, rather than find "its" slot missing (a disruption). So
            -- does its identity: the loaded one's catalog is made there, from definitions,
            -- not restored from this one (ADR 0035), and records its own.
            (SELECT to_jsonb(c) - 'wal_slot' - 'database_identity' - 'restored'
               FROM ${s}.config c) AS config`,
  );
  const definitions = await session.query<{
    statement: string;
    search_path: string;
    settings: Record<string, string>;
  }>(
    // A transform's hidden parts (ADR 0056) are defined again by its statement.
    `SELECT statement, search_path, settings FROM ${s}.transforms WHERE part_of IS NULL ORDER BY id`,
  );
  const lines = [
    '',
    `-- Trellis definitions: catalog schema ${s}, ${definitions.length} transform${definitions.length === 1 ? '' : 's'}.`,
    '-- Written by trellis-pg (trellis dump, dumpDefinitionsSql()). On a database loaded from a',
    "-- schema-only pg_dump, it records Trellis's schema as installed and registers each",
    '-- transform again; the worker that starts on it builds them. Safe to run again.',
    `INSERT INTO ${s}.migrations SELECT * FROM pg_catalog.jsonb_populate_recordset(NULL::${s}.migrations, ${quoteLiteral(JSON.stringify(state?.migrations ?? []))}) ON CONFLICT DO NOTHING;`,
  ];
  // The jobs schema (pg-boss) is in the dump too, without the rows that say which pg-boss
  // schema version it is and which queues (partitions) it has: without them the install
  // SQL would take it for a broken one.
  const jobs = quoteIdent(jobsSchemaFor(schema));
  const [boss] = await session.query<{ version: unknown[] | null; queues: unknown[] | null }>(
    `SELECT CASE WHEN to_regclass($1) IS NOT NULL THEN
              (SELECT jsonb_agg(to_jsonb(v)) FROM ${jobs}.version v) END AS version,
            CASE WHEN to_regclass($2) IS NOT NULL THEN
              (SELECT jsonb_agg(to_jsonb(q) ORDER BY q.name) FROM ${jobs}.queue q) END AS queues`,
    [`${jobs}.version`, `${jobs}.queue`],
  );
  for (const [table, rows] of [
    ['version', boss?.version],
    ['queue', boss?.queues],
  ] as const) {
    if (!rows?.length) continue;
    // Only when the dump holds the jobs schema (a schema list may leave it out).
    const insert = `INSERT INTO ${jobs}.${table} SELECT * FROM pg_catalog.jsonb_populate_recordset(NULL::${jobs}.${table}, ${quoteLiteral(JSON.stringify(rows))}) ON CONFLICT DO NOTHING`;
    lines.push(
      `DO $trellis_jobs$ BEGIN IF pg_catalog.to_regclass(${quoteLiteral(`${jobs}.${table}`)}) IS NOT NULL THEN EXECUTE ${quoteLiteral(insert)}; END IF; END $trellis_jobs$;`,
    );
  }
  if (state?.config) {
    lines.push(
      `INSERT INTO ${s}.config SELECT * FROM pg_catalog.jsonb_populate_record(NULL::${s}.config, ${quoteLiteral(JSON.stringify(state.config))}) ON CONFLICT DO NOTHING;`,
    );
    // Where the dumped schema records an identity (schema 29 on): this database's.
    lines.push(
      `DO $trellis_identity$ BEGIN IF pg_catalog.to_regprocedure(${quoteLiteral(`${s}._database_identity()`)}) IS NOT NULL THEN UPDATE ${s}.config SET database_identity = ${s}._database_identity() WHERE database_identity IS NULL; END IF; END $trellis_identity$;`,
    );
  }
  for (const d of definitions) {
    lines.push(
      `SELECT ${s}.restore_definition(${quoteLiteral(d.statement)}, ${quoteLiteral(d.search_path)}, ${quoteLiteral(JSON.stringify(d.settings))});`,
    );
  }
  return `${lines.join('\n')}\n`;
}
