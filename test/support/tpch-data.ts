import type postgres from 'postgres';
import { prng } from './workload.js';

/**
 * A small TPC-H dataset, generated from a seed (test/tpch.test.ts, issue #26): the eight
 * tables with the specification's column names and types (numeric(15,2), date, char(n),
 * varchar(n)), their primary keys and the foreign-key indexes an application would have.
 * Values follow dbgen's rules where they matter to the 22 queries (nations and regions as
 * the specification lists them, dates from 1992-01-01 to 1998-08-02, ship, commit and
 * receipt dates after the order's, return flags and line statuses by date, country codes
 * of phones, customers with custkey % 3 = 0 ordering nothing), with smaller value domains
 * (p_size 1 to 10, p_type of 54 words, p_container of 15, p_name of 12 colours) and a few
 * anchored parts (keys 1 to 6, a tenth of the lines) so every query's substitution parameters, as test/tpch.test.ts
 * chooses them, hit rows at this scale.
 */
export interface TpchScale {
  suppliers: number;
  parts: number;
  customers: number;
  orders: number;
}

export const TPCH_SMALL: TpchScale = { suppliers: 30, parts: 200, customers: 150, orders: 1500 };

export const NATIONS: Array<[number, string, number]> = [
  [0, 'ALGERIA', 0],
  [1, 'ARGENTINA', 1],
  [2, 'BRAZIL', 1],
  [3, 'CANADA', 1],
  [4, 'EGYPT', 4],
  [5, 'ETHIOPIA', 0],
  [6, 'FRANCE', 3],
  [7, 'GERMANY', 3],
  [8, 'INDIA', 2],
  [9, 'INDONESIA', 2],
  [10, 'IRAN', 4],
  [11, 'IRAQ', 4],
  [12, 'JAPAN', 2],
  [13, 'JORDAN', 4],
  [14, 'KENYA', 0],
  [15, 'MOROCCO', 0],
  [16, 'MOZAMBIQUE', 0],
  [17, 'PERU', 1],
  [18, 'CHINA', 2],
  [19, 'ROMANIA', 3],
  [20, 'SAUDI ARABIA', 4],
  [21, 'VIETNAM', 2],
  [22, 'RUSSIA', 3],
  [23, 'UNITED KINGDOM', 3],
  [24, 'UNITED STATES', 1],
];
export const REGIONS = ['AFRICA', 'AMERICA', 'ASIA', 'EUROPE', 'MIDDLE EAST'];
export const SEGMENTS = ['AUTOMOBILE', 'BUILDING', 'FURNITURE', 'MACHINERY', 'HOUSEHOLD'];
export const PRIORITIES = ['1-URGENT', '2-HIGH', '3-MEDIUM', '4-NOT SPECIFIED', '5-LOW'];
export const SHIPMODES = ['REG AIR', 'AIR', 'RAIL', 'SHIP', 'TRUCK', 'MAIL', 'FOB'];
export const INSTRUCTIONS = ['DELIVER IN PERSON', 'COLLECT COD', 'NONE', 'TAKE BACK RETURN'];
export const TYPE1 = ['STANDARD', 'SMALL', 'MEDIUM', 'LARGE', 'ECONOMY', 'PROMO'];
export const TYPE2 = ['ANODIZED', 'BURNISHED', 'POLISHED'];
export const TYPE3 = ['TIN', 'BRASS', 'STEEL'];
export const CONTAINER1 = ['SM', 'MED', 'LG'];
export const CONTAINER2 = ['CASE', 'BOX', 'PACK', 'PKG', 'BAG'];
export const COLOURS = [
  'almond',
  'blue',
  'forest',
  'green',
  'ivory',
  'lace',
  'navy',
  'orchid',
  'peru',
  'rose',
  'smoke',
  'wheat',
];
const WORDS = ['quickly', 'final', 'deposits', 'sleep', 'furiously', 'regular', 'ideas', 'bold'];

/** The first day orders are placed on, and the number of days they span (dbgen's). */
export const START_DATE = Date.UTC(1992, 0, 1);
export const ORDER_DAYS = 2405 - 151;
/** Lines shipped after this date are open ('O'), received before it may be returned. */
const CURRENT_DATE = Date.UTC(1995, 5, 17);

export function dateLiteral(ms: number): string {
  return `'${new Date(ms).toISOString().slice(0, 10)}'`;
}
const DAY = 86_400_000;
const quote = (s: string) => `'${s.replaceAll("'", "''")}'`;
const money = (cents: number) => (cents / 100).toFixed(2);

export const TPCH_SCHEMA = `
  CREATE TABLE region (r_regionkey integer PRIMARY KEY, r_name char(25) NOT NULL,
    r_comment varchar(152));
  CREATE TABLE nation (n_nationkey integer PRIMARY KEY, n_name char(25) NOT NULL,
    n_regionkey integer NOT NULL, n_comment varchar(152));
  CREATE TABLE part (p_partkey integer PRIMARY KEY, p_name varchar(55) NOT NULL,
    p_mfgr char(25) NOT NULL, p_brand char(10) NOT NULL, p_type varchar(25) NOT NULL,
    p_size integer NOT NULL, p_container char(10) NOT NULL, p_retailprice numeric(15,2) NOT NULL,
    p_comment varchar(23) NOT NULL);
  CREATE TABLE supplier (s_suppkey integer PRIMARY KEY, s_name char(25) NOT NULL,
    s_address varchar(40) NOT NULL, s_nationkey integer NOT NULL, s_phone char(15) NOT NULL,
    s_acctbal numeric(15,2) NOT NULL, s_comment varchar(101) NOT NULL);
  CREATE TABLE partsupp (ps_partkey integer NOT NULL, ps_suppkey integer NOT NULL,
    ps_availqty integer NOT NULL, ps_supplycost numeric(15,2) NOT NULL,
    ps_comment varchar(199) NOT NULL, PRIMARY KEY (ps_partkey, ps_suppkey));
  CREATE TABLE customer (c_custkey integer PRIMARY KEY, c_name varchar(25) NOT NULL,
    c_address varchar(40) NOT NULL, c_nationkey integer NOT NULL, c_phone char(15) NOT NULL,
    c_acctbal numeric(15,2) NOT NULL, c_mktsegment char(10) NOT NULL, c_comment varchar(117) NOT NULL);
  CREATE TABLE orders (o_orderkey integer PRIMARY KEY, o_custkey integer NOT NULL,
    o_orderstatus char(1) NOT NULL, o_totalprice numeric(15,2) NOT NULL, o_orderdate date NOT NULL,
    o_orderpriority char(15) NOT NULL, o_clerk char(15) NOT NULL, o_shippriority integer NOT NULL,
    o_comment varchar(79) NOT NULL);
  CREATE TABLE lineitem (l_orderkey integer NOT NULL, l_partkey integer NOT NULL,
    l_suppkey integer NOT NULL, l_linenumber integer NOT NULL, l_quantity numeric(15,2) NOT NULL,
    l_extendedprice numeric(15,2) NOT NULL, l_discount numeric(15,2) NOT NULL,
    l_tax numeric(15,2) NOT NULL, l_returnflag char(1) NOT NULL, l_linestatus char(1) NOT NULL,
    l_shipdate date NOT NULL, l_commitdate date NOT NULL, l_receiptdate date NOT NULL,
    l_shipinstruct char(25) NOT NULL, l_shipmode char(10) NOT NULL, l_comment varchar(44) NOT NULL,
    PRIMARY KEY (l_orderkey, l_linenumber));
  -- The foreign keys' indexes (lineitem's l_orderkey and partsupp's ps_partkey lead their
  -- primary keys).
  CREATE INDEX ON nation (n_regionkey);
  CREATE INDEX ON supplier (s_nationkey);
  CREATE INDEX ON customer (c_nationkey);
  CREATE INDEX ON partsupp (ps_suppkey);
  CREATE INDEX ON orders (o_custkey);
  CREATE INDEX ON lineitem (l_partkey, l_suppkey);
  CREATE INDEX ON lineitem (l_suppkey);`;

/** The generator's state: what churn needs to know to write rows that fit. */
export interface TpchData {
  scale: TpchScale;
  /** Each part's suppliers (partsupp), by part key. */
  suppliersOf: Map<number, number[]>;
  retailPrice: (partkey: number) => number;
}

/** The part's retail price, in cents (dbgen's formula). */
function retailCents(p: number): number {
  return 90000 + (Math.floor(p / 10) % 20001) + 100 * (p % 1000);
}

/** The suppliers of part `p` (dbgen's formula: four, spread over all suppliers). */
function partSuppliers(p: number, s: number): number[] {
  return [0, 1, 2, 3].map((i) => ((p + i * (Math.floor(s / 4) + Math.floor((p - 1) / s))) % s) + 1);
}

/**
 * One order's row and its lines' rows, as SQL VALUES tuples: RF1 uses it for new orders.
 */
export function orderRows(
  r: () => number,
  data: TpchData,
  orderkey: number,
  custkey: number,
): { order: string; lines: string[] } {
  const int = (lo: number, hi: number) => lo + Math.floor(r() * (hi - lo + 1));
  const pick = <T>(xs: T[]): T => xs[Math.floor(r() * xs.length)]!;
  const orderdate = START_DATE + int(0, ORDER_DAYS) * DAY;
  const n = int(1, 7);
  const lines: string[] = [];
  let total = 0;
  let open = 0;
  for (let l = 1; l <= n; l += 1) {
    // A third of the lines are of the anchored parts (1 to 6), so the queries naming their
    // brands and containers (Q17, Q19) see lines.
    const partkey = r() < 0.1 ? int(1, 6) : int(1, data.scale.parts);
    const suppkey = pick(data.suppliersOf.get(partkey)!);
    const quantity = int(1, 50);
    const price = quantity * data.retailPrice(partkey);
    const discount = int(0, 10);
    const tax = int(0, 8);
    const ship = orderdate + int(1, 121) * DAY;
    const commit = orderdate + int(30, 90) * DAY;
    const receipt = ship + int(1, 30) * DAY;
    const returnflag = receipt <= CURRENT_DATE ? pick(['R', 'A']) : 'N';
    const linestatus = ship > CURRENT_DATE ? 'O' : 'F';
    if (linestatus === 'O') open += 1;
    total += (price * (100 + tax) * (100 - discount)) / 10000;
    const anchored = partkey <= 6 && r() < 0.6;
    const instruct = anchored ? 'DELIVER IN PERSON' : pick(INSTRUCTIONS);
    const mode = anchored ? 'AIR' : pick(SHIPMODES);
    lines.push(
      `(${orderkey}, ${partkey}, ${suppkey}, ${l}, ${quantity}, ${money(price)}, ${money(discount)}, ${money(tax)}, '${returnflag}', '${linestatus}', ${dateLiteral(ship)}, ${dateLiteral(commit)}, ${dateLiteral(receipt)}, ${quote(instruct)}, ${quote(mode)}, ${quote(`${pick(WORDS)} ${pick(WORDS)}`)})`,
    );
  }
  const status = open === n ? 'O' : open === 0 ? 'F' : 'P';
  const comment =
    r() < 0.1 ? `${pick(WORDS)} special ${pick(WORDS)} requests` : `${pick(WORDS)} ${pick(WORDS)}`;
  const order = `(${orderkey}, ${custkey}, '${status}', ${money(Math.round(total))}, ${dateLiteral(orderdate)}, ${quote(pick(PRIORITIES))}, ${quote(`Clerk#${String(int(1, 20)).padStart(9, '0')}`)}, 0, ${quote(comment)})`;
  return { order, lines };
}

/** A customer key that orders (dbgen: custkey % 3 = 0 never does). */
export function orderingCustomer(r: () => number, scale: TpchScale): number {
  for (;;) {
    const c = 1 + Math.floor(r() * scale.customers);
    if (c % 3 !== 0) return c;
  }
}

async function insertAll(sql: postgres.Sql, table: string, rows: string[]): Promise<void> {
  for (let i = 0; i < rows.length; i += 1000) {
    await sql.unsafe(`INSERT INTO ${table} VALUES ${rows.slice(i, i + 1000).join(', ')}`);
  }
}

/** Creates the tables and fills them from `seed`. */
export async function loadTpch(
  sql: postgres.Sql,
  seed: number,
  scale: TpchScale = TPCH_SMALL,
): Promise<TpchData> {
  const r = prng(seed);
  const int = (lo: number, hi: number) => lo + Math.floor(r() * (hi - lo + 1));
  const pick = <T>(xs: T[]): T => xs[Math.floor(r() * xs.length)]!;
  const comment = () => `${pick(WORDS)} ${pick(WORDS)} ${pick(WORDS)}`;
  const phone = (nation: number) =>
    `${nation + 10}-${int(100, 999)}-${int(100, 999)}-${int(1000, 9999)}`;
  await sql.unsafe(TPCH_SCHEMA);
  await insertAll(
    sql,
    'region',
    REGIONS.map((name, k) => `(${k}, ${quote(name)}, ${quote(comment())})`),
  );
  await insertAll(
    sql,
    'nation',
    NATIONS.map(([k, name, region]) => `(${k}, ${quote(name)}, ${region}, ${quote(comment())})`),
  );
  // Parts 1 to 6 are anchored: the brands, containers and sizes Q17 and Q19 name (and Q8's
  // type, on part 5).
  const anchors: Array<[string, string, number]> = [
    ['Brand#12', 'SM CASE', 3],
    ['Brand#12', 'SM PKG', 1],
    ['Brand#23', 'MED BOX', 7],
    ['Brand#23', 'MED BOX', 4],
    ['Brand#34', 'LG BOX', 9],
    ['Brand#34', 'LG PKG', 2],
  ];
  const parts: string[] = [];
  for (let p = 1; p <= scale.parts; p += 1) {
    const name = Array.from({ length: 5 }, () => pick(COLOURS)).join(' ');
    const m = int(1, 5);
    const anchor = anchors[p - 1];
    const brand = anchor?.[0] ?? `Brand#${m}${int(1, 5)}`;
    const drawn = `${pick(TYPE1)} ${pick(TYPE2)} ${pick(TYPE3)}`;
    const type = p === 5 ? 'ECONOMY ANODIZED STEEL' : drawn;
    const container = anchor?.[1] ?? `${pick(CONTAINER1)} ${pick(CONTAINER2)}`;
    const size = anchor?.[2] ?? int(1, 10);
    parts.push(
      `(${p}, ${quote(name)}, ${quote(`Manufacturer#${m}`)}, ${quote(brand)}, ${quote(type)}, ${size}, ${quote(container)}, ${money(retailCents(p))}, ${quote(comment().slice(0, 23))})`,
    );
  }
  await insertAll(sql, 'part', parts);
  const suppliers: string[] = [];
  for (let s = 1; s <= scale.suppliers; s += 1) {
    // Every nation has a supplier (dbgen draws them; at this scale some would have none).
    const nation = (s - 1) % 25;
    const complaint = s % 7 === 0 ? `${pick(WORDS)} Customer ${pick(WORDS)} Complaints` : comment();
    suppliers.push(
      `(${s}, ${quote(`Supplier#${String(s).padStart(9, '0')}`)}, ${quote(comment())}, ${nation}, ${quote(phone(nation))}, ${money(int(-99999, 999999))}, ${quote(complaint)})`,
    );
  }
  await insertAll(sql, 'supplier', suppliers);
  const suppliersOf = new Map<number, number[]>();
  const partsupp: string[] = [];
  for (let p = 1; p <= scale.parts; p += 1) {
    const ss = [...new Set(partSuppliers(p, scale.suppliers))];
    suppliersOf.set(p, ss);
    for (const s of ss) {
      partsupp.push(
        `(${p}, ${s}, ${int(1, 9999)}, ${money(int(100, 100000))}, ${quote(comment())})`,
      );
    }
  }
  await insertAll(sql, 'partsupp', partsupp);
  const customers: string[] = [];
  for (let c = 1; c <= scale.customers; c += 1) {
    const nation = c % 25;
    customers.push(
      `(${c}, ${quote(`Customer#${String(c).padStart(9, '0')}`)}, ${quote(comment())}, ${nation}, ${quote(phone(nation))}, ${money(int(-99999, 999999))}, ${quote(pick(SEGMENTS))}, ${quote(comment())})`,
    );
  }
  await insertAll(sql, 'customer', customers);
  const data: TpchData = { scale, suppliersOf, retailPrice: retailCents };
  const orders: string[] = [];
  const lines: string[] = [];
  for (let o = 1; o <= scale.orders; o += 1) {
    const rows = orderRows(r, data, o, orderingCustomer(r, scale));
    orders.push(rows.order);
    lines.push(...rows.lines);
  }
  await insertAll(sql, 'orders', orders);
  await insertAll(sql, 'lineitem', lines);
  await sql.unsafe('ANALYZE');
  return data;
}
