import { parseArgs } from 'node:util';
import { TrellisError } from '../../engine/errors.js';
import type { SelfCheckJob } from '../../engine/selfcheck/types.js';
import { Trellis } from '../../engine/trellis.js';
import { progressLine, reportText } from '../check-output.js';
import { type Command, INSTANCE_OPTIONS, parseCommandArgs } from '../command.js';
import { EXIT_CODES } from '../exit-codes.js';

/** Exit status of a check that found the target diverged (errors exit as their code says). */
export const DIVERGED_EXIT = EXIT_CODES.diverged;

/** How often the job is read back: often on a terminal (the bar moves), else less. */
const POLL_TTY_MS = 200;
const POLL_MS = 1_000;

export const check: Command = {
  name: 'check',
  summary: 'check a target against its definition recomputed from the sources',
  help: `Usage: trellis check <target> [--mode full|sample] [--sample N] [--max-findings N]
                     [--repair] [--json] [--timeout seconds] [--url <postgres url>]
                     [--schema trellis] [--target-schema public]

Starts a self-check of <target> (Trellis.selfCheck()), a job that a drain worker of the
instance runs (your app's workers: a handle with drainThreads > 0), shows its progress
on a terminal, and prints the report: what differs, by kind (missing, extra, differs),
key and column. A check of the target still running is followed rather than started
again.

Exit status: 0 consistent, ${DIVERGED_EXIT} diverged, 1 for a check that failed or was cancelled,
and an error's own status otherwise (trellis --help). With no drain worker running it
refuses at once (conflict, 6).

Options:
  --mode full|sample      every row (default), or a sample of keys across the key space
  --sample <N>            keys a sample compares (default 1000)
  --max-findings <N>      findings listed (default 100; counts stay exact)
  --repair                re-derive the diverged keys through the drain, and say so
  --json                  print the job, report included, as JSON
  --timeout <seconds>     stop waiting after this long (the check goes on); default: none
  --url <url>             Postgres URL (default: $DATABASE_URL)
  --schema <name>         catalog schema (default: trellis)
  --target-schema <name>  the instance's target schema (default: public)
`,
  async run(args, io) {
    const options = {
      ...INSTANCE_OPTIONS,
      url: { type: 'string' },
      mode: { type: 'string' },
      sample: { type: 'string' },
      'max-findings': { type: 'string' },
      repair: { type: 'boolean' },
      json: { type: 'boolean' },
      timeout: { type: 'string' },
    } as const;
    const { values, positionals } = parseCommandArgs('check', () =>
      parseArgs({ args, options, strict: true, allowPositionals: true }),
    );
    if (positionals.length !== 1) {
      throw new TrellisError('validation', 'check needs one target (see trellis check --help)');
    }
    const target = positionals[0]!;
    const url = values.url ?? io.env.DATABASE_URL;
    if (!url)
      throw new TrellisError('validation', 'check needs --url <postgres url> or DATABASE_URL');
    const mode = values.mode ?? 'full';
    if (mode !== 'full' && mode !== 'sample') {
      throw new TrellisError('validation', `--mode must be full or sample, got ${mode}`);
    }
    const count = (name: string, value: string | undefined) => {
      if (value === undefined) return undefined;
      const n = Number(value);
      if (!Number.isInteger(n) || n < 1) {
        throw new TrellisError('validation', `--${name} must be a positive integer, got ${value}`);
      }
      return n;
    };
    const sample = count('sample', values.sample);
    const maxFindings = count('max-findings', values['max-findings']);
    const timeoutSeconds = count('timeout', values.timeout);

    await using trellis = await Trellis.connect({
      url,
      ...(values.schema === undefined ? {} : { schema: values.schema }),
      ...(values['target-schema'] === undefined ? {} : { targetSchema: values['target-schema'] }),
    });
    if (!(await trellis.hasLiveDrainWorkers())) {
      const { schema } = await trellis.config();
      throw new TrellisError(
        'conflict',
        `no drain worker is running for the Trellis instance "${schema}": a check runs on one (a handle with drainThreads > 0, such as your app's workers); start one, then check again`,
      );
    }
    let job = await trellis.selfCheck(target, mode, {
      ...(sample === undefined ? {} : { sample }),
      ...(maxFindings === undefined ? {} : { maxFindings }),
      ...(values.repair ? { repair: true } : {}),
    });
    const live = io.isTTY === true && !values.json;
    const deadline = timeoutSeconds === undefined ? Infinity : Date.now() + timeoutSeconds * 1000;
    const show = (j: SelfCheckJob) => {
      if (live) io.err(`\r\x1b[2K${progressLine(j)}`);
    };
    show(job);
    while (job.state === 'queued' || job.state === 'running') {
      if (Date.now() > deadline) {
        if (live) io.err('\n');
        throw new TrellisError(
          'timeout',
          `the check of ${target} (job ${job.id}) did not finish within ${timeoutSeconds} s; it goes on`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, live ? POLL_TTY_MS : POLL_MS));
      const now = await trellis.selfCheckJob(job.id);
      if (!now) {
        throw new TrellisError(
          'conflict',
          `the check of ${target} was replaced, or ${target} dropped`,
        );
      }
      job = now;
      show(job);
    }
    if (live) io.err('\n');
    io.out(values.json ? `${JSON.stringify(job, null, 2)}\n` : reportText(job));
    if (job.state !== 'done') return 1;
    return job.report?.outcome === 'diverged' ? DIVERGED_EXIT : 0;
  },
};
