// Run by old-build.ts in a child process: an earlier trellis-pg (its source tree in argv[2])
// brings an instance to the state it leaves behind. Argv: tree, url, scenario JSON.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import postgres from 'postgres';
import type { OldScenario } from './old-build.js';

interface OldTrellis {
  migrate(): Promise<unknown>;
  define(statement: string): Promise<unknown>;
  status(target: string): Promise<{ status: string; pauseReason: string | null }>;
  shutdown(): Promise<void>;
}

const [dir, url, json] = process.argv.slice(2) as [string, string, string];
const scenario = JSON.parse(json) as OldScenario;
const { Trellis } = (await import(pathToFileURL(join(dir, 'src/engine/index.ts')).href)) as {
  Trellis: { connect(options: Record<string, unknown>): Promise<OldTrellis> };
};
const lines: string[] = [];
const log = (level: string) => (obj: Record<string, unknown>, msg: string) => {
  if (level !== 'debug') lines.push(`${level} ${msg} ${JSON.stringify(obj)}`);
};
const logger = { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error') };

try {
  const migrator = await Trellis.connect({ url, logger });
  await migrator.migrate();
  await migrator.shutdown();
  const trellis = await Trellis.connect({ url, logger, staging: true, drainThreads: 2 });
  for (const { statement } of scenario.statements) await trellis.define(statement);
  const deadline = Date.now() + 60_000;
  for (const { target } of scenario.statements) {
    for (;;) {
      const status = await trellis.status(target);
      if (status.status === 'live') break;
      if (status.pauseReason !== null || Date.now() > deadline) {
        throw new Error(`${target} did not become live: ${JSON.stringify(status)}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 50)); // the poll interval of this wait
    }
  }
  const sql = postgres(url, { max: 1, onnotice: () => undefined });
  for (const write of scenario.writesWhileLive) await sql.unsafe(write);
  await sql.end();
  await trellis.shutdown();
} catch (error) {
  console.error(lines.join('\n'));
  throw error;
}
