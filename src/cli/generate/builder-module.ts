/**
 * The statements of the targets an app's module exports (`transform()` from
 * trellis-pg/drizzle), for `trellis generate transform --from <module>`: drizzle-kit's own
 * rule (top-level exports count) applied to Trellis targets, chains ordered so a target
 * comes after the targets it reads.
 */
import { resolve } from 'node:path';
import { definitionOn, type TransformDefinition } from '../../drizzle/target-key.js';
import { TrellisError } from '../../engine/errors.js';
import { importModule } from './drizzle-config.js';

/** The named targets' definitions (every exported target when `names` is empty), in order. */
export async function targetsFromModule(
  cwd: string,
  file: string,
  names: readonly string[],
): Promise<TransformDefinition[]> {
  const path = resolve(cwd, file);
  const exports = (await importModule(path)) as Record<string, unknown>;
  const found = new Map<string, TransformDefinition>();
  for (const value of Object.values(exports)) {
    const definition = definitionOn(value);
    if (definition) found.set(definition.target, definition);
  }
  if (found.size === 0) {
    throw new TrellisError(
      'validation',
      `${file} exports no Trellis target (made with transform())`,
    );
  }
  const wanted = names.length > 0 ? names : [...found.keys()].sort();
  for (const name of wanted) {
    if (!found.has(name)) {
      throw new TrellisError(
        'not_found',
        `${file} exports no target named ${name} (it exports ${[...found.keys()].sort().join(', ')})`,
      );
    }
  }
  // A chain's upstream target first, when both are being written.
  const ordered: TransformDefinition[] = [];
  const visit = (name: string, path: string[]) => {
    if (ordered.some((d) => d.target === name) || !wanted.includes(name)) return;
    if (path.includes(name)) {
      throw new TrellisError(
        'validation',
        `targets read each other: ${[...path, name].join(' → ')}`,
      );
    }
    const definition = found.get(name) as TransformDefinition;
    for (const upstream of definition.reads) visit(upstream, [...path, name]);
    ordered.push(definition);
  };
  for (const name of wanted) visit(name, []);
  return ordered;
}
