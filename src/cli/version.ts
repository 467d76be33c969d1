import { readFileSync } from 'node:fs';

/** This package's version, from its package.json (two levels up from src/cli and dist/cli). */
export function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
    version: string;
  };
  return pkg.version;
}
