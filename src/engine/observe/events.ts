import type { CaptureFailure, Lifecycle } from '../catalog/status-types.js';
import { TrellisError } from '../errors.js';

/**
 * A transform's lifecycle changed (status, pause reason, or paused columns), or it was
 * defined or dropped.
 */
export interface StatusEvent {
  target: string;
  /** As status() reports it now; `'dropped'` once the transform is gone. */
  status: Lifecycle | 'dropped';
  /** What it was before; null for a transform just defined. */
  previous: Lifecycle | null;
  /** Why it is paused (operator, build_failure, capture_failure, disruption, quarantine…). */
  pauseReason: string | null;
  /** Its paused columns, each `"target.column"`. */
  pausedColumns: string[];
}

/** The number of keys held at a quarantine address changed (up when keys are held, down when released). */
export interface HeldEvent {
  /** `"transform"` or `"transform.column"`. */
  address: string;
  target: string;
  heldKeys: number;
  previous: number;
}

/** A transform stopped because capture of a source (or its target) stopped being right. */
export interface CaptureFailureEvent {
  target: string;
  captureFailure: CaptureFailure;
}

/** The handle's events (`trellis.on(name, listener)`), by name. */
export interface TrellisEventMap {
  status: StatusEvent;
  held: HeldEvent;
  captureFailure: CaptureFailureEvent;
}

export type TrellisEventName = keyof TrellisEventMap;

/** A listener may be async: its promise is not awaited, and a rejection is only logged. */
export type TrellisListener<K extends TrellisEventName> = (
  event: TrellisEventMap[K],
) => void | Promise<void>;

export const TRELLIS_EVENT_NAMES: readonly TrellisEventName[] = [
  'status',
  'held',
  'captureFailure',
];

/**
 * A small typed emitter that cannot hurt its emitter: listeners run later (setImmediate),
 * never inside the engine's own work; one that throws or rejects is reported through
 * `onListenerError` and the others still run. (Node's EventEmitter would run them inline
 * and rethrow.)
 */
export class TrellisEvents {
  private readonly listeners = new Map<TrellisEventName, Set<TrellisListener<never>>>();

  constructor(
    private readonly onListenerError: (event: TrellisEventName, error: unknown) => void,
    /** Called when the number of listeners changes (the handle watches the catalog while there are some). */
    private readonly onListenersChanged: (count: number) => void = () => undefined,
  ) {}

  on<K extends TrellisEventName>(name: K, listener: TrellisListener<K>): void {
    assertEvent(name, listener);
    let set = this.listeners.get(name);
    if (!set) {
      set = new Set();
      this.listeners.set(name, set);
    }
    set.add(listener as TrellisListener<never>);
    this.onListenersChanged(this.count());
  }

  off<K extends TrellisEventName>(name: K, listener: TrellisListener<K>): void {
    this.listeners.get(name)?.delete(listener as TrellisListener<never>);
    this.onListenersChanged(this.count());
  }

  removeAll(): void {
    this.listeners.clear();
    this.onListenersChanged(0);
  }

  count(): number {
    let n = 0;
    for (const set of this.listeners.values()) n += set.size;
    return n;
  }

  emit<K extends TrellisEventName>(name: K, event: TrellisEventMap[K]): void {
    const set = this.listeners.get(name);
    if (!set || set.size === 0) return;
    const listeners = [...set] as Array<TrellisListener<K>>;
    setImmediate(() => {
      for (const listener of listeners) {
        try {
          const returned = listener(event);
          if (returned && typeof (returned as Promise<void>).then === 'function') {
            (returned as Promise<void>).then(undefined, (error: unknown) =>
              this.onListenerError(name, error),
            );
          }
        } catch (error) {
          this.onListenerError(name, error);
        }
      }
    });
  }
}

function assertEvent(name: unknown, listener: unknown): void {
  if (!TRELLIS_EVENT_NAMES.includes(name as TrellisEventName)) {
    throw new TrellisError(
      'validation',
      `unknown Trellis event ${String(name)}: expected one of ${TRELLIS_EVENT_NAMES.join(', ')}`,
    );
  }
  if (typeof listener !== 'function') {
    throw new TrellisError('validation', 'an event listener must be a function');
  }
}
