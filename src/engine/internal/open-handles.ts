/**
 * Every handle that has connected and not finished shutting down. Test support reads it to
 * fail a test that leaks a handle (and with it pools, workers and timers).
 */
const open = new Set<{ readonly instance: string }>();

export function trackHandle(handle: { readonly instance: string }): void {
  open.add(handle);
}

export function untrackHandle(handle: { readonly instance: string }): void {
  open.delete(handle);
}

/** The instances (`database/schema`) of handles still open in this process. */
export function openHandleInstances(): string[] {
  return [...open].map((h) => h.instance);
}
