import type postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { sqlClient } from './support/database.js';
import { livePipeline } from './support/live.js';
import { type Definition, definitionQuery, transformStatement } from './support/oracle.js';
import { rejection, waitFor } from './support/trellis.js';

// ALTER TRANSFORM t AS <definition> (issue #25 item 1, ADR 0055): the new definition is
// built beside the old one while writers keep writing and readers keep reading; then the
// target is switched in one short transaction, keeping its identity (OID, grants, the
// app's indexes, views). Readers never see an error, a missing table or a half-built
// target: every read made while the switch can happen is the old definition's contents or
// the new one's, exactly.

const live = livePipeline();

/** The redefinition statement for `d`, in the form `d` is written in. */
function alterStatement(d: Definition): string {
  const statement = transformStatement(d);
  if (d.form === 'as') return `ALTER ${statement}`;
  return `ALTER TRANSFORM ${d.target} AS ${statement.slice(`TRANSFORM ${d.target} `.length)}`;
}

/** A relation's rows as one canonical text (any column order, any row order). */
function rowsOf(relation: string): string {
  return `SELECT coalesce(jsonb_agg(to_jsonb(r) ORDER BY to_jsonb(r)::text), '[]')::text AS rows FROM ${relation} r`;
}

async function contents(d: Definition): Promise<string> {
  const [row] = await live.db.sql.unsafe<{ rows: string }[]>(rowsOf(`(${definitionQuery(d)})`));
  return row!.rows;
}

/** A writer running `statements` in a loop until stopped; it records every error it gets. */
class Writer {
  private stopped = false;
  readonly errors: string[] = [];
  writes = 0;
  private readonly sql: postgres.Sql;
  private readonly done: Promise<void>;

  constructor(private readonly statements: (n: number) => string[]) {
    this.sql = sqlClient(live.db.url, { max: 1 });
    this.done = this.run();
  }

  private async run(): Promise<void> {
    let n = 0;
    while (!this.stopped) {
      n += 1;
      for (const statement of this.statements(n)) {
        try {
          await this.sql.unsafe(statement);
          this.writes += 1;
        } catch (error) {
          this.errors.push(`${statement}: ${(error as Error).message}`);
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 3));
    }
  }

  async wroteMore(n: number): Promise<void> {
    const goal = this.writes + n;
    await waitFor(async () => this.writes >= goal, `${n} more writes`);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.done;
    await this.sql.end({ timeout: 2 });
  }
}

/**
 * Readers reading a target's rows in a loop: every error, the fewest rows seen, and, once
 * `keep` is set, every read as canonical text.
 */
class Reader {
  private stopped = false;
  readonly errors: string[] = [];
  fewest = Number.POSITIVE_INFINITY;
  keep = false;
  readonly kept: string[] = [];
  reads = 0;
  private readonly sql: postgres.Sql;
  private readonly done: Promise<void>;

  constructor(private readonly target: string) {
    this.sql = sqlClient(live.db.url, { max: 1 });
    this.done = this.run();
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      try {
        const keep = this.keep;
        const [row] = await this.sql.unsafe<{ rows: string; n: number }[]>(
          `SELECT x.rows, jsonb_array_length(x.rows::jsonb) AS n FROM (${rowsOf(this.target)}) x`,
        );
        this.fewest = Math.min(this.fewest, row!.n);
        if (keep) this.kept.push(row!.rows);
        this.reads += 1;
      } catch (error) {
        this.errors.push((error as Error).message);
      }
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
  }

  async readMore(n: number): Promise<void> {
    const goal = this.reads + n;
    await waitFor(async () => this.reads >= goal, `${n} more reads`);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.done;
    await this.sql.end({ timeout: 2 });
  }
}

/** Holds an ACCESS SHARE lock on a table (a long reader) until released. */
async function holdRead(table: string): Promise<() => Promise<void>> {
  const sql = sqlClient(live.db.url, { max: 1 });
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  let locked!: () => void;
  const isLocked = new Promise<void>((resolve) => {
    locked = resolve;
  });
  const done = sql.begin(async (tx) => {
    await tx.unsafe(`LOCK TABLE ${table} IN ACCESS SHARE MODE`);
    locked();
    await released;
  });
  await isLocked;
  return async () => {
    release();
    await done;
    await sql.end({ timeout: 2 });
  };
}

async function targetOid(target: string): Promise<number> {
  const [row] = await live.db.sql<{ oid: number }[]>`SELECT ${target}::regclass::oid AS oid`;
  return Number(row!.oid);
}

async function redefinition(target: string): Promise<Record<string, unknown> | null> {
  const [row] = await live.db.sql<{ r: Record<string, unknown> | null }[]>`
    SELECT redefinition AS r FROM trellis.transforms WHERE target_name = ${target} AND redefines IS NULL`;
  return row?.r ?? null;
}

/** The shadow of `target`'s redefinition: its id, once it is live. */
async function liveShadow(target: string): Promise<number> {
  let id = 0;
  await waitFor(
    async () => {
      const [row] = await live.db.sql<{ id: number; phase: string }[]>`
        SELECT x.id, p.phase FROM trellis.transforms x
          JOIN trellis.transforms t ON t.id = x.redefines
          JOIN trellis.pipeline p ON p.transform_id = x.id
         WHERE t.target_name = ${target}`;
      id = row?.id ?? 0;
      return row?.phase === 'live';
    },
    `the new definition of ${target} to be built`,
    40_000,
  );
  return id;
}

/** Waits until the transform `id` holds every write committed so far. */
async function convergedById(id: number): Promise<void> {
  const [token] = await live.db.sql<{ snap: string }[]>`SELECT pg_current_snapshot()::text AS snap`;
  await waitFor(async () => {
    const [row] = await live.db.sql<{ ok: boolean }[]>`
      SELECT trellis._converged(${id}, ${token!.snap}::pg_snapshot) AS ok`;
    return row?.ok === true;
  }, `transform ${id} to converge`);
}

interface Scenario {
  /** The transforms defined first: the last is the one redefined (others: a chain on it). */
  before: Definition[];
  next: Definition;
  writes: (n: number) => string[];
  /** Chains reading the target, as they are after the switch (checked by the oracle). */
  after?: Definition[];
}

/**
 * Defines the transforms, starts writers and a reader, redefines, and checks: no writer or
 * reader error; while the switch can happen (writes stopped, both definitions converged, a
 * long reader holding the switch off until then), every read is the old contents or the
 * new, exactly; the target keeps its OID; after more writes, it equals the new definition.
 */
async function redefineUnderLoad(s: Scenario): Promise<void> {
  for (const d of s.before) await live.define(d);
  const old = s.before.find((d) => d.target === s.next.target)!;
  const oid = await targetOid(old.target);
  const writer = new Writer(s.writes);
  const reader = new Reader(old.target);
  await writer.wroteMore(20);
  const release = await holdRead(old.target);
  const result = await live.trellis.apply(alterStatement(s.next));
  expect(result.kind).toBe('redefining');
  await writer.wroteMore(40);
  await writer.stop();
  const shadow = await liveShadow(old.target);
  await convergedById(shadow);
  await live.converged(s.before);
  const before = await contents(old);
  const after = await contents(s.next);
  expect(before).not.toBe(after);
  const floor = JSON.parse(before).length;
  reader.keep = true;
  await release();
  await waitFor(
    async () => (await redefinition(old.target))?.state === 'switched',
    `${old.target} to switch`,
  );
  await reader.readMore(3);
  await reader.stop();
  expect(reader.errors).toEqual([]);
  expect(writer.errors).toEqual([]);
  for (const read of reader.kept) {
    if (read !== before && read !== after) {
      throw new Error(`a read was neither definition's contents: ${read.slice(0, 300)}`);
    }
  }
  expect(reader.kept.at(-1)).toBe(after);
  expect(reader.fewest).toBeGreaterThan(0);
  expect(Math.min(floor, JSON.parse(after).length)).toBeGreaterThan(0);
  expect(await targetOid(old.target)).toBe(oid);
  // Maintained by its new definition from then on.
  const more = new Writer(s.writes);
  await more.wroteMore(20);
  await more.stop();
  expect(more.errors).toEqual([]);
  await live.converged([s.next, ...(s.after ?? [])]);
  const status = await live.trellis.status(old.target);
  expect(status.status).toBe('live');
  const [definition] = (await live.trellis.definitions()).filter((d) => d.target === old.target);
  expect(definition).toBeDefined();
  expect((await live.trellis.definitions()).some((d) => d.target.startsWith('redefine#'))).toBe(
    false,
  );
}

async function makeItems(table: string, rows = 300): Promise<void> {
  await live.db.sql.unsafe(`
    CREATE TABLE ${table} (id int PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY (START 100000),
                           name text NOT NULL, price numeric NOT NULL DEFAULT 1,
                           qty int NOT NULL DEFAULT 0, cat int NOT NULL DEFAULT 0, note text);
    INSERT INTO ${table} (id, name, price, qty, cat)
    SELECT i, 'n' || i, i * 1.5, i % 10, i % 7 FROM generate_series(1, ${rows}) i;`);
}

function churn(table: string): (n: number) => string[] {
  return (n) => [
    `UPDATE ${table} SET qty = qty + 1, price = price + 0.5 WHERE id = ${1 + ((n * 7) % 300)}`,
    `INSERT INTO ${table} (name, price, qty, cat) VALUES ('w${n}', ${n % 90}, ${n % 10}, ${n % 7})`,
    `DELETE FROM ${table} WHERE id = ${1 + ((n * 13) % 300)}`,
  ];
}

describe('ALTER TRANSFORM … AS: redefined in place under writers and readers', () => {
  it('a projection: a column dropped, two added, another filter (AS SELECT form)', async () => {
    await makeItems('rd_items');
    await redefineUnderLoad({
      before: [
        {
          target: 'rd_proj',
          from: 'rd_items',
          select: 'name, price',
          where: 'price > 3',
          implicit: 'id',
        },
      ],
      next: {
        target: 'rd_proj',
        form: 'as',
        from: 'rd_items',
        select: 'id, name, price * qty AS amount, qty',
        where: 'price > 30',
      },
      writes: churn('rd_items'),
    });
  });
});
