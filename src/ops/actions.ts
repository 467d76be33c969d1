import type { IncomingMessage } from 'node:http';
import { TrellisError } from '../engine/errors.js';
import { quoteIdent } from '../engine/identifiers.js';
import type { SelfCheckMode } from '../engine/selfcheck/types.js';
import type { Trellis } from '../engine/trellis.js';

/**
 * What an operator can do from the page. Each runs the same handle method an app's code
 * would (`apply('PAUSE TRANSFORM …')`, `releaseKey`, `selfCheck`), so the page can do
 * nothing that code cannot, and every rule of those methods holds.
 */

export const OPS_ACTIONS = ['pause', 'resume', 'release', 'selfCheck'] as const;
export type OpsActionName = (typeof OPS_ACTIONS)[number];

/**
 * Decides whether `request` may take `action`. The page shows an action's buttons only
 * where this allows it, and asks again when the action is posted. Without it the page is
 * read-only.
 */
export type OpsAuthorize = (
  request: IncomingMessage,
  action: OpsActionName,
) => boolean | Promise<boolean>;

/** The body an action is posted with. */
export interface OpsActionRequest {
  /** The transform. */
  target: string;
  /** pause, resume: one column of it (the whole transform when absent). */
  column?: string;
  /** release: the address holding the key (`"target"` or `"target.column"`). */
  address?: string;
  /** release: the source table, schema-qualified, as the held key lists it. */
  srcTable?: string;
  /** release: the key, rendered as the held key lists it. */
  key?: string;
  /** selfCheck: `'full'` (default) or `'sample'`. */
  mode?: SelfCheckMode;
}

export function isOpsAction(name: string): name is OpsActionName {
  return (OPS_ACTIONS as readonly string[]).includes(name);
}

function text(body: Record<string, unknown>, field: string, required: boolean): string | undefined {
  const value = body[field];
  if (value === undefined || value === null) {
    if (required) throw new TrellisError('validation', `the action needs "${field}"`);
    return undefined;
  }
  if (typeof value !== 'string' || value === '') {
    throw new TrellisError('validation', `"${field}" must be a non-empty string`);
  }
  return value;
}

/** Checks a posted body's shape: a `validation` error names the field that is wrong. */
export function parseActionRequest(action: OpsActionName, body: unknown): OpsActionRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new TrellisError('validation', 'the action body must be a JSON object');
  }
  const b = body as Record<string, unknown>;
  const request: OpsActionRequest = { target: text(b, 'target', true)! };
  const column = text(b, 'column', false);
  if (column !== undefined) request.column = column;
  if (action === 'release') {
    request.address = text(b, 'address', true)!;
    request.srcTable = text(b, 'srcTable', true)!;
    request.key = text(b, 'key', true)!;
  }
  if (action === 'selfCheck') {
    const mode = text(b, 'mode', false) ?? 'full';
    if (mode !== 'full' && mode !== 'sample') {
      throw new TrellisError('validation', `"mode" must be "full" or "sample", not ${mode}`);
    }
    request.mode = mode;
  }
  return request;
}

/** The statement's address, quoted, so that no name can be read as more grammar. */
function addressSql(request: OpsActionRequest): string {
  const target = quoteIdent(request.target);
  return request.column === undefined ? target : `${target}.${quoteIdent(request.column)}`;
}

/** Runs the action through the handle; resolves to what the handle returned. */
export function runAction(
  trellis: Trellis,
  action: OpsActionName,
  request: OpsActionRequest,
): Promise<unknown> {
  switch (action) {
    case 'pause':
      return trellis.apply(`PAUSE TRANSFORM ${addressSql(request)}`);
    case 'resume':
      return trellis.apply(`RESUME TRANSFORM ${addressSql(request)}`);
    case 'release':
      return trellis.releaseKey(request.address!, request.srcTable!, request.key!);
    case 'selfCheck':
      return trellis.selfCheck(request.target, request.mode ?? 'full');
  }
}
