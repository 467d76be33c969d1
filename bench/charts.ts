import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import * as vega from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';
import { type AltFigure, freshnessSpec, ratioSpec, targetsSpec } from './charts-specs.js';
import { sideBySideTable } from './charts-table.js';
import type { BenchResults } from './scenario.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const OUT_DIR = join(ROOT, 'docs', 'performance');

/**
 * Draws the side-by-side scenario's figures (bench/alternatives.ts) as SVG with vega-lite,
 * rendered by vega in Node (no browser, no canvas), into docs/performance/, with the
 * side-by-side table as Markdown for README; every target of the run, from every scenario,
 * in one chart (targets.svg); and the whole run's results as JSON (run.json). Returns the
 * files.
 */
export async function writeAlternatives(results: BenchResults): Promise<string[]> {
  const figures = results.figures.filter(
    (f): f is AltFigure => f.scenario === 'alternatives' && f.detail !== undefined,
  );
  const loads = results.machine.loadAverage.during ?? [];
  const load = loads.length
    ? `load average ${Math.min(...loads).toFixed(1)}–${Math.max(...loads).toFixed(1)}`
    : `load average ${results.machine.loadAverage.start[0]?.toFixed(1)} at the start`;
  const version = results.server.settings.server_version?.split(' ')[0] ?? '?';
  const about = `One run at ${results.commit ?? 'an uncommitted tree'}: Postgres ${version}, ${results.machine.cores} cores shared by all of it, ${load}.`;
  const files: Array<[string, string]> = [
    [
      'alternatives-writes.svg',
      await svg(
        ratioSpec(figures, {
          title:
            'Single-row write throughput at 8 clients, as a ratio to bare in the same run (higher is better)',
          about,
          workloads: ['INSERT', 'UPDATE'],
          axis: 'ops/s ÷ bare ops/s',
        }),
      ),
    ],
    [
      'alternatives-bulk.svg',
      await svg(
        ratioSpec(figures, {
          title: 'One 100,000-row INSERT … SELECT: time as a ratio to bare (lower is better)',
          about,
          workloads: ['bulk'],
          axis: 'ms ÷ bare ms',
        }),
      ),
    ],
    ['alternatives-freshness.svg', await svg(freshnessSpec(figures, about))],
    // Every scenario's targets, not only this one's: the run at a glance.
    ['targets.svg', await svg(targetsSpec(results.figures, about))],
    ['alternatives.md', `${sideBySideTable(figures)}\n`],
    // The whole run (every scenario's figures and samples), so README's figures from this
    // run can be checked against it: bench/results/latest.json is not committed.
    ['run.json', `${JSON.stringify(results, null, 2)}\n`],
  ];
  await mkdir(OUT_DIR, { recursive: true });
  for (const [name, text] of files) await writeFile(join(OUT_DIR, name), text);
  return files.map(([name]) => relative(ROOT, join(OUT_DIR, name)));
}

async function svg(spec: TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(compile(spec).spec as vega.Spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

// `tsx bench/charts.ts [results.json]`: draws them again from a run's results (by default
// bench/results/latest.json), without running the benchmark.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const file = process.argv[2] ?? join(ROOT, 'bench', 'results', 'latest.json');
  const results = JSON.parse(await readFile(file, 'utf8')) as BenchResults;
  for (const written of await writeAlternatives(results)) console.log(written);
}
