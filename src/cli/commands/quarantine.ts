import { connectCli, printJson } from '../connect.js';
import { type ConnectionFlags, defineCommand, type JsonFlag } from '../define-command.js';
import { positiveInt } from './status.js';

interface QuarantineFlags extends ConnectionFlags, JsonFlag {
  limit: number;
  cursor?: string;
}

export const quarantine = defineCommand<QuarantineFlags>({
  name: 'quarantine',
  summary: 'the keys held back (quarantined): every address, or one address’s keys',
  description: `Without an address: every address ("transform" or "transform.column") holding
keys, with how many, the oldest, and whether it is paused. With one: its count, then a
page of its held keys (source table, key, error) ordered by (table, key); the command
for the next page is printed at the end (--cursor).`,
  connects: true,
  json: true,
  setup(command) {
    command
      .argument('[address]', 'a transform, or transform.column')
      .option('--limit <n>', 'keys per page', positiveInt, 20)
      .option('--cursor <cursor>', 'the page after this one (as printed, or nextCursor)');
  },
  epilog: `Examples:
  trellis quarantine
  trellis quarantine prices.ratio --limit 50
  trellis quarantine prices.ratio --json   # {"address", "count", "oldestPoisonedAt", "samples", "nextCursor"}`,
  async run({ operands, options, io }) {
    const [address] = operands;
    await using trellis = await connectCli(options, io, 'quarantine');
    if (address === undefined) {
      const entries = await trellis.quarantined();
      if (options.json) {
        printJson(io, entries);
      } else if (entries.length === 0) {
        io.out('no keys are held\n');
      } else {
        for (const e of entries) {
          const paused = e.paused ? ', paused' : '';
          io.out(
            `${e.address}\t${e.count} held, oldest ${e.oldestPoisonedAt.toISOString()}${paused}\n`,
          );
        }
      }
      return;
    }
    const count = await trellis.quarantineStatus(address);
    const page = await trellis.sampleQuarantined(address, {
      limit: options.limit,
      ...(options.cursor === undefined ? {} : { cursor: options.cursor }),
    });
    if (options.json) {
      printJson(io, { address, ...count, ...page });
      return;
    }
    const oldest = count.oldestPoisonedAt ? `, oldest ${count.oldestPoisonedAt.toISOString()}` : '';
    io.out(`${address}: ${count.count} held${oldest}\n`);
    for (const s of page.samples) {
      io.out(`${s.srcTable}\t${s.key}\t${s.error}${s.sqlstate ? ` (${s.sqlstate})` : ''}\n`);
    }
    if (page.nextCursor) {
      io.out(
        `more: trellis quarantine ${address} --limit ${options.limit} --cursor ${page.nextCursor}\n`,
      );
    }
  },
});
