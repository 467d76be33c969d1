import cliProgress from 'cli-progress';
import Table from 'cli-table3';
import { createColors } from 'picocolors';
import type {
  DrainWorkers,
  ElectedWorker,
  ProcessInfo,
  Status,
  WorkerHealth,
} from '../../engine/catalog/status-types.js';
import { paceText, progressOf } from './progress.js';

/**
 * What `trellis status` shows of each transform: a table (one row per transform, its
 * failures as notes under it) for a terminal or a one-shot run, and one plain line per
 * transform for a log (`--watch` piped). The terminal drawing itself — column widths with
 * colours in them, the progress bar, the redraw — is the libraries' (ADR 0021).
 */

const BAR_SIZE = 20;
const { shades_classic: barChars } = cliProgress.Presets;

/** The progress bar, as cli-progress draws its own. */
function bar(fraction: number): string {
  return cliProgress.Format.BarFormat(fraction, {
    barsize: BAR_SIZE,
    barCompleteString: barChars.barCompleteChar.repeat(BAR_SIZE),
    barIncompleteString: barChars.barIncompleteChar.repeat(BAR_SIZE),
    barGlue: '',
  });
}

function progressText(status: Status): string {
  const p = progressOf(status);
  if (!p) return '';
  const held = status.backfill?.keysHeld
    ? `, ${status.backfill.keysHeld.toLocaleString('en-US')} held`
    : '';
  const pace = paceText(p);
  const keys = `${p.done.toLocaleString('en-US')}/${p.total === null ? '?' : p.total.toLocaleString('en-US')} keys${held}${pace ? ` (${pace})` : ''}`;
  if (p.fraction === null) return keys;
  return `${Math.floor(p.fraction * 100)}% ${keys}`;
}

function lagText(status: Status): string {
  if (status.lag.segments === 0 && status.lag.seconds === 0) return '-';
  return `${status.lag.segments} seg, ${Math.round(status.lag.seconds)} s`;
}

function pausesText(status: Status): string {
  const parts = [
    ...status.pausedColumns,
    ...status.pausedUpstreamColumns.map((c) => `upstream ${c}`),
  ];
  return parts.length > 0 ? parts.join(', ') : '-';
}

function waitText(status: Status): string {
  const w = status.captureWait;
  if (!w) return '-';
  const waitingOn = w.blockers.length + w.prepared.length;
  return `${w.operation} ${w.table}: ${waitingOn} blocker${waitingOn === 1 ? '' : 's'}`;
}

function lifecycleText(status: Status): string {
  return status.status === 'paused' && status.pauseReason
    ? `paused (${status.pauseReason})`
    : status.status;
}

/** Notes under the table: what stopped or keeps failing, one line each. */
function notes(status: Status): string[] {
  const lines: string[] = [];
  if (status.captureFailure) {
    lines.push(
      `${status.target}: capture ${status.captureFailure.kind}: ${status.captureFailure.error}`,
    );
  }
  if (status.buildFailure) {
    lines.push(
      `${status.target}: build failed ${status.buildFailure.attempts} time(s): ${status.buildFailure.error}`,
    );
  }
  if (status.drainFailure) {
    lines.push(
      `${status.target}: a ledger page keeps failing (${status.drainFailure.attempts} attempts): ${status.drainFailure.error}`,
    );
  }
  // A source index the target needs (its changes are found by it): the fix in both forms,
  // a migration's transaction cannot run CONCURRENTLY, psql should.
  for (const gap of status.sourceIndexGaps ?? []) {
    if (gap.optedOut) continue;
    lines.push(
      `${status.target}: ${gap.table} has no index on (${gap.columns.join(', ')}) (${gap.role.replace('_', ' ')}); in a migration: ${gap.fixInMigration} — from psql: ${gap.fix}`,
    );
  }
  return lines;
}

export interface RenderOptions {
  /** ANSI colours (a terminal without NO_COLOR). */
  color: boolean;
  /** The instance's workers and processes, shown under the table (ADR 0038). */
  workers?: WorkerHealth;
}

function ago(at: Date | null, now: number): string {
  if (!at) return 'no pass yet';
  return `last pass ${Math.max(0, Math.round((now - at.getTime()) / 1000))} s ago`;
}

function passingText(w: ElectedWorker | DrainWorkers): string {
  if (w.problem) return 'failing';
  return w.passing === null ? 'not reporting' : 'passing';
}

function electedText(name: string, w: ElectedWorker, now: number): string {
  if (!w.elected) return `${name}: none elected`;
  const where = w.process
    ? ` on ${w.process.host} pid ${w.process.pid} (trellis-pg ${w.process.packageVersion})`
    : '';
  return `${name}: elected${where}, ${passingText(w)}, ${ago(w.lastPassAt, now)}`;
}

function processText(p: ProcessInfo, installed: number): string {
  const roles = [
    ...(p.staging ? ['staging'] : []),
    ...(p.drainLoops > 0 ? [`${p.drainLoops} drain loop${p.drainLoops === 1 ? '' : 's'}`] : []),
  ].join(' + ');
  const schema =
    p.schemaVersion === installed
      ? `schema ${p.schemaVersion}`
      : `schema ${p.schemaVersion} (${p.schemaVersion < installed ? 'older' : 'newer'} than the installed ${installed})`;
  const flags = [
    ...(p.stale ? [`not reporting since ${p.heartbeatAt.toISOString()}`] : []),
    ...(p.refused ? [`refused: ${p.refused}`] : []),
  ];
  return `  ${p.host} pid ${p.pid}  trellis-pg ${p.packageVersion}  ${schema}  ${roles || 'no workers'}${flags.length > 0 ? `  ${flags.join('; ')}` : ''}`;
}

/**
 * The workers under the table: the staging worker, the WAL decoder (under WAL capture),
 * the drain loops, what stops the pipeline, and each process with its versions.
 */
export function renderWorkers(health: WorkerHealth, color: boolean, now = Date.now()): string {
  const c = createColors(color);
  const d = health.drain;
  const lines = [
    electedText('staging worker', health.staging, now),
    ...(health.decoder ? [electedText('WAL decoder', health.decoder, now)] : []),
    d.loops === 0
      ? 'drain loops: none running'
      : `drain loops: ${d.loops} running, ${passingText(d)}, ${ago(d.lastPassAt, now)}`,
  ];
  const problems = [health.staging, health.decoder, d]
    .map((w) => w?.problem)
    .filter((p): p is string => typeof p === 'string')
    .map((p) => c.red(`! workers: ${p}`));
  const processes =
    health.processes.length === 0
      ? [`processes: none registered (schema ${health.schemaVersion})`]
      : [
          `processes (schema ${health.schemaVersion} installed):`,
          ...health.processes.map((p) => processText(p, health.schemaVersion)),
        ];
  return `${[...lines, ...problems, ...processes].join('\n')}\n`;
}

/** The status table, ending with a newline. */
export function renderTable(statuses: readonly Status[], options: RenderOptions): string {
  const c = createColors(options.color);
  const paint = (s: Status): string => {
    const text = lifecycleText(s);
    switch (s.status) {
      case 'live':
        return c.green(text);
      case 'catching_up':
        return c.cyan(text);
      case 'backfilling':
        return c.yellow(text);
      case 'paused':
        return c.red(text);
      default:
        return c.dim(text);
    }
  };
  const table = new Table({
    head: ['TARGET', 'STATUS', 'LAG', 'HELD', 'PAUSES', 'CAPTURE WAIT', 'BACKFILL'].map((h) =>
      c.bold(h),
    ),
    chars: {
      top: '',
      'top-mid': '',
      'top-left': '',
      'top-right': '',
      bottom: '',
      'bottom-mid': '',
      'bottom-left': '',
      'bottom-right': '',
      left: '',
      'left-mid': '',
      mid: '',
      'mid-mid': '',
      right: '',
      'right-mid': '',
      middle: '  ',
    },
    style: { head: [], border: [], 'padding-left': 0, 'padding-right': 0 },
  });
  for (const s of statuses) {
    const p = progressOf(s);
    const progress = p
      ? `${p.fraction === null ? '' : `${c.yellow(bar(p.fraction))} `}${progressText(s)}`
      : '';
    table.push([
      s.target,
      paint(s),
      lagText(s),
      s.heldKeys > 0 ? c.red(String(s.heldKeys)) : '0',
      pausesText(s),
      s.captureWait ? c.yellow(waitText(s)) : waitText(s),
      progress,
    ]);
  }
  const body = statuses.length > 0 ? table.toString() : 'no transforms are defined';
  const extra = statuses.flatMap(notes).map((line) => c.red(`! ${line}`));
  const workers = options.workers ? `\n${renderWorkers(options.workers, options.color)}` : '';
  return `${[body, ...extra].join('\n')}\n${workers}`;
}

/** One plain line for a transform: `target status lag=… held=… …` (no colours, no bar). */
export function renderLine(status: Status): string {
  const fields = [
    status.target,
    lifecycleText(status),
    `lag=${lagText(status)}`,
    `held=${status.heldKeys}`,
  ];
  if (status.pausedColumns.length + status.pausedUpstreamColumns.length > 0) {
    fields.push(`pauses=${pausesText(status).replaceAll(' ', '')}`);
  }
  if (status.captureWait) fields.push(`wait="${waitText(status)}"`);
  const progress = progressText(status);
  if (progress) fields.push(`backfill="${progress}"`);
  if (status.lastApply) fields.push(`applied=${status.lastApply.mode}`);
  for (const note of notes(status)) fields.push(`! ${note.slice(status.target.length + 2)}`);
  return fields.join(' ');
}
