import { KeySpace, type WorkloadShape } from './workload.js';

/**
 * The orders workload (see workload.ts): three tables for GROUP BY and joins, written on
 * every side of every join and in every grouping column.
 */

export const ORDERS_DDL = `
  CREATE TABLE regions (code text PRIMARY KEY, label text NOT NULL);
  CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, region_code text, tier int NOT NULL);
  CREATE TABLE orders (id int PRIMARY KEY, customer_id int, amount numeric NOT NULL, status text NOT NULL, qty int NOT NULL);
  CREATE INDEX ON orders (customer_id);
  CREATE INDEX ON orders (status);
  CREATE INDEX ON customers (region_code);
  CREATE INDEX ON customers (tier);
  CREATE AGGREGATE product_of(numeric) (sfunc = numeric_mul, stype = numeric, initcond = '1');
  INSERT INTO regions SELECT 'r' || g, 'Region ' || g FROM generate_series(1, 8) g;
  INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 5 = 0 THEN NULL ELSE 'r' || (1 + g % 10) END, g % 4
    FROM generate_series(1, 300) g;
  INSERT INTO orders SELECT g, CASE WHEN g % 50 = 0 THEN NULL ELSE 1 + g % 330 END, g % 97,
                            (ARRAY['open', 'paid', 'void'])[1 + g % 3], g % 6
    FROM generate_series(1, 6000) g;`;

/**
 * Writes to orders, customers and regions (ORDERS_DDL): orders moving between customers,
 * statuses and amounts, customers between regions and tiers, regions relabelled, deleted
 * and re-added, keys changed on all three (onto keys that may exist, too), multi-row and
 * bulk inserts.
 */
export function ordersWorkload(): WorkloadShape {
  return {
    tables: ['orders', 'customers', 'regions'],
    writer(dice, writer, writers) {
      const orders = new KeySpace(dice, 6000, writer, writers, 1_000_000);
      const customers = new KeySpace(dice, 300, writer, writers, 100_000);
      const customer = () => (dice.chance(0.75) ? customers.existing() : dice.int(420));
      const region = (n = 10) => `r${dice.int(n)}`;
      const status = () => ['open', 'paid', 'void'][dice.below(3)]!;
      const order = () =>
        `(${orders.fresh()}, ${customer()}, ${dice.int(200)}, '${status()}', ${dice.int(5)})`;
      const statements: Array<readonly [number, () => string]> = [
        [3, () => `INSERT INTO orders VALUES ${order()}`],
        [1, () => `INSERT INTO orders VALUES ${order()}, ${order()}, ${order()}`],
        [
          1,
          () => {
            const first = orders.fresh(200);
            return `INSERT INTO orders SELECT g, 1 + g % 330, g % 97, (ARRAY['open', 'paid', 'void'])[1 + g % 3], g % 6
                      FROM generate_series(${first}, ${first + 199}) g`;
          },
        ],
        [3, () => `UPDATE orders SET customer_id = ${customer()} WHERE id = ${orders.existing()}`],
        [
          3,
          () =>
            `UPDATE orders SET status = '${status()}', qty = ${dice.int(5)} WHERE id = ${orders.existing()}`,
        ],
        [
          3,
          () => {
            const from = orders.existing();
            return `UPDATE orders SET amount = amount + ${dice.int(40) - 20} WHERE id BETWEEN ${from} AND ${from + 40}`;
          },
        ],
        [3, () => `DELETE FROM orders WHERE id = ${orders.existing()}`],
        [3, () => `UPDATE orders SET id = ${orders.fresh()} WHERE id = ${orders.existing()}`],
        [
          3,
          () =>
            `INSERT INTO customers VALUES (${customers.fresh()}, 'n${dice.int(99)}', '${region()}', ${dice.int(4)})`,
        ],
        [
          3,
          () =>
            `UPDATE customers SET tier = ${dice.int(4)}, name = name || '+' WHERE id = ${customer()}`,
        ],
        [
          1,
          () => {
            const from = customers.existing();
            return `UPDATE customers SET tier = (tier + 1) % 4 WHERE id BETWEEN ${from} AND ${from + 10}`;
          },
        ],
        [
          3,
          () =>
            `UPDATE customers SET region_code = ${dice.chance(0.2) ? 'NULL' : `'${region()}'`} WHERE id = ${customer()}`,
        ],
        [3, () => `DELETE FROM customers WHERE id = ${customer()}`],
        [3, () => `UPDATE customers SET id = ${customers.fresh()} WHERE id = ${customer()}`],
        [1, () => `UPDATE customers SET id = ${customers.existing()} WHERE id = ${customer()}`],
        [3, () => `UPDATE regions SET label = label || '*' WHERE code = '${region()}'`],
        [3, () => `DELETE FROM regions WHERE code = '${region()}'`],
        [3, () => `INSERT INTO regions VALUES ('${region(12)}', 'again') ON CONFLICT DO NOTHING`],
        [1, () => `UPDATE regions SET code = '${region(12)}' WHERE code = '${region(12)}'`],
      ];
      return {
        statement: () => dice.weighted(statements)(),
        truncate: () => 'TRUNCATE orders',
      };
    },
  };
}
