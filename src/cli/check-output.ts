import type { SelfCheckFinding, SelfCheckJob } from '../engine/selfcheck/types.js';

/** What `trellis check` prints: the live progress line and the report. Pure, for tests. */

const number = new Intl.NumberFormat('en-US');

/**
 * One line of progress for a terminal: a bar over rowsCompared out of rowsTotal (an
 * estimate: the bar stops short of full until the job is done), or the job's state.
 */
export function progressLine(job: SelfCheckJob, width = 30): string {
  if (job.state === 'queued') return `${job.target}: queued, waiting for a drain worker`;
  const total = job.rowsTotal ?? 0;
  const done = job.state === 'done';
  const fraction = done ? 1 : total > 0 ? Math.min(0.99, job.rowsCompared / total) : 0;
  const filled = Math.round(fraction * width);
  const bar = `${'#'.repeat(filled)}${'.'.repeat(width - filled)}`;
  const of = total > 0 ? ` / ${number.format(total)}` : '';
  return `${job.target}: [${bar}] ${Math.floor(fraction * 100)
    .toString()
    .padStart(3)}% ${number.format(job.rowsCompared)}${of} rows`;
}

function finding(f: SelfCheckFinding): string {
  const key = f.key === null ? 'NULL' : f.key;
  if (f.kind !== 'differs' || !f.columns) return `  ${f.kind.padEnd(8)} key ${key}`;
  const columns = f.columns
    .map((c) => `${c.column}: target ${c.target ?? 'NULL'}, recomputed ${c.recomputed ?? 'NULL'}`)
    .join('; ');
  return `  ${f.kind.padEnd(8)} key ${key}: ${columns}`;
}

/** The finished job, for people: outcome, counts, findings, and what was left out. */
export function reportText(job: SelfCheckJob): string {
  const lines = [`trellis check ${job.target} (${job.mode}): ${outcomeOf(job)}`];
  const report = job.report;
  if (!report) {
    lines.push(`  ${job.error ?? 'no report'}`);
    return `${lines.join('\n')}\n`;
  }
  const { missing, extra, differs } = report.counts;
  const total = missing + extra + differs;
  lines.push(`  rows compared   ${number.format(report.rowsCompared)}`);
  lines.push(
    `  findings        ${total === 0 ? 'none' : `${number.format(total)} (missing ${missing}, extra ${extra}, differs ${differs})`}`,
  );
  for (const f of report.divergences) lines.push(finding(f));
  if (report.truncated) {
    lines.push(`  … ${number.format(total - report.divergences.length)} more (see --max-findings)`);
  }
  if (report.repaired) lines.push(`  repaired        ${report.repaired.findings} findings`);
  lines.push(
    `  held keys       ${report.heldKeys.count}${report.heldKeys.count > 0 ? ' (rows they route to were not compared: see quarantined())' : ''}`,
  );
  if (report.unsettledKeys > 0) {
    lines.push(`  unsettled keys  ${report.unsettledKeys} (kept changing throughout the check)`);
  }
  if (report.skippedColumns.length > 0) {
    lines.push(`  not compared    ${report.skippedColumns.join(', ')} (paused)`);
  }
  lines.push(
    `  drain failures  ${report.drainFailures.length === 0 ? 'none' : report.drainFailures.map((f) => `segment ${f.segSeq}: ${f.error} (${f.attempts} attempts)`).join('; ')}`,
  );
  return `${lines.join('\n')}\n`;
}

function outcomeOf(job: SelfCheckJob): string {
  if (job.state === 'done') return job.report?.outcome ?? 'done';
  return job.state;
}
