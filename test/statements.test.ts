import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Trellis, TrellisError } from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { migratedTrellis, rejection } from './support/trellis.js';

let db: TestDatabase;
let trellis: Trellis;

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE TABLE widgets (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2));
    CREATE TABLE customers (id bigint PRIMARY KEY, name text, region text);
    CREATE TABLE orders (
      id int PRIMARY KEY, customer_id bigint NOT NULL, amount numeric, status text,
      created_at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE no_key (a int, b int);
    CREATE VIEW widget_view AS SELECT * FROM widgets;
    CREATE SCHEMA "Other Schema";
    CREATE TABLE "Other Schema"."Src Table" ("Id" int PRIMARY KEY, "Amount" numeric);
  `);
  trellis = await migratedTrellis(db);
});

afterAll(async () => {
  await trellis?.shutdown();
});

async function columnsOf(table: string, schema = 'public') {
  return db.sql<{ name: string; type: string; notnull: boolean }[]>`
    SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS notnull
      FROM pg_attribute a
     WHERE a.attrelid = (quote_ident(${schema}) || '.' || quote_ident(${table}))::regclass
       AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`;
}

async function keyOf(
  table: string,
  schema = 'public',
): Promise<{ kind: string; columns: string[] }> {
  const [row] = await db.sql<{ kind: string; columns: string[] }[]>`
    SELECT CASE WHEN i.indisprimary THEN 'primary' ELSE 'unique' END AS kind,
           ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o) AS columns
      FROM pg_index i
     WHERE i.indrelid = (quote_ident(${schema}) || '.' || quote_ident(${table}))::regclass
       AND (i.indisprimary OR i.indisunique)
     ORDER BY i.indisprimary DESC LIMIT 1`;
  return row ?? { kind: 'none', columns: [] };
}

async function expectError(statement: string, code: string, ...fragments: string[]) {
  const error = await rejection(trellis.apply(statement));
  expect(error).toBeInstanceOf(TrellisError);
  expect({ code: error.code, message: error.message }).toMatchObject({ code });
  for (const fragment of fragments) expect(error.message).toContain(fragment);
  return error as unknown as TrellisError;
}

describe('TRANSFORM', () => {
  it('defines a projection: the target is created, keyed by the source key, typed by Postgres', async () => {
    expect(
      await trellis.apply('TRANSFORM widget_prices FROM widgets SELECT price AS price'),
    ).toEqual({ kind: 'transform_defined', target: 'widget_prices' });
    expect(await columnsOf('widget_prices')).toEqual([
      { name: 'price', type: 'numeric(10,2)', notnull: false },
      { name: 'id', type: 'integer', notnull: true },
    ]);
    expect(await keyOf('widget_prices')).toEqual({ kind: 'primary', columns: ['id'] });
    const [definition] = (await trellis.definitions()).filter((d) => d.target === 'widget_prices');
    expect(definition).toMatchObject({
      target: 'widget_prices',
      targetSchema: 'public',
      statement: 'TRANSFORM widget_prices FROM public.widgets SELECT price AS price',
      sources: [{ table: 'public.widgets', alias: 'widgets', join: null, keyColumns: ['id'] }],
      columns: [
        { name: 'price', type: 'numeric(10,2)', key: false, implicit: false },
        { name: 'id', type: 'integer', key: true, implicit: true },
      ],
      options: { withoutSourceIndex: false },
      aggregates: false,
    });
    expect(definition?.createdAt).toBeInstanceOf(Date);
    const status = await trellis.status('widget_prices');
    expect(status).toMatchObject({
      target: 'widget_prices',
      status: 'waiting_to_backfill',
      heldKeys: 0,
      pausedColumns: [],
    });
  });

  it('keys an aggregate by its GROUP BY expressions (the headline example)', async () => {
    await trellis.define(
      'TRANSFORM customer_totals FROM orders SELECT customer_id, sum(amount) AS total, count(*) AS n GROUP BY customer_id',
    );
    expect(await columnsOf('customer_totals')).toEqual([
      { name: 'customer_id', type: 'bigint', notnull: true },
      { name: 'total', type: 'numeric', notnull: false },
      { name: 'n', type: 'bigint', notnull: false },
    ]);
    expect(await keyOf('customer_totals')).toEqual({ kind: 'primary', columns: ['customer_id'] });
    const [definition] = (await trellis.definitions()).filter(
      (d) => d.target === 'customer_totals',
    );
    expect(definition?.aggregates).toBe(true);
  });

  it('keys a nullable GROUP BY expression with NULLS NOT DISTINCT, and adds a key the SELECT lacks', async () => {
    await trellis.apply(
      `TRANSFORM region_sales FROM orders o JOIN customers c ON c.id = o.customer_id
       SELECT sum(o.amount) AS total GROUP BY c.region, date_trunc('day', o.created_at)`,
    );
    const columns = await columnsOf('region_sales');
    expect(columns.map((c) => c.name)).toEqual(['total', 'region', 'date_trunc']);
    expect(await keyOf('region_sales')).toEqual({
      kind: 'unique',
      columns: ['region', 'date_trunc'],
    });
  });

  it('keys a join by both sides’ keys, naming a clashing implicit key alias_column', async () => {
    await trellis.apply(
      `TRANSFORM order_lines FROM orders AS o
         LEFT JOIN customers c ON c.id = o.customer_id
       SELECT o.amount, c.name AS customer WHERE o.status <> 'void'`,
    );
    expect((await columnsOf('order_lines')).map((c) => c.name)).toEqual([
      'amount',
      'customer',
      'id',
      'c_id',
    ]);
    expect(await keyOf('order_lines')).toEqual({ kind: 'unique', columns: ['id', 'c_id'] });
    const [definition] = (await trellis.definitions()).filter((d) => d.target === 'order_lines');
    expect(definition?.sources).toEqual([
      { table: 'public.orders', alias: 'o', join: null, keyColumns: ['id'] },
      { table: 'public.customers', alias: 'c', join: 'left', keyColumns: ['id'] },
    ]);
  });

  it('uses a selected key column as the key instead of adding one', async () => {
    await trellis.apply('TRANSFORM named_widgets FROM widgets w SELECT w.id AS widget_id, w.name');
    expect((await columnsOf('named_widgets')).map((c) => c.name)).toEqual(['widget_id', 'name']);
    expect(await keyOf('named_widgets')).toEqual({ kind: 'primary', columns: ['widget_id'] });
  });

  it('takes a bare label the way Postgres reads it', async () => {
    await trellis.apply(
      'TRANSFORM labelled FROM widgets SELECT price p, price::double precision, name || id label',
    );
    expect((await columnsOf('labelled')).map((c) => c.name)).toEqual(['p', 'price', 'label', 'id']);
    const [definition] = (await trellis.definitions()).filter((d) => d.target === 'labelled');
    expect(definition?.statement).toContain('SELECT price AS p, price::double precision AS price');
  });

  it('records HAVING, WHERE and WITHOUT SOURCE INDEX', async () => {
    await trellis.apply(
      `transform big_customers from orders select customer_id, count(*) filter (where status = 'paid') as paid
        where amount > 0 group by customer_id having sum(amount) > 100 without source index;`,
    );
    const [definition] = (await trellis.definitions()).filter((d) => d.target === 'big_customers');
    expect(definition?.options.withoutSourceIndex).toBe(true);
    expect(definition?.statement).toMatch(/WHERE .*GROUP BY .*HAVING .*WITHOUT SOURCE INDEX$/);
  });

  it('handles quoted, mixed-case identifiers and qualified sources in other schemas', async () => {
    await trellis.apply(
      'TRANSFORM "Mixed Target" FROM "Other Schema"."Src Table" AS s SELECT s."Amount" AS "Total Amount"',
    );
    expect(await columnsOf('Mixed Target')).toEqual([
      { name: 'Total Amount', type: 'numeric', notnull: false },
      { name: 'Id', type: 'integer', notnull: true },
    ]);
    const [definition] = (await trellis.definitions()).filter((d) => d.target === 'Mixed Target');
    expect(definition?.sources[0]?.table).toBe('Other Schema.Src Table');
    expect(definition?.statement).toBe(
      'TRANSFORM "Mixed Target" FROM "Other Schema"."Src Table" AS s SELECT s."Amount" AS "Total Amount"',
    );
    // Unquoted names fold to lower case, as in SQL.
    await trellis.apply('TRANSFORM UPPER_CASE FROM Widgets SELECT Name AS Label');
    expect((await columnsOf('upper_case')).map((c) => c.name)).toEqual(['label', 'id']);
  });

  it('reads another transform’s target (a chain)', async () => {
    await trellis.apply('TRANSFORM chain_base FROM widgets SELECT id, price');
    await trellis.apply(
      'TRANSFORM chain_top FROM chain_base SELECT id, price * 2 AS double_price WHERE price > 0',
    );
    const [definition] = (await trellis.definitions()).filter((d) => d.target === 'chain_top');
    expect(definition?.sources[0]?.table).toBe('public.chain_base');
    // The upstream transform cannot be dropped while the chain reads it.
    await expectError('DROP TRANSFORM chain_base', 'conflict', 'chain_top reads chain_base');
  });

  it('never lets a name inject SQL: every identifier is quoted', async () => {
    const hostile = 'x"; DROP TABLE widgets; --';
    const quoted = `"${hostile.replaceAll('"', '""')}"`;
    await trellis.apply(`TRANSFORM ${quoted} FROM widgets SELECT name AS ${quoted}`);
    const [row] = await db.sql`SELECT to_regclass('public.widgets') IS NOT NULL AS still_there`;
    expect(row?.still_there).toBe(true);
    expect((await columnsOf(hostile)).map((c) => c.name)).toEqual([hostile, 'id']);
    expect(await trellis.apply(`DROP TRANSFORM ${quoted}`)).toEqual({
      kind: 'dropped',
      target: hostile,
    });
  });
});

describe('refusals', () => {
  it('reports grammar errors as parse, with the position', async () => {
    const error = await expectError('TRANSFORM t widgets SELECT price', 'parse');
    expect(error.position).toBeGreaterThan(10);
    await expectError('', 'parse');
    await expectError(
      'TRANSFORM a FROM widgets SELECT price; TRANSFORM b FROM widgets SELECT price',
      'parse',
      'one statement',
    );
  });

  it('refuses a source without a primary key', () =>
    expectError('TRANSFORM t1 FROM no_key SELECT a', 'validation', 'no_key', 'no primary key'));

  it('refuses unknown tables and columns, naming the part', async () => {
    await expectError(
      'TRANSFORM t2 FROM nowhere SELECT a',
      'validation',
      'nowhere',
      'does not exist',
    );
    await expectError(
      'TRANSFORM t3 FROM widgets SELECT colour',
      'validation',
      'SELECT item 1',
      'colour',
    );
    await expectError(
      'TRANSFORM t4 FROM widgets SELECT name WHERE weight > 1',
      'validation',
      'in WHERE',
      'weight',
    );
    await expectError(
      'TRANSFORM t5 FROM orders o JOIN customers c ON c.id = o.client_id SELECT o.amount',
      'validation',
      'in JOIN',
      'client_id',
    );
  });

  it('refuses type errors', async () => {
    await expectError(
      'TRANSFORM t6 FROM widgets SELECT name * 2 AS x',
      'validation',
      'SELECT item 1',
    );
    await expectError(
      'TRANSFORM t7 FROM widgets SELECT name WHERE price',
      'validation',
      'in WHERE',
      'boolean',
    );
  });

  it('refuses a column that is neither grouped nor aggregated', async () => {
    await expectError(
      'TRANSFORM t8 FROM orders SELECT customer_id, status, sum(amount) AS total GROUP BY customer_id',
      'validation',
      'SELECT item 2',
      'GROUP BY',
    );
    await expectError(
      'TRANSFORM t9 FROM orders SELECT customer_id, sum(amount) AS total',
      'validation',
      'SELECT item 1',
    );
  });

  it('refuses duplicate output names and unnamed expressions', async () => {
    await expectError(
      'TRANSFORM t10 FROM widgets SELECT name, price AS name',
      'validation',
      'two columns',
      'name',
    );
    await expectError('TRANSFORM t11 FROM widgets SELECT price + 1', 'validation', 'needs a name');
  });

  it('refuses a target that clashes with a relation, or that is already defined', async () => {
    await expectError('TRANSFORM widgets FROM orders SELECT amount', 'validation', 'clash');
    await trellis.apply('TRANSFORM defined_once FROM widgets SELECT name');
    await expectError(
      'TRANSFORM defined_once FROM widgets SELECT name',
      'conflict',
      'already defined',
    );
    await expectError(
      'TRANSFORM elsewhere.t12 FROM widgets SELECT name',
      'validation',
      'target schema',
    );
  });

  it('refuses what would make a re-derived row irreproducible or uncaptured', async () => {
    await expectError(
      'TRANSFORM t13 FROM widgets SELECT random() AS r',
      'validation',
      'volatile',
      'random',
    );
    await expectError(
      'TRANSFORM t14 FROM widgets SELECT sum(price) OVER () AS running',
      'validation',
      'window function',
    );
    await expectError(
      'TRANSFORM t15 FROM widgets SELECT generate_series(1, id) AS n',
      'validation',
      'set-returning',
    );
    await expectError(
      'TRANSFORM t16 FROM orders SELECT amount, (SELECT name FROM customers c WHERE c.id = customer_id) AS who',
      'validation',
      'customers',
      'subquer',
    );
    await expectError(
      'TRANSFORM t17 FROM orders SELECT amount WHERE amount > (SELECT avg(amount) FROM orders)',
      'validation',
      'subquer',
    );
    await expectError('TRANSFORM t18 FROM widget_view SELECT name', 'validation', 'view');
  });

  it('define() refuses anything but TRANSFORM', async () => {
    const error = await rejection(trellis.define('PAUSE TRANSFORM widget_prices'));
    expect(error).toMatchObject({ code: 'validation' });
  });

  it('leaves nothing behind after a refusal', async () => {
    const before =
      await db.sql`SELECT count(*)::int AS n FROM pg_class WHERE relnamespace = 'public'::regnamespace`;
    await expectError('TRANSFORM t19 FROM widgets SELECT random() AS r', 'validation');
    const after =
      await db.sql`SELECT count(*)::int AS n FROM pg_class WHERE relnamespace = 'public'::regnamespace`;
    expect(after[0]?.n).toBe(before[0]?.n);
  });
});

describe('from SQL, inside a migration’s transaction', () => {
  it('commits with the DDL around it', async () => {
    await db.sql.begin(async (tx) => {
      await tx.unsafe('CREATE TABLE gadgets (id int PRIMARY KEY, label text)');
      const [row] = await tx.unsafe(
        "SELECT trellis.apply('TRANSFORM gadget_labels FROM gadgets SELECT label') AS result",
      );
      expect(row?.result).toEqual({ kind: 'transform_defined', target: 'gadget_labels' });
    });
    expect((await trellis.definitions()).map((d) => d.target)).toContain('gadget_labels');
    expect((await columnsOf('gadget_labels')).map((c) => c.name)).toEqual(['label', 'id']);
  });

  it('rolls back with it: neither the source, the target nor the definition remain', async () => {
    await expect(
      db.sql.begin(async (tx) => {
        await tx.unsafe('CREATE TABLE gizmos (id int PRIMARY KEY, label text)');
        await tx.unsafe("SELECT trellis.apply('TRANSFORM gizmo_labels FROM gizmos SELECT label')");
        throw new Error('a later migration step failed');
      }),
    ).rejects.toThrow('a later migration step failed');
    expect((await trellis.definitions()).map((d) => d.target)).not.toContain('gizmo_labels');
    const [row] = await db.sql`SELECT to_regclass('gizmos') AS s, to_regclass('gizmo_labels') AS t`;
    expect(row).toEqual({ s: null, t: null });
  });

  it('reports a refusal from SQL with Trellis’s SQLSTATE', async () => {
    const error = await rejection(db.sql`SELECT trellis.apply('TRANSFORM x FROM no_key SELECT a')`);
    expect(error.code).toBe('TRV01');
  });
});

describe('targets are written by Trellis only', () => {
  it('refuses an app’s INSERT, UPDATE, DELETE and TRUNCATE on a target', async () => {
    for (const write of [
      'INSERT INTO widget_prices (id, price) VALUES (1, 1)',
      'UPDATE widget_prices SET price = 2',
      'DELETE FROM widget_prices',
      'TRUNCATE widget_prices',
    ]) {
      const error = await rejection(db.sql.unsafe(write));
      expect({ write, code: error.code }).toEqual({ write, code: 'TRW01' });
    }
    // Replication mode does not lift the guard.
    const error = await rejection(
      db.sql.begin(async (tx) => {
        await tx.unsafe('SET LOCAL session_replication_role = replica');
        await tx.unsafe('DELETE FROM widget_prices');
      }),
    );
    expect(error.code).toBe('TRW01');
  });
});

describe('PAUSE and RESUME', () => {
  it('pauses and resumes a transform and its columns', async () => {
    await trellis.apply('TRANSFORM paused_widgets FROM widgets SELECT name, price');
    expect(await trellis.apply('PAUSE TRANSFORM paused_widgets.price')).toEqual({
      kind: 'paused',
      address: 'paused_widgets.price',
    });
    expect((await trellis.status('paused_widgets')).pausedColumns).toEqual([
      'paused_widgets.price',
    ]);
    expect(await trellis.apply('pause transform paused_widgets')).toEqual({
      kind: 'paused',
      address: 'paused_widgets',
    });
    expect(await trellis.status('paused_widgets')).toMatchObject({
      status: 'paused',
      pauseReason: 'operator',
    });
    expect(await trellis.apply('RESUME TRANSFORM paused_widgets')).toEqual({
      kind: 'resumed',
      addresses: ['paused_widgets', 'paused_widgets.price'],
    });
    expect(await trellis.status('paused_widgets')).toMatchObject({
      status: 'waiting_to_backfill',
      pausedColumns: [],
    });
    expect(await trellis.apply('RESUME TRANSFORM paused_widgets')).toEqual({
      kind: 'resumed',
      addresses: [],
    });
  });

  it('traces paused upstream columns through a chain', async () => {
    await trellis.apply('TRANSFORM up FROM widgets SELECT name, price');
    await trellis.apply('TRANSFORM down FROM up SELECT price * 2 AS doubled');
    await trellis.apply('PAUSE TRANSFORM up.price');
    expect((await trellis.status('down')).pausedUpstreamColumns).toEqual(['up.price']);
    await trellis.apply('PAUSE TRANSFORM up.name');
    expect((await trellis.status('down')).pausedUpstreamColumns).toEqual(['up.price']);
    await trellis.apply('RESUME TRANSFORM up.price');
    expect((await trellis.status('down')).pausedUpstreamColumns).toEqual([]);
  });

  it('says what is missing or not allowed', async () => {
    await expectError('PAUSE TRANSFORM nothing_here', 'not_found', 'nothing_here');
    // A target written in another schema names nothing (and drops nothing).
    await expectError('DROP TRANSFORM elsewhere.paused_widgets', 'not_found', 'elsewhere');
    await expectError('ALTER TRANSFORM elsewhere.paused_widgets DROP COLUMN price', 'not_found');
    expect((await trellis.definitions()).map((d) => d.target)).toContain('paused_widgets');
    expect(
      await trellis.apply('ALTER TRANSFORM public.paused_widgets SET WITHOUT SOURCE INDEX'),
    ).toEqual({
      kind: 'altered',
      target: 'paused_widgets',
    });
    await expectError('PAUSE TRANSFORM paused_widgets.colour', 'not_found', 'colour');
    await expectError('PAUSE TRANSFORM paused_widgets.id', 'validation', 'key');
    await expectError('RESUME TRANSFORM nothing_here', 'not_found');
    const error = await rejection(trellis.status('nothing_here'));
    expect(error).toMatchObject({ code: 'not_found' });
  });
});

describe('DROP and ALTER', () => {
  it('drops the definition with its target', async () => {
    await trellis.apply('TRANSFORM dropped_widgets FROM widgets SELECT name');
    expect(await trellis.apply('DROP TRANSFORM dropped_widgets')).toEqual({
      kind: 'dropped',
      target: 'dropped_widgets',
    });
    const [row] = await db.sql`SELECT to_regclass('dropped_widgets') AS t`;
    expect(row?.t).toBeNull();
    expect((await trellis.definitions()).map((d) => d.target)).not.toContain('dropped_widgets');
    await expectError('DROP TRANSFORM dropped_widgets', 'not_found');
  });

  it('adds and drops columns, keeping the statement in step', async () => {
    await trellis.apply('TRANSFORM altered_widgets FROM widgets SELECT name');
    expect(
      await trellis.apply('ALTER TRANSFORM altered_widgets ADD COLUMN price * 100 AS cents'),
    ).toEqual({ kind: 'altered', target: 'altered_widgets' });
    expect(await columnsOf('altered_widgets')).toContainEqual({
      name: 'cents',
      type: 'numeric',
      notnull: false,
    });
    let [definition] = (await trellis.definitions()).filter((d) => d.target === 'altered_widgets');
    expect(definition?.statement).toBe(
      'TRANSFORM altered_widgets FROM public.widgets SELECT name AS name, price * 100 AS cents',
    );
    await trellis.apply('ALTER TRANSFORM altered_widgets DROP COLUMN name');
    expect((await columnsOf('altered_widgets')).map((c) => c.name)).toEqual(['id', 'cents']);
    [definition] = (await trellis.definitions()).filter((d) => d.target === 'altered_widgets');
    expect(definition?.statement).toBe(
      'TRANSFORM altered_widgets FROM public.widgets SELECT price * 100 AS cents',
    );
    await expectError('ALTER TRANSFORM altered_widgets DROP COLUMN id', 'validation', 'key');
    await expectError(
      'ALTER TRANSFORM altered_widgets DROP COLUMN cents',
      'validation',
      'last column',
    );
    await expectError(
      'ALTER TRANSFORM altered_widgets ADD price AS cents',
      'validation',
      'already has',
    );
    await expectError('ALTER TRANSFORM altered_widgets ADD nope AS n', 'validation', 'nope');
  });

  it('sets and resets WITHOUT SOURCE INDEX', async () => {
    await trellis.apply(
      'TRANSFORM indexed FROM orders SELECT customer_id, count(*) AS n GROUP BY customer_id',
    );
    await trellis.apply('ALTER TRANSFORM indexed SET WITHOUT SOURCE INDEX');
    let [definition] = (await trellis.definitions()).filter((d) => d.target === 'indexed');
    expect(definition?.options.withoutSourceIndex).toBe(true);
    expect(definition?.statement).toMatch(/ WITHOUT SOURCE INDEX$/);
    await trellis.apply('ALTER TRANSFORM indexed RESET WITHOUT SOURCE INDEX');
    [definition] = (await trellis.definitions()).filter((d) => d.target === 'indexed');
    expect(definition?.options.withoutSourceIndex).toBe(false);
    expect(definition?.statement).not.toMatch(/WITHOUT SOURCE INDEX/);
  });

  it('redefines from the normalised statement to the same definition', async () => {
    const definitions = await trellis.definitions();
    for (const name of ['customer_totals', 'order_lines', 'big_customers', 'Mixed Target']) {
      const before = definitions.find((d) => d.target === name);
      expect(before).toBeDefined();
      await db.sql
        .begin(async (tx) => {
          const drop = await tx.unsafe('SELECT trellis.apply($1) AS r', [
            `DROP TRANSFORM "${name.replaceAll('"', '""')}"`,
          ]);
          expect(drop[0]?.r).toMatchObject({ kind: 'dropped' });
          await tx.unsafe('SELECT trellis.apply($1)', [before!.statement]);
          const [again] = await tx.unsafe(
            'SELECT statement FROM trellis.transforms WHERE target_name = $1',
            [name],
          );
          expect(again?.statement).toBe(before!.statement);
          throw new Error('roll back');
        })
        .catch((e: Error) => {
          if (e.message !== 'roll back') throw e;
        });
    }
  });
});
