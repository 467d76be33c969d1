import type { Status } from '../../engine/catalog/status-types.js';
import { isTrellisError } from '../../engine/errors.js';
import type { Trellis } from '../../engine/trellis.js';

/** The status of `target`, or of every transform (by target name) when it is not given. */
export async function readStatuses(trellis: Trellis, target?: string): Promise<Status[]> {
  if (target !== undefined) return [await trellis.status(target)];
  const definitions = await trellis.definitions();
  const statuses = await Promise.all(
    definitions.map((d) =>
      trellis.status(d.target).catch((error: unknown) => {
        // Dropped since definitions() listed it.
        if (isTrellisError(error) && error.code === 'not_found') return undefined;
        throw error;
      }),
    ),
  );
  return statuses.filter((s): s is Status => s !== undefined);
}
