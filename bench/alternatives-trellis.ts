import { setTimeout as sleep } from 'node:timers/promises';
import { type CaptureMode, Trellis } from '../src/engine/index.js';
import { converge, quiet, timed } from './support.js';

/**
 * One trellis-pg instance (a database of its own: capture is instance-wide), run as two
 * handles so the drain can stop while capture goes on: a staging handle (the staging
 * worker and, under WAL capture, the decoder writing the ledger) and a drain handle (two
 * drain loops). Between measurements neither runs.
 */
export class TrellisInstance {
  private staging: Trellis | undefined;
  private drain: Trellis | undefined;
  private target: string | undefined;
  private statement: string | undefined;

  private constructor(
    readonly url: string,
    readonly capture: CaptureMode,
  ) {}

  static async install(url: string, capture: CaptureMode): Promise<TrellisInstance> {
    const migrator = await Trellis.connect({ url, logger: quiet });
    try {
      await migrator.migrate();
    } finally {
      await migrator.shutdown();
    }
    return new TrellisInstance(url, capture);
  }

  /**
   * Makes `target` the instance's one transform: the new one defined before the old one is
   * dropped, so its source never stops being captured (under WAL capture, leaving the
   * publication and coming back would wait for every running transaction again). Returns
   * once it is built and, under WAL capture, its source is captured from the slot alone.
   */
  async define(target: string, statement: string): Promise<void> {
    if (this.statement === statement) return;
    await this.up();
    const handle = this.staging!;
    await handle.apply(statement);
    if (this.target && this.target !== target) await handle.apply(`DROP TRANSFORM ${this.target}`);
    this.target = target;
    this.statement = statement;
    if (this.capture === 'logical') await this.walOnly();
    await converge(handle, target);
    await this.down();
  }

  /**
   * Starts capture (and the drain too when `pipeline`), caught up first: the ledger
   * drained and, under WAL capture, the slot decoded up to now. Returns the catch-up, ms.
   */
  async start(pipeline: boolean): Promise<number> {
    await this.up();
    const ms = await timed(() => converge(this.staging!, this.target!));
    if (!pipeline) {
      await this.drain!.shutdown();
      this.drain = undefined;
    }
    return ms;
  }

  /** Lets the drain catch up with what was written, then stops both. Returns the catch-up, ms. */
  async stop(): Promise<number> {
    await this.up();
    const ms = await timed(() => converge(this.staging!, this.target!));
    await this.down();
    return ms;
  }

  async close(): Promise<void> {
    await this.down();
  }

  private async up(): Promise<void> {
    this.staging ??= await Trellis.connect({
      url: this.url,
      logger: quiet,
      staging: true,
      capture: this.capture,
    });
    this.drain ??= await Trellis.connect({ url: this.url, logger: quiet, drainThreads: 2 });
  }

  private async down(): Promise<void> {
    await Promise.all([this.staging?.shutdown(), this.drain?.shutdown()]);
    this.staging = undefined;
    this.drain = undefined;
  }

  /** Every source captured from the slot alone (status(), ADR 0023); 3 minutes at most. */
  private async walOnly(): Promise<void> {
    const deadline = performance.now() + 180_000;
    for (;;) {
      const { sources } = (await this.staging!.status(this.target!)).capture;
      if (sources.length > 0 && sources.every((s) => s.mode === 'logical')) return;
      if (performance.now() > deadline) {
        const modes = sources.map((s) => `${s.table}: ${s.mode} (${s.reason ?? '-'})`).join(', ');
        throw new Error(`${this.target}: not captured from the slot alone after 3 min: ${modes}`);
      }
      await sleep(250);
    }
  }
}
