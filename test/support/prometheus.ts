import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { renderPrometheus } from '../../src/engine/index.js';

/**
 * Scrapes `renderPrometheus()` and reads it back with a Prometheus text-format parser (not
 * a regex), as Prometheus would: families by name, samples by labels.
 */

interface ParsedSample {
  value?: string;
  labels?: Record<string, string>;
  buckets?: Record<string, string>;
}

interface ParsedFamily {
  name: string;
  help: string;
  type: string;
  metrics: ParsedSample[];
}

export interface Sample {
  labels: Record<string, string>;
  value: number;
}

export class Scrape {
  constructor(
    readonly text: string,
    /** The families as parsed. */
    readonly families: Map<string, ParsedFamily>,
    /** Each histogram's `_count` series, by `<name>_count`. */
    private readonly histogramCounts: Map<string, ParsedFamily>,
  ) {}

  /** Every sample of a family whose labels include `labels`. */
  samples(name: string, labels: Record<string, string> = {}): Sample[] {
    const family = this.families.get(name) ?? this.histogramCounts.get(name);
    if (!family) return [];
    return family.metrics
      .filter((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v))
      .map((m) => ({ labels: m.labels ?? {}, value: Number(m.value ?? Number.NaN) }));
  }

  /** The one sample of a family matching `labels` (undefined when none; throws when several). */
  value(name: string, labels: Record<string, string> = {}): number | undefined {
    const found = this.samples(name, labels);
    if (found.length > 1) {
      throw new Error(`${name} ${JSON.stringify(labels)} matches ${found.length} samples`);
    }
    return found[0]?.value;
  }

  /** The sum of a family's samples matching `labels` (0 when none). */
  sum(name: string, labels: Record<string, string> = {}): number {
    return this.samples(name, labels).reduce((a, s) => a + s.value, 0);
  }

  /** Histograms: observations counted across series matching `labels` (their `_count`). */
  count(name: string, labels: Record<string, string> = {}): number {
    return this.samples(`${name}_count`, labels).reduce((a, s) => a + s.value, 0);
  }

  /** Every value the label takes across all families. */
  labelValues(label: string): Set<string> {
    const values = new Set<string>();
    for (const family of [...this.families.values(), ...this.histogramCounts.values()]) {
      for (const m of family.metrics) {
        const v = m.labels?.[label];
        if (v !== undefined) values.add(v);
      }
    }
    return values;
  }
}

export async function scrape(): Promise<Scrape> {
  return parseScrape(await renderPrometheus());
}

/**
 * Scrapes until `check` holds (fails after `timeoutMs`, with the last scrape's text). The
 * catalog's gauges are read from a snapshot up to a second old (SNAPSHOT_MAX_AGE_MS): a
 * state just reached shows in a later scrape.
 */
export async function scrapeUntil(
  check: (s: Scrape) => boolean,
  what: string,
  timeoutMs = 20_000,
): Promise<Scrape> {
  const deadline = Date.now() + timeoutMs;
  let last: Scrape | undefined;
  while (Date.now() < deadline) {
    last = await scrape();
    if (check(last)) return last;
    await new Promise((resolve) => setTimeout(resolve, 100)); // the poll interval of this wait
  }
  throw new Error(`timed out waiting for ${what}; last scrape:\n${last?.text}`);
}

/** A scrape's text (from `renderPrometheus()` or a `/metrics` endpoint), parsed. */
export function parseScrape(text: string): Scrape {
  const parsed = parsePrometheusTextFormat(text) as ParsedFamily[];
  const families = new Map(parsed.map((f) => [f.name, f]));
  const counts = new Map<string, ParsedFamily>();
  // The parser folds a labelled histogram's _count and _sum away (it keeps only the
  // buckets): read each histogram's _count series again, as untyped samples of their own.
  for (const family of parsed) {
    if (family.type !== 'HISTOGRAM') continue;
    const name = `${family.name}_count`;
    const lines = text
      .split('\n')
      .filter((line) => line.startsWith(`${name}{`) || line.startsWith(`${name} `));
    // (The parser reads a text up to its last newline, as the exposition format ends lines.)
    const [series] = parsePrometheusTextFormat(`${lines.join('\n')}\n`) as ParsedFamily[];
    counts.set(name, series ?? { name, help: '', type: 'UNTYPED', metrics: [] });
  }
  return new Scrape(text, families, counts);
}
