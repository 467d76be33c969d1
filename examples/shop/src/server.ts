// The shop's web process: the HTTP API and the operations page. It runs no Trellis worker
// (src/worker.ts does), so its handle only reads status and applies operators' actions.
import { serve } from '@hono/node-server';
import { drizzle } from 'drizzle-orm/postgres-js';
import postgres from 'postgres';
import { Trellis } from 'trellis-pg';
import { createApp } from './app.js';

const url = process.env.DATABASE_URL;
if (!url) throw new Error('set DATABASE_URL (see README.md)');
const port = Number(process.env.PORT ?? 3000);

// drizzle gets a postgres.js client of its own; Trellis keeps its own connections.
const client = postgres(url, { max: 10, onnotice: () => {} });
const db = drizzle({ client });
const trellis = await Trellis.connect({ url, pool: { max: 4 } });

// Replace with your app's own auth. Here: actions only from this machine, and only when
// SHOP_OPS_ACTIONS=1, so a page reached from elsewhere stays read-only.
const allowActions = process.env.SHOP_OPS_ACTIONS === '1';
const app = createApp({
  db,
  trellis,
  authorizeOps: (request) =>
    allowActions &&
    ['127.0.0.1', '::1', '::ffff:127.0.0.1'].includes(request.socket.remoteAddress ?? ''),
});

const server = serve(
  { fetch: app.fetch, port, hostname: process.env.HOST ?? '127.0.0.1' },
  (info) => console.log(`shop listening on http://localhost:${info.port} (operations page: /ops/)`),
);

// Graceful shutdown: stop taking requests, then close Trellis's and drizzle's connections.
async function stop(signal: string): Promise<void> {
  console.log(`shop: ${signal}, shutting down`);
  server.close();
  await Promise.allSettled([trellis.shutdown(), client.end({ timeout: 5 })]);
  process.exit(0);
}
process.once('SIGTERM', () => void stop('SIGTERM'));
process.once('SIGINT', () => void stop('SIGINT'));
