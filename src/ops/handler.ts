import type { IncomingMessage, ServerResponse } from 'node:http';
import { isTrellisError, type TrellisErrorCode } from '../engine/errors.js';
import type { Trellis } from '../engine/trellis.js';
import {
  isOpsAction,
  OPS_ACTIONS,
  type OpsActionName,
  type OpsAuthorize,
  parseActionRequest,
  runAction,
} from './actions.js';
import { PAGE_CSP, renderPage } from './page.js';
import { readOpsSnapshot } from './snapshot.js';

/**
 * The operations page as a node:http request handler: `GET …/` the page,
 * `GET …/snapshot.json` its data, `GET …/history.json` the last hour of each transform (its
 * charts), `POST …/actions/<name>` an action. It works wherever it
 * is mounted, because it routes by the end of the path and the page finds its data
 * relative to its own address.
 */

export interface OpsHandlerOptions {
  /** The handle whose instance the page shows (any handle: it needs no worker). */
  trellis: Trellis;
  /**
   * Allows actions (pause, resume, release a key, start a self-check) per request. Without
   * it the page is read-only and every action is refused with 403.
   */
  authorize?: OpsAuthorize | undefined;
  /** @defaultValue `'Trellis operations'` */
  title?: string;
  /** How often the page reads the snapshot again. @defaultValue `1000` */
  pollMs?: number;
}

/** A node:http handler; `next` (Express/Connect) is called with errors it could not answer. */
export type OpsRequestHandler = (
  request: IncomingMessage,
  response: ServerResponse,
  next?: (error?: unknown) => void,
) => void;

/** The biggest action body read: actions carry a few names and a key. */
const MAX_BODY_BYTES = 64 * 1024;

const HTTP_STATUS: Partial<Record<TrellisErrorCode, number>> = {
  parse: 400,
  validation: 400,
  not_found: 404,
  conflict: 409,
  timeout: 504,
  not_migrated: 503,
  connection: 503,
  shutdown: 503,
};

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const COMMON_HEADERS = {
  'cache-control': 'no-store',
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
};

function sendJson(response: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  response.writeHead(status, {
    ...COMMON_HEADERS,
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(text),
  });
  response.end(text);
}

function sendError(response: ServerResponse, error: unknown): void {
  if (error instanceof HttpError) {
    sendJson(response, error.status, { error: { code: error.code, message: error.message } });
  } else if (isTrellisError(error)) {
    const status = HTTP_STATUS[error.code] ?? 500;
    sendJson(response, status, { error: { code: error.code, message: error.message } });
  } else {
    sendJson(response, 500, { error: { code: 'unknown', message: 'internal error' } });
  }
}

/**
 * The action's JSON body. A framework that parsed it already (Express's `express.json()`,
 * or Fastify's body passed along as `request.body`) consumed the stream: take theirs.
 */
async function readJsonBody(request: IncomingMessage & { body?: unknown }): Promise<unknown> {
  if (request.body !== undefined && !request.readable) {
    const body = request.body;
    if (typeof body === 'string' || Buffer.isBuffer(body)) return parseJson(body.toString());
    return body;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of request) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new HttpError(413, 'validation', 'the body is too large');
    chunks.push(chunk as Buffer);
  }
  return parseJson(Buffer.concat(chunks).toString('utf8'));
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text || '{}');
  } catch {
    throw new HttpError(400, 'validation', 'the body is not JSON');
  }
}

/**
 * Refuses what a browser would send on another site's behalf: actions need a header that
 * only a same-origin script can add (a cross-origin one needs a CORS preflight, which this
 * handler never grants), a JSON body, and no cross-site fetch metadata.
 */
function assertSameOriginAction(request: IncomingMessage): void {
  const site = request.headers['sec-fetch-site'];
  if (site === 'cross-site' || site === 'same-site') {
    throw new HttpError(403, 'forbidden', 'actions are refused from another site');
  }
  if (request.headers['x-trellis-ops'] !== '1') {
    throw new HttpError(403, 'forbidden', 'actions need the x-trellis-ops: 1 header');
  }
  if (!String(request.headers['content-type'] ?? '').startsWith('application/json')) {
    throw new HttpError(415, 'validation', 'actions take a JSON body');
  }
}

/** The actions `request` may take. */
async function allowedActions(
  authorize: OpsAuthorize | undefined,
  request: IncomingMessage,
): Promise<OpsActionName[]> {
  if (!authorize) return [];
  const allowed = await Promise.all(OPS_ACTIONS.map((a) => authorize(request, a)));
  return OPS_ACTIONS.filter((_, i) => allowed[i] === true);
}

/** Creates the handler. */
export function opsHandler(options: OpsHandlerOptions): OpsRequestHandler {
  const { trellis, authorize } = options;
  const page = renderPage(options.title ?? 'Trellis operations', options.pollMs ?? 1000);

  async function handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const path = new URL(request.url ?? '/', 'http://localhost').pathname;
    const method = request.method ?? 'GET';
    const action = /\/actions\/([A-Za-z]+)$/.exec(path)?.[1];
    if (action !== undefined) {
      if (method !== 'POST') throw new HttpError(405, 'method', 'actions are POSTed');
      if (!isOpsAction(action)) throw new HttpError(404, 'not_found', `no action ${action}`);
      assertSameOriginAction(request);
      if (!authorize || (await authorize(request, action)) !== true) {
        throw new HttpError(
          403,
          'forbidden',
          authorize ? `${action} is not allowed` : 'the page is read-only',
        );
      }
      const body = parseActionRequest(action, await readJsonBody(request));
      sendJson(response, 200, { result: await runAction(trellis, action, body) });
      return;
    }
    if (method !== 'GET' && method !== 'HEAD') {
      throw new HttpError(405, 'method', 'the page is read with GET');
    }
    if (path.endsWith('/history.json')) {
      // The last hour of every transform (the charts), read less often than the snapshot.
      sendJson(response, 200, { at: new Date(), transforms: await trellis.history() });
      return;
    }
    if (path.endsWith('/snapshot.json')) {
      const snapshot = await readOpsSnapshot(trellis, await allowedActions(authorize, request));
      sendJson(response, 200, snapshot);
      return;
    }
    response.writeHead(200, {
      ...COMMON_HEADERS,
      'content-type': 'text/html; charset=utf-8',
      'content-security-policy': PAGE_CSP,
      'x-frame-options': 'SAMEORIGIN',
    });
    response.end(method === 'HEAD' ? undefined : page);
  }

  return (request, response, next) => {
    handle(request, response).catch((error: unknown) => {
      if (response.headersSent) {
        response.destroy();
        return;
      }
      if (next && !(error instanceof HttpError) && !isTrellisError(error)) {
        next(error);
        return;
      }
      sendError(response, error);
    });
  };
}
