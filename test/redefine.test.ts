import type postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { sqlClient } from './support/database.js';
import { livePipeline } from './support/live.js';
import { holdRead } from './support/long-reader.js';
import { type Definition, definitionQuery, transformStatement } from './support/oracle.js';
import { rejection, waitFor } from './support/trellis.js';

// ALTER TRANSFORM t AS <definition> (issue #25 item 1, ADR 0055): the new definition is
// built beside the old one while writers keep writing and readers keep reading; then the
// target is switched in one short transaction, keeping its identity (OID, grants, the
// app's indexes, views). Readers never see an error, a missing table or a half-built
// target: every read made while the switch can happen is the old definition's contents or
// the new one's, exactly.

const live = livePipeline();

/** Writers, readers and two builds on a shared machine: more than the default minute. */
const LOAD = { timeout: 180_000 };

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

/**
 * A target's rows as a reader sees them (canonical text, as rowsOf), without the columns a
 * redefinition stages on it before its switch (`trellis#<id>#<n>`, ADR 0055's addendum):
 * the definition's columns are what is compared. `staged`: how many such columns the read
 * saw.
 */
function targetRowsOf(target: string): string {
  return `SELECT coalesce(jsonb_agg(r.j ORDER BY r.j::text), '[]')::text AS rows,
                 (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = '${target}'::regclass
                     AND a.attnum > 0 AND NOT a.attisdropped AND starts_with(a.attname, 'trellis#'))::int AS staged
            FROM (SELECT to_jsonb(x) - ARRAY(SELECT k FROM jsonb_object_keys(to_jsonb(x)) k
                                              WHERE starts_with(k, 'trellis#')) AS j
                    FROM ${target} x) r`;
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
  /** Reads that saw a redefinition's staged columns beside the definition's. */
  sawStaged = 0;
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
        const [row] = await this.sql.unsafe<{ rows: string; n: number; staged: number }[]>(
          `SELECT x.rows, x.staged, jsonb_array_length(x.rows::jsonb) AS n FROM (${targetRowsOf(this.target)}) x`,
        );
        this.fewest = Math.min(this.fewest, row!.n);
        if (row!.staged > 0) this.sawStaged += 1;
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

async function targetOid(target: string): Promise<number> {
  const [row] = await live.db.sql<{ oid: number }[]>`SELECT ${target}::regclass::oid AS oid`;
  return Number(row!.oid);
}

/** The id of `target`'s redefinition being built (its shadow). */
async function shadowIdOf(target: string): Promise<number> {
  const [row] = await live.db.sql<{ id: number }[]>`
    SELECT x.id FROM trellis.transforms x JOIN trellis.transforms t ON t.id = x.redefines
     WHERE t.target_name = ${target}`;
  return row!.id;
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
  /**
   * The switch is staged (ADR 0055's addendum): the long reader is taken only once the
   * staged columns are on the target, and the writers keep writing while they are filled
   * (the fill goes on under a long reader; the switch waits for it).
   */
  staged?: boolean;
}

async function stagedColumns(target: string): Promise<number> {
  const [row] = await live.db.sql<{ n: number }[]>`
    SELECT count(*)::int AS n FROM pg_attribute
     WHERE attrelid = ${target}::regclass AND attnum > 0 AND NOT attisdropped
       AND starts_with(attname, 'trellis#')`;
  return row!.n;
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
  let release = s.staged ? undefined : await holdRead(live.db.url, old.target);
  const result = await live.trellis.apply(alterStatement(s.next));
  expect(result.kind).toBe('redefining');
  if (s.staged) {
    // Taken from a session already connected, the moment the staged columns are there: the
    // worker fills and switches from its next pass on.
    release = await holdRead(live.db.url, old.target, async (tx) => {
      await waitFor(async () => {
        const [row] = await tx.unsafe<{ n: number }[]>(
          `SELECT count(*)::int AS n FROM pg_attribute WHERE attrelid = '${old.target}'::regclass
              AND attnum > 0 AND NOT attisdropped AND starts_with(attname, 'trellis#')`,
        );
        return row!.n > 0;
      }, 'the staged columns');
    });
    await reader.readMore(3);
    expect(reader.sawStaged).toBeGreaterThan(0);
  }
  await writer.wroteMore(40);
  await writer.stop();
  const shadow = await liveShadow(old.target);
  await convergedById(shadow);
  await live.converged(s.before, { ignoreStaged: s.staged === true });
  const before = await contents(old);
  const after = await contents(s.next);
  expect(before).not.toBe(after);
  const floor = JSON.parse(before).length;
  reader.keep = true;
  await release!();
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
  // Staged columns are the target's own after the switch: none is left under its name.
  expect(await stagedColumns(old.target)).toBe(0);
  const switched = await redefinition(old.target);
  if (s.staged) {
    expect(switched?.staged).toBe(true);
    expect(switched?.readersBlockedMs).toBeDefined();
  }
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
  it(
    'a projection: a column dropped, two added, another filter (AS SELECT form)',
    LOAD,
    async () => {
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
    },
  );

  it(
    'a GROUP BY: another key, other aggregates (the key constraint replaced, FROM-first form)',
    LOAD,
    async () => {
      await makeItems('rd_g_items');
      await redefineUnderLoad({
        before: [
          {
            target: 'rd_g',
            from: 'rd_g_items',
            select: 'cat, count(*) AS n, sum(price) AS total',
            groupBy: 'cat',
          },
        ],
        next: {
          target: 'rd_g',
          from: 'rd_g_items',
          select: 'qty, count(*) AS n, max(price) AS top, sum(price) AS total',
          where: 'price > 2',
          groupBy: 'qty',
          key: ['qty'],
        },
        writes: churn('rd_g_items'),
      });
    },
  );

  it(
    'column types changed and a column added, staged and filled under writers and a long reader',
    LOAD,
    async () => {
      await makeItems('rd_t_items');
      await redefineUnderLoad({
        before: [
          {
            target: 'rd_t',
            from: 'rd_t_items',
            select: 'name, price, qty',
            where: 'qty < 9',
            implicit: 'id',
          },
        ],
        next: {
          target: 'rd_t',
          from: 'rd_t_items',
          select: 'name, price::float8 AS price, qty::bigint AS qty, upper(name) AS shout',
          where: 'qty < 8',
          implicit: 'id',
        },
        writes: churn('rd_t_items'),
        staged: true,
      });
      const types = await live.db.sql<{ name: string; type: string; notnull: boolean }[]>`
        SELECT attname AS name, format_type(atttypid, atttypmod) AS type, attnotnull AS notnull
          FROM pg_attribute WHERE attrelid = 'rd_t'::regclass AND attnum > 0 AND NOT attisdropped
         ORDER BY attname`;
      expect(types).toEqual([
        { name: 'id', type: 'integer', notnull: true },
        { name: 'name', type: 'text', notnull: false },
        { name: 'price', type: 'double precision', notnull: false },
        { name: 'qty', type: 'bigint', notnull: false },
        { name: 'shout', type: 'text', notnull: false },
      ]);
    },
  );

  it(
    'a join: a column added, the filter changed, the key and the join index kept',
    LOAD,
    async () => {
      await makeItems('rd_j_items');
      await live.db.sql.unsafe(`
      CREATE TABLE rd_j_cats (id int PRIMARY KEY, label text NOT NULL);
      INSERT INTO rd_j_cats SELECT i, 'cat ' || i FROM generate_series(0, 6) i;`);
      await redefineUnderLoad({
        before: [
          {
            target: 'rd_j',
            from: 'rd_j_items i JOIN rd_j_cats c ON c.id = i.cat',
            select: 'i.name, c.label',
            implicit: 'i.id AS id, c.id AS c_id',
          },
        ],
        next: {
          target: 'rd_j',
          from: 'rd_j_items i JOIN rd_j_cats c ON c.id = i.cat',
          select: 'i.name, c.label, i.price',
          where: "c.label <> 'cat 3'",
          implicit: 'i.id AS id, c.id AS c_id',
        },
        writes: (n) => [
          ...churn('rd_j_items')(n),
          `UPDATE rd_j_cats SET label = 'cat ' || id || '.' || ${n % 3} WHERE id = ${n % 7}`,
        ],
      });
    },
  );

  it(
    "a chain's upstream: the chain reads a column that changes type, follows it and is re-derived",
    LOAD,
    async () => {
      await makeItems('rd_c_items');
      const up: Definition = {
        target: 'rd_up',
        from: 'rd_c_items',
        select: 'name, price, qty',
        implicit: 'id',
      };
      const next: Definition = {
        target: 'rd_up',
        from: 'rd_c_items',
        select: 'name, price * 2 AS price, qty::bigint AS qty',
        where: 'qty < 8',
        implicit: 'id',
      };
      const down: Definition = {
        target: 'rd_down',
        from: 'rd_up',
        select: 'qty, count(*) AS n, sum(price) AS total',
        groupBy: 'qty',
        reads: [up],
      };
      await redefineUnderLoad({
        before: [up, down],
        next,
        writes: churn('rd_c_items'),
        after: [{ ...down, reads: [next] }],
      });
      const [type] = await live.db.sql<{ type: string }[]>`
      SELECT format_type(atttypid, atttypmod) AS type FROM pg_attribute
       WHERE attrelid = 'rd_down'::regclass AND attname = 'qty'`;
      expect(type!.type).toBe('bigint');
    },
  );
});

describe('ALTER TRANSFORM … AS: what the target keeps, and what refuses it', () => {
  it('keeps grants, an app index, a comment and a view over it; says what the switch does', async () => {
    await makeItems('rd_d_items');
    const d: Definition = {
      target: 'rd_dep',
      from: 'rd_d_items',
      select: 'name, price, qty',
      implicit: 'id',
    };
    await live.define(d);
    await live.db.sql.unsafe(`
      DO $$ BEGIN CREATE ROLE rd_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
      GRANT SELECT ON rd_dep TO rd_reader;
      CREATE INDEX rd_dep_name ON rd_dep (name);
      COMMENT ON TABLE rd_dep IS 'read by the reports';
      CREATE VIEW rd_dep_view AS SELECT id, name FROM rd_dep WHERE id <= 50;`);
    const oid = await targetOid('rd_dep');
    const [index] = await live.db.sql<
      { oid: number }[]
    >`SELECT 'rd_dep_name'::regclass::oid AS oid`;
    const next: Definition = {
      ...d,
      select: 'name, price * 2 AS price, qty::bigint AS qty, note',
    };
    const result = await live.trellis.apply(alterStatement(next));
    expect(result).toEqual({
      kind: 'redefining',
      target: 'rd_dep',
      changes: ['column qty retyped from integer to bigint', 'column note added (text)'],
    });
    // Nothing else is altered while it is built.
    const busy = await rejection(live.trellis.apply('ALTER TRANSFORM rd_dep ADD COLUMN 1 AS one'));
    expect(busy).toMatchObject({ code: 'conflict' });
    expect(busy.message).toContain('is being redefined');
    await waitFor(
      async () => (await redefinition('rd_dep'))?.state === 'switched',
      'rd_dep to switch',
      40_000,
    );
    await live.converged([next]);
    expect(await targetOid('rd_dep')).toBe(oid);
    const [kept] = await live.db.sql<
      { granted: boolean; index: number; comment: string; viewed: number }[]
    >`
      SELECT has_table_privilege('rd_reader', 'rd_dep', 'SELECT') AS granted,
             to_regclass('rd_dep_name')::oid AS index,
             obj_description('rd_dep'::regclass, 'pg_class') AS comment,
             (SELECT count(*)::int FROM rd_dep_view) AS viewed`;
    expect(kept).toEqual({
      granted: true,
      index: index!.oid,
      comment: 'read by the reports',
      viewed: 50,
    });
    const recorded = await redefinition('rd_dep');
    const shown = (await live.trellis.status('rd_dep')).redefinition;
    expect(shown).toMatchObject({ state: 'switched', error: null });
    expect(shown?.lockMs).toBeGreaterThanOrEqual(0);
    expect(recorded).toMatchObject({
      state: 'switched',
      changes: ['column qty retyped from integer to bigint', 'column note added (text)'],
    });
  });

  it('refuses a change Postgres would drop or refuse dependants for, naming them', async () => {
    await makeItems('rd_r_items');
    const d: Definition = {
      target: 'rd_ref',
      from: 'rd_r_items',
      select: 'name, price, qty',
      implicit: 'id',
    };
    await live.define(d);
    await live.db.sql.unsafe(`
      CREATE INDEX rd_ref_qty ON rd_ref (qty);
      CREATE VIEW rd_ref_names AS SELECT id, name FROM rd_ref;
      CREATE TABLE rd_ref_notes (ref int REFERENCES rd_ref (id), body text);`);
    // A column a view reads and one an index is on, dropped.
    const dropped = await rejection(
      live.trellis.apply('ALTER TRANSFORM rd_ref AS FROM rd_r_items SELECT id, price'),
    );
    expect(dropped).toMatchObject({ code: 'conflict' });
    expect(dropped.message).toContain(
      'column name would be dropped, and view rd_ref_names depends on it',
    );
    expect(dropped.message).toContain(
      'column qty would be dropped, and index rd_ref_qty depends on it',
    );
    // A column a view reads, retyped.
    const retyped = await rejection(
      live.trellis.apply(
        'ALTER TRANSFORM rd_ref AS SELECT id, name::varchar(20) AS name, price, qty FROM rd_r_items',
      ),
    );
    expect(retyped.message).toContain(
      'column name would change type from text to character varying(20), which Postgres refuses while view rd_ref_names reads it',
    );
    // Another key, which a foreign key references.
    const rekeyed = await rejection(
      live.trellis.apply(
        'ALTER TRANSFORM rd_ref AS SELECT qty, count(*) AS n FROM rd_r_items GROUP BY qty',
      ),
    );
    expect(rekeyed.message).toContain(
      'its key would change from (id) to (qty), and foreign key rd_ref_notes_ref_fkey of rd_ref_notes references it',
    );
    // Nothing was started; the transform is as it was.
    expect(await redefinition('rd_ref')).toBeNull();
    await live.converged([d]);
  });
});

describe("ALTER TRANSFORM … AS: the switch's pre-check counts the locks that conflict with its own", () => {
  it(
    'a plain long reader (ACCESS SHARE) does not hold a filter change off (EXCLUSIVE); a SELECT … FOR SHARE one (ROW SHARE) does, and status() says why until it ends',
    LOAD,
    async () => {
      await makeItems('rd_pc_items');
      const v1: Definition = {
        target: 'rd_pc',
        from: 'rd_pc_items',
        select: 'name, price',
        where: 'price > 3',
        implicit: 'id',
      };
      await live.define(v1);
      const oid = await targetOid('rd_pc');
      // A plain report reading the target, older than the switch's lock timeout.
      const plain = await holdRead(live.db.url, 'rd_pc', undefined, 'ACCESS SHARE');
      const v2: Definition = { ...v1, where: 'price > 30' };
      expect((await live.trellis.apply(alterStatement(v2))).kind).toBe('redefining');
      try {
        await waitFor(
          async () => (await redefinition('rd_pc'))?.state === 'switched',
          'rd_pc to switch beside the plain reader',
          30_000,
        );
      } finally {
        await plain();
      }
      await live.converged([v2]);
      expect((await redefinition('rd_pc'))?.readersBlockedMs).toBe(0);

      // A reader locking rows (ROW SHARE) conflicts with EXCLUSIVE: no attempt while it runs.
      const locking = await holdRead(live.db.url, 'rd_pc', undefined, 'ROW SHARE');
      const v3: Definition = { ...v1, where: 'price > 60' };
      expect((await live.trellis.apply(alterStatement(v3))).kind).toBe('redefining');
      let released = false;
      try {
        await waitFor(
          async () =>
            /^waiting: the switch takes EXCLUSIVE on the target, and the transaction of pid \d+ \(begun .+\) holds RowShareLock on it/.test(
              String((await live.trellis.status('rd_pc')).redefinition?.error),
            ),
          'status() to say what the switch waits for',
          30_000,
        );
        // Still building a while later: held off for as long as the reader runs.
        await new Promise((resolve) => setTimeout(resolve, 1500));
        expect((await redefinition('rd_pc'))?.state).toBe('building');
        await locking();
        released = true;
      } finally {
        if (!released) await locking();
      }
      await waitFor(
        async () => (await redefinition('rd_pc'))?.state === 'switched',
        'rd_pc to switch once the locking reader ended',
        30_000,
      );
      expect((await redefinition('rd_pc'))?.error).toBeUndefined();
      await live.converged([v3]);
      expect(await targetOid('rd_pc')).toBe(oid);
    },
  );
});

describe("ALTER TRANSFORM … AS: a filter change's switch diffs the keys logged since a first pass, not the whole target", () => {
  it(
    'under writers flipping rows in and out of both filters, the switch writes the logged keys only and the target equals the new definition; the log and its triggers go',
    LOAD,
    async () => {
      await live.db.sql.unsafe(`
        CREATE TABLE rd_lg_items (id int PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY (START 100000),
                                  name text NOT NULL, price numeric NOT NULL, qty int NOT NULL);
        INSERT INTO rd_lg_items (id, name, price, qty)
        SELECT i, 'n' || i, i % 1000, i % 10 FROM generate_series(1, 20000) i;
        -- A row no writer below touches (they update and delete ids up to 20,000).
        INSERT INTO rd_lg_items (id, name, price, qty) VALUES (30000, 'kept', 950, 1);`);
      const v1: Definition = {
        target: 'rd_lg',
        from: 'rd_lg_items',
        select: 'name, price, qty',
        where: 'price > 100',
        implicit: 'id',
      };
      await live.define(v1);
      const oid = await targetOid('rd_lg');
      // Writers flip rows across both filters (price 100 and 900), change a kept column, insert
      // and delete, before, during and after the log's first pass and the switch.
      const writer = new Writer((n) => [
        `UPDATE rd_lg_items SET price = CASE WHEN price > 500 THEN price - 850 ELSE price + 850 END
          WHERE id = ${1 + ((n * 37) % 20000)}`,
        `UPDATE rd_lg_items SET qty = qty + 1 WHERE id = ${1 + ((n * 53) % 20000)}`,
        `INSERT INTO rd_lg_items (name, price, qty) VALUES ('w${n}', ${(n * 131) % 1000}, ${n % 10})`,
        `DELETE FROM rd_lg_items WHERE id = ${1 + ((n * 71) % 20000)}`,
      ]);
      const reader = new Reader('rd_lg');
      await writer.wroteMore(20);
      // A report locking rows holds the switch off (not the log): the log's first pass is
      // done, then keeps up with the writes through its triggers while the switch waits.
      const release = await holdRead(live.db.url, 'rd_lg');
      const v2: Definition = { ...v1, where: 'price > 900' };
      expect((await live.trellis.apply(alterStatement(v2))).kind).toBe('redefining');
      const loggedKeys = async () => {
        const [row] = await live.db.sql<
          { done: boolean }[]
        >`SELECT l.done FROM trellis.redefine_logs l`;
        if (!row?.done) return null;
        const [count] = await live.db.sql.unsafe<{ n: number }[]>(
          `SELECT count(*)::int AS n FROM trellis."redefine_log#${await shadowIdOf('rd_lg')}"`,
        );
        return count!.n;
      };
      let first: number | null = null;
      await waitFor(
        async () => {
          first = await loggedKeys();
          return first !== null;
        },
        'the first pass',
        60_000,
      );
      // A row both definitions keep, changed: its key is logged by the triggers.
      await live.db.sql`UPDATE rd_lg_items SET name = name || '!' WHERE id = 30000`;
      const [kept] = await live.db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM rd_lg_items WHERE id = 30000 AND price > 900`;
      expect(kept!.n).toBe(1);
      await waitFor(async () => {
        const [row] = await live.db.sql.unsafe<{ n: number }[]>(
          `SELECT count(*)::int AS n FROM trellis."redefine_log#${await shadowIdOf('rd_lg')}" WHERE id = 30000`,
        );
        return row!.n === 1;
      }, 'the changed key to be logged');
      expect((await loggedKeys())!).toBeGreaterThan(first!);
      expect((await redefinition('rd_lg'))?.state).toBe('building');
      await release();
      await waitFor(
        async () => (await redefinition('rd_lg'))?.state === 'switched',
        'rd_lg to switch',
        90_000,
      );
      await writer.wroteMore(40);
      await writer.stop();
      await reader.stop();
      expect(writer.errors).toEqual([]);
      expect(reader.errors).toEqual([]);
      await live.converged([v2]);
      expect(await targetOid('rd_lg')).toBe(oid);
      const switched = (await redefinition('rd_lg'))!;
      // The keys the switch looked at: those that differ (rows price 100..900 went) and
      // those written since the first pass, not the 18,000 rows the target held.
      const logged = Number(switched.logged);
      expect(logged).toBeGreaterThanOrEqual(Number(switched.deleted) + Number(switched.written));
      expect(logged).toBeGreaterThan(0);
      const [rows] = await live.db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM rd_lg_items WHERE price > 100`;
      expect(Number(switched.deleted)).toBeGreaterThan(0);
      expect(logged).toBeLessThan(rows!.n);
      expect(switched.readersBlockedMs).toBe(0);
      // The log's table and its triggers go after the switch.
      await waitFor(async () => {
        const [left] = await live.db.sql<{ n: number }[]>`
          SELECT (SELECT count(*) FROM pg_trigger WHERE starts_with(tgname, 'trellis_log#'))
               + (SELECT count(*) FROM pg_class WHERE starts_with(relname, 'redefine_log#'))
               + (SELECT count(*) FROM trellis.redefine_logs) AS n`;
        return Number(left!.n) === 0;
      }, 'the log and its triggers to go');
      // Maintained by the new definition from then on.
      await live.db.sql`UPDATE rd_lg_items SET price = 950 WHERE id <= 50`;
      await live.converged([v2]);
    },
  );
});

describe('ALTER TRANSFORM … AS: the statement, and a redefinition given up', () => {
  it('parses both forms, renders them back, and points at a mistake where it is', async () => {
    const rendered = async (statement: string) => {
      const [row] = await live.db.sql<{ text: string }[]>`
        SELECT trellis.render_statement(trellis.parse_statement(${statement})) AS text`;
      return row!.text;
    };
    expect(await rendered('alter transform t as select a, b total from s where a > 1')).toBe(
      'ALTER TRANSFORM t AS SELECT a, b total FROM s WHERE a > 1',
    );
    expect(await rendered('ALTER TRANSFORM t AS FROM s SELECT a AS a GROUP BY a')).toBe(
      'ALTER TRANSFORM t AS FROM s SELECT a AS a GROUP BY a',
    );
    const parse = await rejection(live.trellis.apply('ALTER TRANSFORM t AS SELEC a FROM s'));
    expect(parse).toMatchObject({ code: 'parse' });
    expect(parse.message).toBe('expected SELECT or FROM after AS, found "SELEC" at character 22');
    const inner = await rejection(live.trellis.apply('ALTER TRANSFORM t AS FROM s SELEC a'));
    // Positions are the ALTER statement's own (SELEC is read as an alias of s).
    expect(inner.message).toBe('expected JOIN or SELECT, found "a" at character 35');
    const missing = await rejection(live.trellis.apply('ALTER TRANSFORM nope AS FROM s SELECT a'));
    expect(missing).toMatchObject({ code: 'not_found' });
    const define = await rejection(live.trellis.define('ALTER TRANSFORM t AS FROM s SELECT a'));
    expect(define).toMatchObject({ code: 'validation' });
  });

  it('a dependant created while the new definition is built: the switch is refused, the old definition stays', async () => {
    await makeItems('rd_f_items');
    const d: Definition = {
      target: 'rd_fail',
      from: 'rd_f_items',
      select: 'name, price',
      implicit: 'id',
    };
    await live.define(d);
    const release = await holdRead(live.db.url, 'rd_fail');
    const result = await live.trellis.apply(
      'ALTER TRANSFORM rd_fail AS FROM rd_f_items SELECT id, name',
    );
    expect(result).toMatchObject({ kind: 'redefining', changes: ['column price dropped'] });
    await live.db.sql.unsafe('CREATE VIEW rd_fail_prices AS SELECT id, price FROM rd_fail');
    // The switch needs the target's lock, which the long reader holds: the view is there first.
    await release();
    await waitFor(
      async () => (await redefinition('rd_fail'))?.state === 'failed',
      'the redefinition to be given up',
    );
    expect(String((await redefinition('rd_fail'))?.error)).toContain(
      'column price would be dropped, and view rd_fail_prices depends on it',
    );
    // status() says it too, not only the catalog and the logs.
    const failed = (await live.trellis.status('rd_fail')).redefinition;
    expect(failed?.state).toBe('failed');
    expect(failed?.error).toContain('view rd_fail_prices depends on it');
    expect(failed?.at).toBeInstanceOf(Date);
    const [shadows] = await live.db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM trellis.transforms WHERE redefines IS NOT NULL`;
    expect(shadows!.n).toBe(0);
    await live.db.sql`UPDATE rd_f_items SET price = price + 1 WHERE id <= 10`;
    await live.converged([d]);
    expect((await live.trellis.status('rd_fail')).status).toBe('live');
  });
});
