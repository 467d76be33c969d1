import { LABELS, type Variant, type VariantKey } from './alternatives-variants.js';
import type { Measured } from './interleave.js';
import { type Figure, figure, type Target } from './scenario.js';
import { median, spread } from './support.js';

/**
 * A figure of the side-by-side scenario: one variant's median against bare's in the same
 * interleaved set, with every sample, both spreads, and whether the baseline moved.
 * `detail.variant`, `.workload` and `.shape` are what the charts group by.
 */
export function ratioFigure(f: {
  name: string;
  unit: string;
  variant: Variant;
  workload: string;
  shape: string | null;
  measured: Measured<VariantKey>;
  target?: Target;
  extra?: Record<string, unknown>;
}): Figure {
  const key = f.variant.key;
  const m = f.measured;
  const samples = m.samples[key];
  const bare = m.samples.bare;
  // Upkeep noted since the last figure of this variant (catch-up, refresh times).
  const notes = { ...f.variant.notes };
  for (const k of Object.keys(f.variant.notes)) delete f.variant.notes[k];
  return figure({
    scenario: 'alternatives',
    figure: `${f.name}: ${LABELS[key]}`,
    value: median(samples),
    unit: f.unit,
    baseline: { label: 'bare', value: median(bare) },
    ...(f.target ? { target: f.target } : {}),
    flagged: m.flagged,
    detail: {
      variant: key,
      label: LABELS[key],
      workload: f.workload,
      shape: f.shape,
      samples,
      spread: spread(samples),
      baselineSamples: bare,
      baselineSpread: spread(bare),
      baselineMoved: m.baselineMoved,
      ...(m.firstAttempt
        ? {
            firstAttempt: {
              samples: m.firstAttempt.samples[key],
              baselineSamples: m.firstAttempt.samples.bare,
            },
          }
        : {}),
      loadAverage: m.load,
      ...notes,
      ...f.extra,
    },
  });
}
