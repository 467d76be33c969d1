import type { Trellis } from '../engine/trellis.js';

/**
 * Thrown by `resumeCaptureDisruptions` when some RESUMEs were refused (a table that is
 * gone, a definition that would no longer be accepted) or a resumed transform paused
 * again. Every other disrupted transform was resumed, and waited for, before it is thrown.
 */
export class ResumeRefused extends Error {
  override readonly name = 'ResumeRefused';

  constructor(
    /** Each target that stays paused, and why. */
    readonly refused: Record<string, string>,
    /** The targets that were resumed. */
    readonly resumed: string[],
  ) {
    super(
      `RESUME refused for ${Object.entries(refused)
        .map(([target, reason]) => `${target} (${reason})`)
        .join(', ')}`,
    );
  }
}

/**
 * For suites that load fixtures with capture triggers disabled (`ALTER TABLE … DISABLE
 * TRIGGER ALL`, `pg_restore --disable-triggers`): Trellis stops every transform reading
 * such a table (its rows never reached the ledger). This detects that now (no wait for
 * the staging worker), resumes only the transforms stopped by a disruption (operator
 * pauses and other failures stay paused), waits until each is live again and every write
 * committed so far has reached it, and resolves to the resumed targets (`[]` when nothing
 * was disrupted). Needs a handle with `staging: true` and a drain (the resume rebuilds
 * through them).
 */
export async function resumeCaptureDisruptions(
  trellis: Trellis,
  options: { timeoutMs?: number } = {},
): Promise<string[]> {
  const deadline = Date.now() + (options.timeoutMs ?? 30_000);
  await trellis.detectCaptureDisruptions();
  const disrupted = await trellis.pausedFor('disruption');
  if (disrupted.length === 0) return [];
  const refused: Record<string, string> = {};
  const resumed: string[] = [];
  for (const target of disrupted) {
    try {
      await trellis.apply(`RESUME TRANSFORM ${quoteName(target)}`);
      resumed.push(target);
    } catch (error) {
      refused[target] = error instanceof Error ? error.message : String(error);
    }
  }
  const token = await trellis.watermarkToken();
  for (const target of resumed) {
    for (;;) {
      const status = await trellis.status(target);
      if (status.status === 'live') break;
      if (status.status === 'paused') {
        refused[target] = `paused again: ${status.captureFailure?.error ?? status.pauseReason}`;
        break;
      }
      if (Date.now() > deadline) {
        throw new Error(`${target} did not become live within ${options.timeoutMs ?? 30_000} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    if (refused[target]) continue;
    await trellis.awaitConverged(target, token, { timeoutMs: Math.max(1, deadline - Date.now()) });
  }
  const ok = resumed.filter((t) => !refused[t]);
  if (Object.keys(refused).length > 0) throw new ResumeRefused(refused, ok);
  return ok;
}

/** A target name as a statement writes it: quoted, so any name is taken as it is. */
function quoteName(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}
