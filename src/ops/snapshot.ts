import { type Progress, progressOf } from '../cli/status/progress.js';
import { readStatuses } from '../cli/status/read.js';
import type { QuarantineSample } from '../engine/catalog/quarantine.js';
import type { Status } from '../engine/catalog/status-types.js';
import type { SelfCheckJob } from '../engine/selfcheck/types.js';
import type { Trellis } from '../engine/trellis.js';
import type { OpsActionName } from './actions.js';

/**
 * What the operations page shows, read in one go: every transform with its status (the
 * same `status()` the CLI's table shows), the keys it holds (a first page of each address),
 * its latest self-check, and whether any process runs the workers. Served as JSON; the
 * page renders it as text only.
 */

/** How many held keys of each address the page lists (the count is always exact). */
export const HELD_SAMPLE_LIMIT = 10;

/** One quarantine address of a transform: `"target"` or `"target.column"`. */
export interface OpsHeldAddress {
  address: string;
  count: number;
  paused: boolean;
  oldestPoisonedAt: Date;
  /** The first keys it holds, by (source table, key). */
  samples: QuarantineSample[];
}

/** One transform, as the page shows it. */
export interface OpsTransform {
  target: string;
  /** The TRANSFORM statement as registered. */
  statement: string;
  status: Status;
  /** Backfill progress, its pace and the time it has left (null unless backfilling). */
  progress: Progress | null;
  held: OpsHeldAddress[];
  /** The latest self-check of the transform, if any was asked for. */
  selfCheck: SelfCheckJob | null;
}

/** The whole page's data at one moment. */
export interface OpsSnapshot {
  at: Date;
  /** `"<database>/<catalog schema>"`, as metrics and logs name the instance. */
  instance: string;
  targetSchema: string;
  /** Whether some process runs the staging worker, and some a drain loop, now. */
  workers: { staging: boolean; drain: boolean };
  transforms: OpsTransform[];
  /** The actions this request may take (empty: the page is read-only for it). */
  actions: OpsActionName[];
}

/** The transform an address belongs to: the longest target name it starts with. */
function ownerOf(address: string, targets: readonly string[]): string | undefined {
  let owner: string | undefined;
  for (const target of targets) {
    if (address !== target && !address.startsWith(`${target}.`)) continue;
    if (owner === undefined || target.length > owner.length) owner = target;
  }
  return owner;
}

/** Reads the snapshot; `actions` is what the caller authorized for this request. */
export async function readOpsSnapshot(
  trellis: Trellis,
  actions: OpsActionName[],
): Promise<OpsSnapshot> {
  const [definitions, statuses, quarantine, checks, staging, drain] = await Promise.all([
    trellis.definitions(),
    readStatuses(trellis),
    trellis.quarantined(),
    trellis.selfCheckJobs(),
    trellis.hasLiveStagingWorker(),
    trellis.hasLiveDrainWorkers(),
  ]);
  const targets = statuses.map((s) => s.target);
  const held = new Map<string, OpsHeldAddress[]>();
  await Promise.all(
    quarantine.map(async (entry) => {
      const owner = ownerOf(entry.address, targets);
      if (owner === undefined) return; // dropped since quarantined() listed it
      const page = await trellis.sampleQuarantined(entry.address, { limit: HELD_SAMPLE_LIMIT });
      const list = held.get(owner) ?? [];
      list.push({ ...entry, samples: page.samples });
      held.set(owner, list);
    }),
  );
  const statements = new Map(definitions.map((d) => [d.target, d.statement]));
  const latestCheck = new Map(checks.map((job) => [job.target, job]));
  const summary = trellis.toJSON();
  return {
    at: new Date(),
    instance: summary.instance,
    targetSchema: summary.targetSchema,
    workers: { staging, drain },
    transforms: statuses.map((status) => ({
      target: status.target,
      statement: statements.get(status.target) ?? '',
      status,
      progress: progressOf(status),
      held: (held.get(status.target) ?? []).sort((a, b) => a.address.localeCompare(b.address)),
      selfCheck: latestCheck.get(status.target) ?? null,
    })),
    actions,
  };
}
