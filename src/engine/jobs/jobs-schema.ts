import { createHash } from 'node:crypto';

/**
 * The schema an instance's background jobs (pg-boss) live in, derived from its catalog
 * schema so two instances in one database never share jobs (ADR 0014): `<schema>_jobs`
 * for a plain lower-case catalog schema name, else `trellis_jobs_<hash>`. pg-boss writes
 * its schema name into SQL unquoted and refuses anything but `[A-Za-z0-9_]` up to 50
 * characters, so every derived name is a plain identifier.
 */
export function jobsSchemaFor(catalogSchema: string): string {
  const plain = `${catalogSchema}_jobs`;
  if (/^[a-z_][a-z0-9_]*$/.test(catalogSchema) && plain.length <= 50) return plain;
  const hash = createHash('sha256').update(catalogSchema, 'utf8').digest('hex').slice(0, 16);
  return `trellis_jobs_${hash}`;
}
