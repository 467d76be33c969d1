import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type postgres from 'postgres';

/**
 * Random concurrent writes for the convergence tests, replayable from a seed (issue #10).
 *
 * A workload is planned before it runs: each writer draws its steps (statements,
 * transactions, TRUNCATEs) from a PRNG of its own, derived from the seed, and its new keys
 * from a key range of its own, so what a writer does depends on the seed and nothing else
 * (not on timing, nor on what other writers did). Running a plan then meets whatever the
 * interleaving brings; every error a write gets is either expected (and counted) or fails
 * the run (see `classify`).
 */

/** A small seeded PRNG (mulberry32): a failing seed replays the same choices. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The seed of one stream (a writer, a helper) of a run, mixed from the run's seed. */
export function streamSeed(seed: number, stream: number): number {
  let z = (seed ^ Math.imul(stream + 1, 0x9e3779b9)) >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}

/** Draws from one writer's PRNG. */
export class Dice {
  readonly random: () => number;

  constructor(seed: number) {
    this.random = prng(seed);
  }

  chance(p: number): boolean {
    return this.random() < p;
  }

  /** 1..n */
  int(n: number): number {
    return 1 + Math.floor(this.random() * n);
  }

  /** 0..n-1 */
  below(n: number): number {
    return Math.floor(this.random() * n);
  }

  /** One of `weighted`'s functions, chosen by weight. */
  weighted<T>(weighted: ReadonlyArray<readonly [number, () => T]>): () => T {
    const total = weighted.reduce((sum, [weight]) => sum + weight, 0);
    let r = this.random() * total;
    for (const [weight, fn] of weighted) {
      r -= weight;
      if (r < 0) return fn;
    }
    return weighted[weighted.length - 1]![1];
  }
}

/**
 * The integer keys one writer uses for one table: the rows the table starts with
 * (1..initial), and new keys from a range of its own (`span` keys after the initial ones,
 * one range per writer), so no two writers ever make the same new key.
 */
export class KeySpace {
  private used = 0;

  constructor(
    private readonly dice: Dice,
    private readonly initial: number,
    private readonly writer: number,
    private readonly writers: number,
    private readonly span: number,
  ) {
    if (initial + 1 + writers * span > 2 ** 31 - 1) throw new Error('key ranges beyond int');
  }

  private base(writer: number): number {
    return this.initial + 1 + writer * this.span;
  }

  /** The first of `n` new keys, never used before. */
  fresh(n = 1): number {
    if (this.used + n > this.span) throw new Error('a writer ran out of new keys');
    const first = this.base(this.writer) + this.used;
    this.used += n;
    return first;
  }

  /**
   * A key that probably exists: one the table started with, one this writer made, or one
   * another writer may have made by now (guessed from this writer's own progress).
   */
  existing(): number {
    const r = this.dice.random();
    if (this.used === 0 || r < 0.5) return this.dice.int(this.initial);
    if (r < 0.85 || this.writers === 1) return this.base(this.writer) + this.dice.below(this.used);
    const other = (this.writer + this.dice.int(this.writers - 1)) % this.writers;
    return this.base(other) + this.dice.below(this.used);
  }
}

/** A savepoint inside a transaction: its statements, then RELEASE or ROLLBACK TO. */
export interface SavepointStep {
  savepoint: string[];
  rollback: boolean;
}

/** One step of a writer's plan. */
export type Step =
  | { kind: 'statement'; sql: string }
  | { kind: 'truncate'; sql: string }
  | {
      kind: 'transaction';
      body: Array<string | SavepointStep>;
      /** Ends with ROLLBACK instead of COMMIT. */
      rollback: boolean;
      /** Pause after each part of the body but the last (a long transaction holds it open). */
      holdMs: number;
    };

/** What a workload writes: its tables and how a writer makes its statements. */
export interface WorkloadShape {
  /** The tables it writes (in `public`): a deadlock on these alone is its writers' own. */
  tables: string[];
  writer(dice: Dice, writer: number, writers: number): WriterStatements;
}

export interface WriterStatements {
  /** The next random statement (each call draws from the writer's dice). */
  statement(): string;
  /** A TRUNCATE of one of the tables. */
  truncate(): string;
}

export interface WorkloadOptions {
  seed: number;
  /** Concurrent writers, each with a PRNG of its own (and a client, with newClient). */
  writers: number;
  /** Steps per writer: a statement, a transaction (of a few statements) or a TRUNCATE. */
  operations: number;
  /** TRUNCATEs in the whole run, spread over the writers at random steps. */
  truncates?: number;
  /**
   * Transactions held open for about a second (many of the staging worker's 50 ms ticks)
   * while the other writers commit, spread over the writers at random steps.
   */
  longTransactions?: number;
  /**
   * The server is being restarted under the workload: no long transactions, transactions
   * written out statement by statement, and a lost connection is expected (counted). Pass newClient then: each writer gets a client of
   * its own and replaces it after a lost connection (a postgres.js client reused after one
   * can hang).
   */
  survivesRestarts?: boolean;
  /** Makes a client for one writer (instead of sharing the one passed in). */
  newClient?: () => postgres.Sql;
  /**
   * Every writer waits before its step `step` until `until` settles: a test that must act
   * while the writers still have work left (restart the server under them) does it then.
   */
  holdAt?:
    | { step: number; until: Promise<unknown> }
    | Array<{ step: number; until: Promise<unknown> }>;
  /**
   * Called after each step any writer took (committed, rolled back or failed as
   * expected): a test that must act while the writers are under way counts them.
   */
  onStep?: () => void;
}

export interface WorkloadResult {
  /** Steps each writer took. */
  operations: number;
  /** A digest of every writer's plan: the same for two runs of one seed and size. */
  fingerprint: string;
  /** Statements that committed (in transactions that committed, or on their own). */
  committed: number;
  /** Transactions rolled back on purpose. */
  rolledBack: number;
  /** Savepoints rolled back on purpose inside transactions that then committed. */
  savepointsRolledBack: number;
  /** Long transactions that committed. */
  longTransactions: number;
  /** TRUNCATEs that committed. */
  truncates: number;
  /** How long the run took (not part of what a seed replays). */
  elapsedMs: number;
  /** Errors the writers can cause each other (or a restart causes): counted, not failed. */
  expected: { uniqueViolation: number; deadlock: number; connectionLost: number };
}

type ExpectedError = keyof WorkloadResult['expected'];

/** Each writer's steps: a function of the seed, the shape and the sizes, nothing else. */
export function planWorkload(shape: WorkloadShape, options: WorkloadOptions): Step[][] {
  const { writers, operations } = options;
  const share = (total: number, writer: number) =>
    Math.floor(total / writers) + (writer < total % writers ? 1 : 0);
  return Array.from({ length: writers }, (_, writer) => {
    const dice = new Dice(streamSeed(options.seed, writer));
    const make = shape.writer(dice, writer, writers);
    // Where this writer's TRUNCATEs and long transactions go: distinct random steps.
    const truncates = share(options.truncates ?? 0, writer);
    const longs = options.survivesRestarts ? 0 : share(options.longTransactions ?? 0, writer);
    if (truncates + longs > operations) throw new Error('more special steps than steps');
    const special = new Map<number, 'truncate' | 'long'>();
    while (special.size < truncates + longs) {
      const at = dice.below(operations);
      if (!special.has(at)) special.set(at, special.size < truncates ? 'truncate' : 'long');
    }
    const body = (statements: number, savepoint: boolean): Array<string | SavepointStep> => {
      const parts: Array<string | SavepointStep> = [];
      for (let i = 0; i < statements; i += 1) parts.push(make.statement());
      if (savepoint) {
        const step = {
          savepoint: [make.statement(), make.statement()],
          rollback: dice.chance(0.7),
        };
        parts.splice(dice.below(parts.length + 1), 0, step);
      }
      return parts;
    };
    const steps: Step[] = [];
    for (let i = 0; i < operations; i += 1) {
      const kind = special.get(i);
      if (kind === 'truncate') {
        steps.push({ kind: 'truncate', sql: make.truncate() });
      } else if (kind === 'long') {
        // Each statement in a savepoint of its own, so an error the writers cause each
        // other (a unique violation, a deadlock) rolls back that statement alone and the
        // transaction still commits after having been held open.
        const parts = Array.from({ length: 4 }, () => ({
          savepoint: [make.statement()],
          rollback: false,
        }));
        parts.splice(dice.below(parts.length + 1), 0, {
          savepoint: [make.statement(), make.statement()],
          rollback: true,
        });
        steps.push({ kind: 'transaction', body: parts, rollback: false, holdMs: 250 });
      } else {
        const roll = dice.random();
        if (roll < 0.08) {
          // Rolls back: none of it may show.
          steps.push({ kind: 'transaction', body: body(3, false), rollback: true, holdMs: 0 });
        } else if (roll < 0.25) {
          // Commits, often with a savepoint rolled back inside (whose writes must not show).
          steps.push({
            kind: 'transaction',
            body: body(3, dice.chance(0.5)),
            rollback: false,
            holdMs: 0,
          });
        } else {
          steps.push({ kind: 'statement', sql: make.statement() });
        }
      }
    }
    return steps;
  });
}

/** The digest of a plan (see WorkloadResult.fingerprint). */
export function planFingerprint(plan: Step[][]): string {
  return createHash('sha256').update(JSON.stringify(plan)).digest('hex').slice(0, 16);
}

/** A write failed in a way Trellis could have caused: the test fails with it. */
export class SuspectWriteError extends Error {
  override name = 'SuspectWriteError';
}

/** What a server restart looks like to a client. */
const CONNECTION_LOST = new Set([
  '57P01',
  '57P02',
  '57P03',
  'CONNECTION_CLOSED',
  'CONNECTION_DESTROYED',
  'CONNECTION_ENDED',
  'ECONNREFUSED',
  'ECONNRESET',
  'CONNECT_TIMEOUT',
]);
const UNIQUE_VIOLATION = '23505';
const DEADLOCK_DETECTED = '40P01';

interface PgErrorFields {
  code?: string;
  message?: string;
  detail?: string;
  where?: string;
  table_name?: string;
  schema_name?: string;
}

/**
 * Whether a table is one the workload writes: `tables` names them as they are in `public`,
 * or as `schema.name` elsewhere (names as stored: unquoted, case kept).
 */
function ownTable(tables: string[], schema: string, name: string): boolean {
  return schema === 'public' ? tables.includes(name) : tables.includes(`${schema}.${name}`);
}

/**
 * Runs one statement of a plan. A statement may be a `COPY … FROM STDIN` followed by its
 * data lines and `\.` (as psql takes it): the data goes through the COPY protocol
 * (postgres.js's `writable()`), as an app loading rows would send it.
 */
export async function execute(sql: Pick<postgres.Sql, 'unsafe'>, text: string): Promise<void> {
  const copy = /^(COPY\s[^\n]*\sFROM STDIN);?\n([\s\S]*)\\\.$/.exec(text);
  if (!copy) {
    await sql.unsafe(text);
    return;
  }
  // postgres.js (3.4) loses an error the server reports once the data is all sent (a
  // unique violation on the last row, say): the stream's end then never comes. The error
  // still reaches the query's `reject`, so it is taken from there.
  const query = sql.unsafe(copy[1]!);
  const failed = new Promise<never>((_, reject) => {
    const own = query as unknown as { reject: (error: unknown) => void };
    const forward = own.reject;
    own.reject = (error) => {
      reject(error);
      forward(error);
    };
  });
  failed.catch(() => undefined);
  const stream = await query.writable();
  await Promise.race([pipeline(Readable.from([copy[2]!]), stream), failed]);
}

/** Marks a planned rollback (of a transaction or a savepoint). */
class PlannedRollback extends Error {}

/**
 * Sorts an error a write got into what the workload expects, or throws a
 * SuspectWriteError: an error raised inside a capture trigger (its context names a
 * `capture_` function), a unique violation on a table the workload does not write, a
 * deadlock that involves any other table (Trellis's ledger, a target) or a Trellis
 * session (application_name `trellis-pg…`), a lost connection when no restart is
 * expected, and any other error at all.
 */
async function classify(
  error: unknown,
  lookup: Pick<postgres.Sql, 'unsafe'>,
  tables: string[],
  options: Pick<WorkloadOptions, 'survivesRestarts'>,
  context: string,
): Promise<ExpectedError> {
  const e = (typeof error === 'object' && error !== null ? error : {}) as PgErrorFields;
  const suspect = (why: string) =>
    new SuspectWriteError(
      `${context}: ${why}: ${e.code ?? 'no code'} ${e.message ?? String(error)}` +
        (e.detail ? `\ndetail: ${e.detail}` : '') +
        (e.where ? `\ncontext: ${e.where}` : ''),
      { cause: error },
    );
  if (e.where?.includes('capture_')) throw suspect('raised inside a capture trigger');
  if (e.code && options.survivesRestarts && CONNECTION_LOST.has(e.code)) return 'connectionLost';
  if (e.code === UNIQUE_VIOLATION) {
    if (e.schema_name && e.table_name && ownTable(tables, e.schema_name, e.table_name)) {
      return 'uniqueViolation';
    }
    throw suspect('a unique violation on a table the workload does not write');
  }
  if (e.code === DEADLOCK_DETECTED) {
    const detail = e.detail ?? '';
    const relations = [...detail.matchAll(/relation (\d+) of database/g)].map((m) => m[1]!);
    const pids = [...detail.matchAll(/process (\d+)/g)].map((m) => Number(m[1]));
    let found: Array<{ oid: string; schema: string; name: string }>;
    let trellisSessions: Array<{ pid: number }>;
    try {
      // A relation is named by its table (an index counts as its table).
      found = await lookup.unsafe(
        `SELECT c.oid::text AS oid, n.nspname AS schema, coalesce(t.relname, c.relname) AS name
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           LEFT JOIN pg_index i ON i.indexrelid = c.oid
           LEFT JOIN pg_class t ON t.oid = i.indrelid
          WHERE c.oid = ANY($1::oid[])`,
        [relations],
      );
      trellisSessions = await lookup.unsafe(
        `SELECT pid FROM pg_stat_activity
          WHERE pid = ANY($1::int[]) AND application_name LIKE 'trellis-pg%'`,
        [pids],
      );
    } catch (lookupError) {
      const code = (lookupError as PgErrorFields).code;
      if (code && options.survivesRestarts && CONNECTION_LOST.has(code)) return 'connectionLost';
      throw lookupError;
    }
    const own = (r: { schema: string; name: string }) => ownTable(tables, r.schema, r.name);
    const others = relations.filter((oid) => !found.some((r) => r.oid === oid && own(r)));
    if (others.length > 0) {
      const names = others.map((oid) => {
        const r = found.find((f) => f.oid === oid);
        return r ? `${r.schema}.${r.name}` : `relation ${oid} (gone)`;
      });
      throw suspect(`a deadlock involving ${names.join(', ')}`);
    }
    if (trellisSessions.length > 0) {
      throw suspect(`a deadlock with a Trellis session (pid ${trellisSessions[0]!.pid})`);
    }
    return 'deadlock';
  }
  throw suspect('an unexpected error');
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms)); // pacing of the writers (below)

/**
 * A transaction step written out (BEGIN, SAVEPOINT, ROLLBACK TO, COMMIT or ROLLBACK) on a
 * client of one connection, for workloads that live through restarts: postgres.js's
 * begin() sends its ROLLBACK on a connection the server has closed, and throws from a
 * timer then (porsager/postgres#1208). Here a lost connection gets nothing more: the
 * error goes up and the writer takes a new client. Errors inside a savepoint roll back
 * to it (and are tallied); any other error rolls the transaction back.
 */
async function explicitTransaction(
  sql: postgres.Sql,
  step: Extract<Step, { kind: 'transaction' }>,
  tally: (error: unknown, where: string) => Promise<void>,
): Promise<{ statements: number; savepointsRolledBack: number }> {
  let statements = 0;
  let savepointsRolledBack = 0;
  await sql.unsafe('BEGIN');
  try {
    for (const part of step.body) {
      if (typeof part === 'string') {
        await execute(sql, part);
        statements += 1;
        continue;
      }
      await sql.unsafe('SAVEPOINT trellis_workload');
      try {
        for (const s of part.savepoint) await execute(sql, s);
      } catch (error) {
        if (isConnectionLoss(error)) throw error;
        await sql.unsafe('ROLLBACK TO SAVEPOINT trellis_workload');
        await tally(error, `in a savepoint: ${part.savepoint}`);
        continue;
      }
      if (part.rollback) {
        await sql.unsafe('ROLLBACK TO SAVEPOINT trellis_workload');
        savepointsRolledBack += 1;
      } else {
        await sql.unsafe('RELEASE SAVEPOINT trellis_workload');
        statements += part.savepoint.length;
      }
    }
    await sql.unsafe(step.rollback ? 'ROLLBACK' : 'COMMIT');
  } catch (error) {
    if (!isConnectionLoss(error)) await sql.unsafe('ROLLBACK').catch(() => undefined);
    throw error;
  }
  return { statements: step.rollback ? 0 : statements, savepointsRolledBack };
}

function isConnectionLoss(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && CONNECTION_LOST.has(code);
}

/**
 * Runs a workload: every writer its plan, at once. Resolves with what happened; rejects
 * with the first SuspectWriteError (the other writers stop at their next step).
 */
export async function runWorkload(
  shared: postgres.Sql,
  shape: WorkloadShape,
  options: WorkloadOptions,
): Promise<WorkloadResult> {
  if (options.survivesRestarts && !options.newClient) {
    throw new Error('survivesRestarts needs newClient (a client per writer)');
  }
  return runPlan(shared, planWorkload(shape, options), shape.tables, options);
}

/**
 * Runs a plan made elsewhere (each writer its steps, at once) on tables named
 * `tables`, sorting the errors writes get as runWorkload does.
 */
export async function runPlan(
  shared: postgres.Sql,
  plan: Step[][],
  tables: string[],
  options: Omit<
    WorkloadOptions,
    'seed' | 'writers' | 'operations' | 'truncates' | 'longTransactions'
  >,
): Promise<WorkloadResult> {
  const result: WorkloadResult = {
    operations: Math.max(0, ...plan.map((steps) => steps.length)),
    fingerprint: planFingerprint(plan),
    committed: 0,
    rolledBack: 0,
    savepointsRolledBack: 0,
    longTransactions: 0,
    truncates: 0,
    elapsedMs: 0,
    expected: { uniqueViolation: 0, deadlock: 0, connectionLost: 0 },
  };
  const started = Date.now();
  let failure: unknown;

  const writer = async (steps: Step[], index: number) => {
    let sql = options.newClient ? options.newClient() : shared;
    // `lookup`: where a deadlock's relations and processes are looked up. Inside a
    // transaction, its own connection: one from the pool could be the last free one,
    // waited for while every other is held by a writer blocked on this transaction's locks.
    const tally = async (
      error: unknown,
      context: string,
      lookup: Pick<postgres.Sql, 'unsafe'> = sql,
    ) => {
      if (error instanceof SuspectWriteError) throw error;
      const kind = await classify(error, lookup, tables, options, `writer ${index} ${context}`);
      result.expected[kind] += 1;
      if (kind === 'connectionLost' && options.newClient) {
        // A client that lost its connection is not reused.
        void sql.end({ timeout: 0 });
        sql = options.newClient();
        await sleep(50); // back-off before a new client
      }
    };
    try {
      for (const [at, step] of steps.entries()) {
        for (const hold of [options.holdAt ?? []].flat()) {
          if (at === hold.step) await hold.until.catch(() => undefined);
        }
        if (failure !== undefined) break;
        const context = `step ${at} (${step.kind === 'transaction' ? 'transaction' : step.sql})`;
        try {
          if (step.kind !== 'transaction') {
            await execute(sql, step.sql);
            if (step.kind === 'truncate') result.truncates += 1;
            else result.committed += 1;
            continue;
          }
          let statements = 0;
          let savepointsRolledBack = 0;
          if (options.survivesRestarts) {
            const done = await explicitTransaction(sql, step, (error, where) =>
              tally(error, `${context}, ${where}`),
            );
            result.committed += done.statements;
            result.savepointsRolledBack += done.savepointsRolledBack;
            if (step.rollback) result.rolledBack += 1;
            continue;
          }
          await sql.begin(async (tx) => {
            for (const [i, part] of step.body.entries()) {
              if (typeof part === 'string') {
                await execute(tx, part);
                statements += 1;
              } else {
                try {
                  const kept = await tx.savepoint(async (sp) => {
                    for (const s of part.savepoint) await execute(sp, s);
                    if (part.rollback) throw new PlannedRollback();
                    return part.savepoint.length;
                  });
                  statements += kept;
                } catch (error) {
                  // A savepoint's error rolls back to it; the transaction goes on.
                  if (error instanceof PlannedRollback) savepointsRolledBack += 1;
                  else await tally(error, `${context}, in a savepoint: ${part.savepoint}`, tx);
                }
              }
              if (step.holdMs > 0 && i < step.body.length - 1) await sleep(step.holdMs); // pacing: a transaction held open
            }
            if (step.rollback) throw new PlannedRollback();
          });
          result.committed += statements;
          result.savepointsRolledBack += savepointsRolledBack;
          if (step.holdMs > 0) result.longTransactions += 1;
        } catch (error) {
          if (error instanceof PlannedRollback) result.rolledBack += 1;
          else await tally(error, context);
        } finally {
          options.onStep?.();
        }
      }
    } catch (error) {
      failure ??= error;
    } finally {
      if (options.newClient) await sql.end({ timeout: 2 });
    }
  };
  await Promise.all(plan.map(writer));
  result.elapsedMs = Date.now() - started;
  if (failure !== undefined) throw failure;
  return result;
}
