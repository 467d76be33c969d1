import type { Logger } from '../logger.js';
import type { InstanceSnapshot, TransformSnapshot } from './catalog-snapshot.js';
import type { TrellisEvents } from './events.js';

/** A snapshot younger than this is fresh enough for anyone (scrape, events, staging pass). */
export const SNAPSHOT_MAX_AGE_MS = 1_000;

/**
 * The one source of what the handle tells about the instance's transforms: the catalog
 * snapshot (catalog-snapshot.ts), read per scrape, per staging pass and, while the app
 * listens for events, once a second. Each new snapshot is compared with the last one, and
 * every change becomes an event for the app's listeners and, in the process whose staging
 * worker is the elected one, a log line: one line per change in the whole fleet, whichever
 * process (or SQL session) made it.
 */
export class CatalogWatch {
  private last: InstanceSnapshot | undefined;
  /** When the read that produced `last` started: an older read finishing later is stale. */
  private lastStarted = 0;
  private inFlight: Promise<InstanceSnapshot> | undefined;
  /** Whether this process logged changes at the last snapshot (see accept). */
  private wasLogging = false;

  constructor(
    private readonly events: TrellisEvents,
    private readonly log: Logger,
    /** Whether this process logs changes (its staging worker is the elected one). */
    private readonly logsChanges: () => boolean,
  ) {}

  get latest(): InstanceSnapshot | undefined {
    return this.last;
  }

  /**
   * The latest snapshot if younger than `maxAgeMs`, else a new one from `read` (concurrent
   * callers share one read). Rejects with what `read` rejects with.
   */
  fresh(
    read: () => Promise<InstanceSnapshot>,
    maxAgeMs = SNAPSHOT_MAX_AGE_MS,
  ): Promise<InstanceSnapshot> {
    if (this.last && Date.now() - this.last.at < maxAgeMs) return Promise.resolve(this.last);
    if (this.inFlight) return this.inFlight;
    return this.start(read);
  }

  /**
   * For the staging worker: reads a snapshot if the last one is older than a second and
   * no read is in flight elsewhere (a read on the call pool may wait for a connection; the
   * staging worker never waits on it).
   */
  async refreshUnlessBusy(read: () => Promise<InstanceSnapshot>): Promise<void> {
    if (this.inFlight) return;
    if (this.last && Date.now() - this.last.at < SNAPSHOT_MAX_AGE_MS) return;
    await this.start(read);
  }

  private start(read: () => Promise<InstanceSnapshot>): Promise<InstanceSnapshot> {
    const started = Date.now();
    const reading = read().then((snapshot) => {
      this.accept(snapshot, started);
      return snapshot;
    });
    this.inFlight = reading;
    const clear = () => {
      if (this.inFlight === reading) this.inFlight = undefined;
    };
    reading.then(clear, clear);
    return reading;
  }

  /** Compares `snapshot` with the last one: events, and log lines where this process logs. */
  private accept(snapshot: InstanceSnapshot, started: number): void {
    if (started < this.lastStarted) return;
    const previous = this.last;
    this.last = snapshot;
    this.lastStarted = started;
    const logging = this.logsChanges();
    // A process that just became the one that logs starts from what it sees now: the
    // changes before were the previous leader's to log.
    const log = logging && this.wasLogging ? this.log : undefined;
    this.wasLogging = logging;
    // Every change the catalog held when this read started is told by now (events, and
    // lines where this process logs): tests bound "nothing more was logged" by this line
    // rather than by a sleep (test/state-changes.test.ts).
    this.log.debug(
      { readStartedAt: started, logging: log !== undefined },
      'catalog snapshot compared',
    );
    if (!previous) return;
    for (const [target, now] of snapshot.transforms) {
      this.compareTransform(previous.transforms.get(target), now, log);
    }
    for (const [target, was] of previous.transforms) {
      if (snapshot.transforms.has(target)) continue;
      this.events.emit('status', {
        target,
        status: 'dropped',
        previous: was.status,
        pauseReason: null,
        pausedColumns: [],
      });
      log?.info({ target }, `transform ${target} dropped`);
    }
    const heldBefore = new Map(previous.held.map((h) => [h.address, h.count]));
    const heldNow = new Map(snapshot.held.map((h) => [h.address, h]));
    for (const h of snapshot.held) {
      const before = heldBefore.get(h.address) ?? 0;
      if (h.count !== before) {
        this.events.emit('held', {
          address: h.address,
          target: h.target,
          heldKeys: h.count,
          previous: before,
        });
      }
    }
    for (const h of previous.held) {
      if (heldNow.has(h.address)) continue;
      this.events.emit('held', {
        address: h.address,
        target: h.target,
        heldKeys: 0,
        previous: h.count,
      });
    }
  }

  private compareTransform(
    was: TransformSnapshot | undefined,
    now: TransformSnapshot,
    log: Logger | undefined,
  ): void {
    const target = now.target;
    const columns = now.pausedColumns.map((c) => c.address);
    const wasColumns = was?.pausedColumns.map((c) => c.address) ?? [];
    const statusChanged =
      !was ||
      was.status !== now.status ||
      was.pauseReason !== now.pauseReason ||
      columns.join('\n') !== wasColumns.join('\n');
    const failure = now.captureFailure;
    const newFailure =
      failure !== null &&
      (!was?.captureFailure ||
        was.captureFailure.detectedAt.getTime() !== failure.detectedAt.getTime());
    if (statusChanged) {
      this.events.emit('status', {
        target,
        status: now.status,
        previous: was?.status ?? null,
        pauseReason: now.pauseReason,
        pausedColumns: columns,
      });
    }
    if (newFailure) this.events.emit('captureFailure', { target, captureFailure: failure });
    if (!log) return;

    const fields = { target, status: now.status, previous: was?.status ?? null };
    if (!was) {
      log.info(fields, `transform ${target} defined: ${now.status.replaceAll('_', ' ')}`);
    } else if (now.status === 'paused' && was.status !== 'paused') {
      const why = failure && newFailure ? `: ${failure.error}` : '';
      const line = { ...fields, reason: now.pauseReason, kind: failure?.kind };
      // An operator's pause is intended; anything else needs someone to look.
      if (now.pauseReason === 'operator')
        log.info(line, `transform ${target} paused by an operator`);
      else log.warn(line, `transform ${target} paused (${now.pauseReason})${why}`);
    } else if (was.status === 'paused' && now.status !== 'paused') {
      log.info(fields, `transform ${target} resumed: ${now.status}`);
    } else if (was.status !== now.status) {
      log.info(fields, `transform ${target} is ${now.status.replaceAll('_', ' ')}`);
    } else if (was.pauseReason !== now.pauseReason && now.status === 'paused') {
      log.warn(
        { ...fields, reason: now.pauseReason },
        `transform ${target} paused (${now.pauseReason})`,
      );
    }
    // A capture failure on a transform that was paused already (an operator's pause stays).
    if (newFailure && !(now.status === 'paused' && was?.status !== 'paused')) {
      log.warn(
        { target, kind: failure.kind, columns: failure.columns },
        `transform ${target} stopped: ${failure.error}`,
      );
    }
    const before = new Map(was?.pausedColumns.map((c) => [c.address, c]) ?? []);
    const after = new Set(columns);
    for (const c of now.pausedColumns) {
      if (before.has(c.address)) continue;
      const line = { target, address: c.address, reason: c.reason };
      if (c.reason === 'operator') log.info(line, `column ${c.address} paused by an operator`);
      else log.warn(line, `column ${c.address} paused (${c.reason})`);
    }
    for (const address of before.keys()) {
      if (!after.has(address)) log.info({ target, address }, `column ${address} resumed`);
    }
  }
}
