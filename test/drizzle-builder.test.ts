import { and, eq, getTableName, inArray, isNotNull, sql } from 'drizzle-orm';
import { toSnakeCase } from 'drizzle-orm/casing';
import { getTableConfig, type IndexBuilder, integer, numeric, pgTable } from 'drizzle-orm/pg-core';
import { drizzle } from 'drizzle-orm/postgres-js';
import { describe, expect, it, onTestFinished } from 'vitest';
import {
  applyStatementSql,
  indexesFor,
  isTrellisTarget,
  sourceIndexesOf,
  statementOf,
  transform,
  transformDefinition,
} from '../src/drizzle/index.js';
import { sqlClient } from './support/database.js';
import {
  bigCustomers,
  customers,
  customerTotals,
  orders,
  PAID,
  readTotals,
  reportingLines,
} from './support/drizzle-app.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { rejection } from './support/trellis.js';

const SCHEMA = `
  CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, region text);
  CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer NOT NULL REFERENCES customers,
    amount numeric NOT NULL, status text NOT NULL, placed_at timestamptz NOT NULL,
    gift boolean NOT NULL DEFAULT false, serial bigint);
  CREATE INDEX ON orders (customer_id);
  CREATE TABLE employees (id integer PRIMARY KEY, full_name text NOT NULL, manager_id integer);
  CREATE INDEX ON employees (manager_id);
`;

// What the test wrote by hand for the oracle: the same transform in plain SQL.
const customerTotalsDefinition: Definition = {
  target: 'customer_totals',
  from: 'orders JOIN customers ON orders.customer_id = customers.id',
  select: `orders.customer_id AS "customerId", customers.name AS name, max(customers.region) AS region,
           sum(orders.amount) AS total, count(*) AS "orderCount", max(orders.placed_at) AS "lastPlaced"`,
  where: `orders.status = 'paid''); DROP TABLE orders; --' AND orders.placed_at > '2024-03-01T00:00:00Z'
          AND NOT orders.gift`,
  groupBy: 'orders.customer_id, customers.name',
  having: 'count(*) >= 2',
};

const reportingLinesDefinition: Definition = {
  target: 'reporting_lines',
  from: 'employees LEFT JOIN employees manager ON manager.id = employees.manager_id',
  select:
    'employees.id AS employee_id, employees.full_name AS full_name, manager.full_name AS manager_name',
  where: "employees.full_name <> ''",
  implicit: 'manager.id AS id',
};

const bigCustomersDefinition: Definition = {
  target: 'big_customers',
  from: 'customer_totals',
  // Recomputed from the base tables, through customer_totals' own definition.
  reads: [customerTotalsDefinition],
  select: '"customerId", total',
  implicit: 'name',
  where: '"orderCount" > 2',
};

describe('transform(): statements from drizzle tables', () => {
  it('writes names as quoted identifiers and values as literals, in grammar order', () => {
    expect(statementOf(customerTotals)).toBe(
      [
        'TRANSFORM "customer_totals"',
        'FROM "orders"',
        'INNER JOIN "customers" ON "orders"."customer_id" = "customers"."id"',
        'SELECT "orders"."customer_id" AS "customerId", "customers"."name" AS "name", max("customers"."region") AS "region", sum("orders"."amount") AS "total", count(*) AS "orderCount", max("orders"."placed_at") AS "lastPlaced"',
        `WHERE ("orders"."status" = 'paid''); DROP TABLE orders; --' and "orders"."placed_at" > '2024-03-01T00:00:00.000Z' and "orders"."gift" = FALSE)`,
        'GROUP BY "orders"."customer_id", "customers"."name"',
        'HAVING count(*) >= 2',
      ].join('\n'),
    );
    expect(statementOf(reportingLines)).toContain(
      'LEFT JOIN "employees" AS "manager" ON "manager"."id" = "employees"."manager_id"',
    );
    expect(transformDefinition(bigCustomers)).toEqual({
      target: 'big_customers',
      statement: expect.stringContaining('FROM "customer_totals"'),
      reads: ['customer_totals'],
    });
    expect(applyStatementSql(statementOf(bigCustomers))).toMatch(
      /^SELECT "trellis"\.apply\('TRANSFORM "big_customers"\n/,
    );
    expect(applyStatementSql(bigCustomers, { schema: 'tr' })).toBe(
      `SELECT "tr".apply('${statementOf(bigCustomers)}');`,
    );
    expect(() => applyStatementSql(orders)).toThrow(
      expect.objectContaining({ code: 'validation' }),
    );
    expect(isTrellisTarget(customerTotals)).toBe(true);
    expect(isTrellisTarget(orders)).toBe(false);
  });

  it('writes the trailing options, WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY', () => {
    const stmt = statementOf(
      transform('opted', (t) =>
        t.from(orders).select({ id: orders.id }).withoutSourceIndex().withoutRowSecurity(),
      ),
    );
    expect(stmt.split('\n').slice(-2)).toEqual(['WITHOUT SOURCE INDEX', 'WITHOUT ROW SECURITY']);
  });

  it('writes each kind of value as a literal of its own', () => {
    const stmt = statementOf(
      transform('values', (t) =>
        t
          .from(orders)
          .select({ id: orders.id })
          .where(
            and(
              eq(orders.serial, 9007199254740993n),
              inArray(orders.id, [1, 2, 3]),
              sql`${orders.amount} > ${1.5} AND ${orders.gift} = ${true} AND ${orders.status} IS DISTINCT FROM ${null}`,
              sql`${orders.placedAt} < ${new Date('2030-01-01T00:00:00Z')}`,
              sql`${orders.status} <> ${'back\\slash'}`,
            ),
          ),
      ),
    );
    expect(stmt).toContain('"orders"."serial" = 9007199254740993');
    expect(stmt).toContain('"orders"."id" in (1, 2, 3)');
    expect(stmt).toContain(
      '"orders"."amount" > 1.5 AND "orders"."gift" = TRUE AND "orders"."status" IS DISTINCT FROM NULL',
    );
    expect(stmt).toContain(`"orders"."placed_at" < '2030-01-01T00:00:00.000Z'`);
    expect(stmt).toContain(`"orders"."status" <> 'back\\slash'`);
  });

  it('refuses what cannot be written into a statement, with validation', () => {
    const products = pgTable('products', { id: integer().primaryKey(), price: numeric() });
    const refusals = [
      // A column inside sql`…` is only checked at run time.
      () =>
        transform('x', (t) => t.from(orders).select({ id: orders.id }).where(eq(products.id, 1))),
      () =>
        transform('x', (t) => t.from(orders).select({ p: sql<string>`max(${products.price})` })),
      () =>
        transform('x', (t) =>
          t.from(orders).innerJoin(orders, eq(orders.id, orders.id)).select({ id: orders.id }),
        ),
      () =>
        transform('x', (t) =>
          t
            .from(orders)
            .select({ id: orders.id })
            .where(sql`${orders.id} = ${sql.placeholder('id')}`),
        ),
      () =>
        transform('x', (t) =>
          t.from(orders).select({ id: sql`${orders.id}`.as('other') as never }),
        ),
      () => transform('x', (t) => t.from(orders).innerJoin(customers, undefined).select({})),
      () => transform('', (t) => t.from(orders).select({ id: orders.id })),
      () =>
        transform('x', (t) => t.from(orders).select({ id: orders.id, ID: orders.id }), {
          casing: 'snake_case',
        }),
    ];
    for (const refuse of refusals) {
      expect(refuse).toThrow(expect.objectContaining({ code: 'validation' }));
    }
    expect(() =>
      transform('x', (t) => t.from(orders).select({ id: orders.id }).where(eq(products.id, 1))),
    ).toThrow(
      'in WHERE: products (column id) is not a table of this statement (its tables: orders)',
    );
  });
});

describe("transform(): column names follow drizzle's casing", () => {
  const lines = pgTable('lines', {
    orderId: integer().primaryKey(),
    unitPrice: numeric().notNull(),
  });
  const build = (options: Parameters<typeof transform>[2]) =>
    transform(
      'line_totals',
      (t) =>
        t
          .from(lines)
          .select({ orderId: lines.orderId, lineTotal: sql<string>`sum(${lines.unitPrice})` })
          .groupBy(lines.orderId),
      options,
    );

  it('keeps the select keys as they are without a casing (quoted camelCase)', () => {
    expect(statementOf(build({}))).toContain(
      'SELECT "lines"."orderId" AS "orderId", sum("lines"."unitPrice") AS "lineTotal"',
    );
  });

  it("follows the casing a drizzle() database was made with, as drizzle names the sources' columns", () => {
    const snake = drizzle.mock({ casing: 'snake_case' });
    const statement = statementOf(build({ casing: snake }));
    expect(statement).toContain(
      'SELECT "lines"."order_id" AS "order_id", sum("lines"."unit_price") AS "line_total"',
    );
    expect(statement).toContain('GROUP BY "lines"."order_id"');
    // The same as naming the casing.
    expect(statement).toBe(statementOf(build({ casing: 'snake_case' })));
    // The target reads back through drizzle under the select keys, from the snake_case columns.
    const target = build({ casing: snake });
    expect(snake.select().from(target).toSQL().sql).toBe(
      'select "order_id", "line_total" from "line_totals"',
    );
    expect(statementOf(build({ casing: drizzle.mock({ casing: 'camelCase' }) }))).toBe(
      statementOf(build({ casing: 'camelCase' })),
    );
    // A database made without a casing: names as they are.
    expect(statementOf(build({ casing: drizzle.mock() }))).toBe(statementOf(build({})));
    expect(() => build({ casing: 'kebab' as never })).toThrow(
      expect.objectContaining({ code: 'validation' }),
    );
  });
});

describe('indexesFor(): the source indexes a transform needs, as drizzle index()es', () => {
  const ixCustomers = pgTable('ix_customers', {
    id: integer().primaryKey(),
    regionId: integer().notNull(),
  });
  const ixOrders = pgTable(
    'ix_orders',
    { id: integer().primaryKey(), customerId: integer().notNull(), amount: numeric().notNull() },
    // Lazily, as drizzle-kit reads it: the target below is defined after the table.
    (t): IndexBuilder[] => indexesFor(t, ixByRegion),
  );
  const ixByRegion = transform(
    'ix_by_region',
    (t) =>
      t
        .from(ixOrders)
        .innerJoin(ixCustomers, eq(ixOrders.customerId, ixCustomers.id))
        .select({ regionId: ixCustomers.regionId, total: sql<string>`sum(${ixOrders.amount})` })
        .groupBy(ixCustomers.regionId),
    { casing: 'snake_case' },
  );

  it('names each table, its columns and why, as status() reports the gaps', () => {
    expect(
      sourceIndexesOf(ixByRegion).map((i) => [getTableName(i.table), i.names, i.role]),
    ).toEqual([
      ['ix_orders', ['customer_id'], 'join_from'],
      ['ix_customers', ['id'], 'join_joined'],
      ['ix_customers', ['region_id'], 'group_by'],
    ]);
    const config = getTableConfig(ixOrders);
    expect(
      config.indexes.map((i) => [
        i.config.name,
        i.config.columns.map((c) => (c as { name: string }).name),
      ]),
    ).toEqual([['ix_orders_customer_id_idx', ['customerId']]]);
    // Once however many targets need it; none on the primary key, which has its index.
    expect(
      indexesFor(ixCustomers, ixByRegion, ixByRegion).map((i) => i.build(ixCustomers).config.name),
    ).toEqual(['ix_customers_region_id_idx']);
  });

  const live = livePipeline({
    setup: (db) =>
      db.sql
        .unsafe(`
          CREATE TABLE ix_customers (id integer PRIMARY KEY, region_id integer NOT NULL);
          CREATE TABLE ix_orders (id integer PRIMARY KEY, customer_id integer NOT NULL, amount numeric NOT NULL);`)
        .then(() => undefined),
  });

  it('closes the gaps status() reports, once created as drizzle-kit would', async () => {
    await live.trellis.apply(statementOf(ixByRegion));
    const gaps = (await live.trellis.status('ix_by_region')).sourceIndexGaps;
    const wanted = sourceIndexesOf(ixByRegion);
    // Every gap is one of the indexes (the primary key of ix_customers is there already).
    for (const gap of gaps) {
      expect(
        wanted.map((w) => [`public.${getTableName(w.table)}`, w.names, w.role]),
      ).toContainEqual([gap.table, gap.columns, gap.role]);
    }
    expect(gaps.map((g) => g.table).sort()).toEqual(['public.ix_customers', 'public.ix_orders']);
    // What drizzle-kit writes for the declared index()es: CREATE INDEX "name" ON table (cols).
    for (const table of [ixOrders, ixCustomers]) {
      for (const builder of indexesFor(table, ixByRegion)) {
        const { config } = builder.build(table);
        const columns = config.columns.map((c) => `"${toSnakeCase((c as { name: string }).name)}"`);
        await live.db.sql.unsafe(
          `CREATE INDEX "${config.name}" ON "${getTableName(table)}" (${columns.join(', ')})`,
        );
      }
    }
    expect((await live.trellis.status('ix_by_region')).sourceIndexGaps).toEqual([]);
  });
});

describe('a drizzle-built transform, live', () => {
  const live = livePipeline({ setup: (db) => db.sql.unsafe(SCHEMA).then(() => undefined) });

  it('converges to its definition and reads back typed through drizzle', async () => {
    const { db, trellis } = live;
    await db.sql.unsafe(`
      INSERT INTO customers VALUES (1, 'Ada', 'north'), (2, 'Bo', NULL), (3, 'Cy', 'south');
      INSERT INTO orders (id, customer_id, amount, status, placed_at, gift) VALUES
        (1, 1, 10.50, $$${PAID}$$, '2024-04-01T10:00:00Z', false),
        (2, 1, 4.25, $$${PAID}$$, '2024-05-01T10:00:00Z', false),
        (3, 1, 99, 'open', '2024-05-02T10:00:00Z', false),
        (4, 2, 7, $$${PAID}$$, '2024-06-01T10:00:00Z', false),
        (5, 2, 8, $$${PAID}$$, '2024-06-02T10:00:00Z', true),
        (6, 3, 1, $$${PAID}$$, '2024-01-01T10:00:00Z', false),
        (7, 3, 2, $$${PAID}$$, '2024-07-01T10:00:00Z', false),
        (8, 3, 3, $$${PAID}$$, '2024-07-02T10:00:00Z', false);
      INSERT INTO employees VALUES (1, 'Grace', NULL), (2, 'Linus', 1), (3, 'Ken', 1), (4, '', 2);
    `);
    for (const target of [customerTotals, reportingLines, bigCustomers]) {
      expect(await trellis.apply(statementOf(target))).toEqual({
        kind: 'transform_defined',
        target: transformDefinition(target).target,
      });
    }
    await live.converged([
      customerTotalsDefinition,
      reportingLinesDefinition,
      bigCustomersDefinition,
    ]);

    await db.sql.unsafe(`
      INSERT INTO orders (id, customer_id, amount, status, placed_at) VALUES
        (9, 2, 1.75, $$${PAID}$$, '2024-08-01T10:00:00Z'),
        (10, 3, 5, $$${PAID}$$, '2024-08-02T10:00:00Z');
      UPDATE orders SET status = 'refunded' WHERE id = 2;
      UPDATE customers SET region = 'west' WHERE id = 2;
      UPDATE employees SET full_name = 'Grace H.' WHERE id = 1;
    `);
    await live.converged([
      customerTotalsDefinition,
      reportingLinesDefinition,
      bigCustomersDefinition,
    ]);

    // drizzle changes the postgres.js client it wraps: a client of its own.
    const client = sqlClient(db.url, { max: 2 });
    onTestFinished(() => client.end());
    const orm = drizzle({ client });
    const rows = await readTotals(orm);
    const expected = await db.sql.unsafe<Array<Record<string, unknown>>>(
      `SELECT orders.customer_id AS "customerId", customers.name, max(customers.region) AS region,
              sum(orders.amount)::text AS total, count(*)::int AS "orderCount",
              max(orders.placed_at) AS "lastPlaced"
         FROM orders JOIN customers ON orders.customer_id = customers.id
        WHERE ${customerTotalsDefinition.where}
        GROUP BY 1, 2 HAVING count(*) >= 2 ORDER BY 1`,
    );
    expect(rows).toEqual(expected);
    expect(rows.map((r) => r.customerId)).toEqual([2, 3]);
    expect(rows[0]?.lastPlaced).toBeInstanceOf(Date);

    const lines = await orm
      .select()
      .from(reportingLines)
      .where(isNotNull(reportingLines.managerName))
      .orderBy(reportingLines.employeeId);
    expect(lines).toEqual([
      { employeeId: 2, fullName: 'Linus', managerName: 'Grace H.' },
      { employeeId: 3, fullName: 'Ken', managerName: 'Grace H.' },
    ]);
    expect(await orm.select().from(bigCustomers)).toEqual([{ customerId: 3, total: '10' }]);
  });

  it('is read-only: a write to the target is refused by Trellis', async () => {
    const client = sqlClient(live.db.url, { max: 1 });
    onTestFinished(() => client.end());
    const orm = drizzle({ client });
    const refused = await rejection(orm.execute(sql`DELETE FROM ${customerTotals}`));
    expect(String((refused.cause as { code?: string } | undefined)?.code ?? refused.code)).toBe(
      'TRW01',
    );
  });
});
