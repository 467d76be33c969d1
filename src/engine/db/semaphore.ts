interface Waiter {
  settle: (granted: boolean) => void;
  timer: NodeJS.Timeout;
}

/** A counting semaphore whose waiters give up after a deadline. */
export class Semaphore {
  private available: number;
  private readonly waiters: Waiter[] = [];

  constructor(permits: number) {
    this.available = permits;
  }

  /** Resolves true with a permit, or false if none was free within `timeoutMs`. */
  acquire(timeoutMs: number): Promise<boolean> {
    if (this.available > 0) {
      this.available -= 1;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const waiter: Waiter = {
        settle: resolve,
        timer: setTimeout(() => {
          this.waiters.splice(this.waiters.indexOf(waiter), 1);
          resolve(false);
        }, timeoutMs),
      };
      this.waiters.push(waiter);
    });
  }

  /** Permits free now. */
  get free(): number {
    return this.available;
  }

  /** Acquirers waiting for a permit now. */
  get waiting(): number {
    return this.waiters.length;
  }

  release(): void {
    const next = this.waiters.shift();
    if (next) {
      clearTimeout(next.timer);
      next.settle(true);
    } else {
      this.available += 1;
    }
  }

  /** Turns every waiter away at once (used by shutdown). */
  refuseWaiters(): void {
    for (const waiter of this.waiters.splice(0)) {
      clearTimeout(waiter.timer);
      waiter.settle(false);
    }
  }
}
