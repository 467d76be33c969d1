import { readFileSync } from 'node:fs';

let version: string | undefined;

/**
 * This package's version, from its package.json (three levels up from src/engine/internal
 * and from dist/engine/internal), read once.
 */
export function packageVersion(): string {
  version ??= (
    JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as {
      version: string;
    }
  ).version;
  return version;
}
