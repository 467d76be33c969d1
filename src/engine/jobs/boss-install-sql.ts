import { createRequire } from 'node:module';
import PgBoss from 'pg-boss';
import { quoteLiteral } from '../identifiers.js';
import { JOB_QUEUES } from './queues.js';

/**
 * pg-boss's own schema, as statements for Trellis's install DO block (ADR 0014). The SQL is
 * pg-boss's: its construction plan for a fresh jobs schema, and its migration plans from
 * each schema version it knows how to upgrade, chosen by the version installed. pg-boss
 * wraps each plan in BEGIN … COMMIT (with SET LOCAL timeouts), which would end the
 * transaction of a migration that runs the install SQL; the wrapper is taken off and the
 * plan runs inside the DO block, under pg-boss's own advisory lock, which the plan takes.
 */

const require = createRequire(import.meta.url);

/** The pg-boss schema version the pinned pg-boss (package.json) installs and expects. */
export const BOSS_SCHEMA_VERSION: number = (require('pg-boss/version.json') as { schema: number })
  .schema;

const WRAPPER_START =
  /^\s*BEGIN;\s*SET LOCAL lock_timeout = '30s';\s*SET LOCAL idle_in_transaction_session_timeout = '30s';/;
const WRAPPER_END = /COMMIT;\s*$/;

/** A pg-boss plan without its BEGIN … COMMIT wrapper; throws if pg-boss changed its shape. */
export function unwrapPlan(plan: string): string {
  if (!WRAPPER_START.test(plan) || !WRAPPER_END.test(plan)) {
    throw new Error(
      'pg-boss plan is not wrapped as pg-boss 10 wraps it (BEGIN; SET LOCAL …; … COMMIT;): check the pinned pg-boss version',
    );
  }
  return plan.replace(WRAPPER_START, '').replace(WRAPPER_END, '');
}

function dollarQuoted(body: string, tag: string): string {
  if (body.includes(`$${tag}$`)) throw new Error(`pg-boss plan contains $${tag}$`);
  return `$${tag}$${body}$${tag}$`;
}

/**
 * The schema versions pg-boss can migrate from, newest first, with the plan from each (its
 * public migration plans). pg-boss's plan from version v applies every migration from v
 * on: for a version older than its oldest migration it gives the same plan as for the
 * next one, which is where the list ends.
 */
function upgradableVersions(jobsSchema: string): Array<{ from: number; plan: string }> {
  const found: Array<{ from: number; plan: string }> = [];
  let newer: string | undefined;
  for (let from = BOSS_SCHEMA_VERSION - 1; from > 0; from -= 1) {
    let plan: string;
    try {
      // Typed as a string; pg-boss compares it as a number.
      plan = PgBoss.getMigrationPlans(jobsSchema, from as unknown as string);
    } catch {
      break;
    }
    if (plan === newer) break;
    newer = plan;
    found.push({ from, plan: unwrapPlan(plan) });
  }
  return found;
}

/**
 * PL/pgSQL statements (for the install DO block) that install pg-boss's schema in
 * `jobsSchema`, or upgrade it from an older pg-boss schema version, and create every job
 * queue. A jobs schema at a newer version (installed by a newer trellis-pg) is left as it
 * is. `catalogSchema` is only for messages.
 */
export function bossInstallStatements(jobsSchema: string, catalogSchema: string): string {
  const at = (table: string) => quoteLiteral(`${jobsSchema}.${table}`);
  const create = dollarQuoted(unwrapPlan(PgBoss.getConstructionPlans(jobsSchema)), 'trellis_boss');
  const upgrades = upgradableVersions(jobsSchema)
    .map(
      (u) => `
  ELSIF boss_version = ${u.from} THEN
    EXECUTE ${dollarQuoted(u.plan, `trellis_boss_${u.from}`)};`,
    )
    .join('');
  const queues = JOB_QUEUES.map(
    (q) => `
  PERFORM ${jobsSchema}.create_queue(${quoteLiteral(q.name)}, '{"policy": "standard"}'::json);`,
  ).join('');
  return `
  -- Background jobs (self-checks) run on pg-boss, in the schema ${jobsSchema} at pg-boss's
  -- schema version ${BOSS_SCHEMA_VERSION} (ADR 0014).
  IF to_regclass(${at('migrations')}) IS NOT NULL THEN
    RAISE EXCEPTION 'schema ${jobsSchema}, where Trellis instance ${catalogSchema.replaceAll("'", "''")} keeps its jobs, holds another Trellis instance''s catalog: choose another catalog schema'
      USING ERRCODE = 'TRC01';
  END IF;
  IF to_regclass(${at('version')}) IS NULL THEN
    EXECUTE ${create};
  ELSE
    SELECT version INTO boss_version FROM ${jobsSchema}.version;
    IF boss_version >= ${BOSS_SCHEMA_VERSION} THEN
      NULL; -- up to date, or installed by a newer trellis-pg${upgrades}
    ELSE
      RAISE EXCEPTION 'the jobs schema ${jobsSchema} is at pg-boss schema version %, which this trellis-pg cannot upgrade to ${BOSS_SCHEMA_VERSION}', boss_version
        USING ERRCODE = 'TRI01';
    END IF;
  END IF;${queues}
`;
}
