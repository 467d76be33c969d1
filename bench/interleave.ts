import { loadavg } from 'node:os';
import { spread } from './support.js';

/** A baseline whose own samples differ by more than this makes its ratios unreliable. */
export const BASELINE_MOVED = 0.15;

export interface Interleaved<K extends string> {
  /** Every sample, by variant, in the order taken. */
  samples: Record<K, number[]>;
  /** The 1-minute load average after each sample, in the order taken. */
  load: number[];
  /** The baseline's samples differed by more than BASELINE_MOVED. */
  baselineMoved: boolean;
}

export interface Measured<K extends string> extends Interleaved<K> {
  /** The first attempt, when its baseline moved and the whole set was measured again. */
  firstAttempt?: Interleaved<K>;
  /** Still moved when measured again: the ratios are not results. */
  flagged: boolean;
}

/**
 * Measures every variant `passes` times, in order then in reverse (ABC CBA ABC …), so that
 * drift and order effects fall on every variant alike. When the baseline's samples moved
 * more than BASELINE_MOVED, the whole set is measured once more (every variant's ratio is
 * to that baseline) and that attempt's samples are the ones reported; if the baseline
 * moved again, the set is flagged rather than reported as a result.
 */
export async function interleaved<K extends string>(
  variants: readonly K[],
  /** null: no baseline to watch (the figures are not ratios). */
  baseline: K | null,
  passes: number,
  measure: (variant: K, pass: number) => Promise<number>,
  log: (message: string) => void,
): Promise<Measured<K>> {
  const attempt = async (): Promise<Interleaved<K>> => {
    const samples = Object.fromEntries(variants.map((v) => [v, [] as number[]])) as Record<
      K,
      number[]
    >;
    const load: number[] = [];
    for (let pass = 0; pass < passes; pass += 1) {
      for (const variant of pass % 2 ? [...variants].reverse() : variants) {
        samples[variant].push(await measure(variant, pass));
        load.push(loadavg()[0]!);
      }
    }
    const moved = baseline !== null && spread(samples[baseline]) > BASELINE_MOVED;
    return { samples, load, baselineMoved: moved };
  };
  const first = await attempt();
  if (baseline === null || !first.baselineMoved) return { ...first, flagged: false };
  log(
    `baseline moved ${(spread(first.samples[baseline]) * 100).toFixed(0)}% (${first.samples[baseline].map((x) => x.toFixed(0)).join(', ')}): measuring again`,
  );
  const second = await attempt();
  return { ...second, firstAttempt: first, flagged: second.baselineMoved };
}
