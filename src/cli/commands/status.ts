import { InvalidArgumentError, Option } from 'commander';
import { LIFECYCLES, type Lifecycle } from '../../engine/catalog/status-types.js';
import { connectCli, printJson } from '../connect.js';
import { type ConnectionFlags, defineCommand, type JsonFlag } from '../define-command.js';
import { readStatuses } from '../status/read.js';
import { renderTable } from '../status/render.js';
import { watchStatus } from '../status/watch.js';

interface StatusFlags extends ConnectionFlags, JsonFlag {
  watch?: boolean;
  interval: number;
  until?: Lifecycle;
}

export function positiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1)
    throw new InvalidArgumentError('expected a whole number above 0');
  return n;
}

export const status = defineCommand<StatusFlags>({
  name: 'status',
  summary:
    'where each transform is: lifecycle, lag, held keys, pauses, waits, backfill progress, workers',
  description: `Shows every transform (or one) as a table: its lifecycle, lag, held keys, paused
columns, what its capture waits on, and a progress bar per backfill; failures are listed
under the table, then the workers (the staging worker, the drain loops, what stops them)
and every process running them, with its trellis-pg and schema versions. Piped, the table
has no colours. --json prints the statuses, each with its workers, workerFailure and waitingOn.

--watch reads again every --interval ms until Ctrl-C (or until every transform shown
is at --until): on a terminal the table is redrawn in place; piped, each transform gets
a timestamped line whenever it changes; with --json, one JSON object a line per read
({"at", "transforms": [status…]}).`,
  connects: true,
  json: true,
  setup(command) {
    command
      .argument('[target]', 'one transform (default: every transform)')
      .option('-w, --watch', 'keep reading, and redraw')
      .option('--interval <ms>', 'how often --watch reads', positiveInt, 1000)
      .addOption(
        new Option(
          '--until <lifecycle>',
          'with --watch: stop once every transform shown is at it',
        ).choices(LIFECYCLES),
      );
  },
  epilog: `Examples:
  trellis status
  trellis status orders_by_customer --watch
  trellis status --watch --until live     # wait for a deploy's backfills
  trellis status --json | jq '.[] | select(.heldKeys > 0)'`,
  async run({ operands, options, io }) {
    const [target] = operands;
    await using trellis = await connectCli(options, io, 'status');
    const color = io.tty !== undefined && !io.env.NO_COLOR;
    if (options.watch || options.until) {
      await watchStatus(trellis, io, {
        target,
        intervalMs: options.interval,
        json: options.json === true,
        until: options.until,
        color,
      });
      return;
    }
    const statuses = await readStatuses(trellis, target);
    if (options.json) {
      printJson(io, target === undefined ? statuses : statuses[0]);
    } else {
      io.out(renderTable(statuses, { color, workers: await trellis.workers() }));
    }
  },
});
