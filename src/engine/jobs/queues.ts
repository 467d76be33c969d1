/**
 * The background jobs an instance runs on pg-boss, one queue each. The install SQL creates
 * every queue listed here (pg-boss 10 refuses to send to a queue that does not exist), and
 * a handle that drains works each of them. A later job is one more entry (ADR 0014).
 */
export interface JobQueue {
  /** The queue's name in the instance's jobs schema. */
  name: string;
  /**
   * pg-boss options every job of the queue is sent with. They travel with the job, so the
   * queue's own row needs no upgrade when they change.
   */
  sendOptions: {
    retryLimit: number;
    retryDelay: number;
    retryBackoff: boolean;
    expireInSeconds: number;
  };
}

/**
 * Self-checks (ADR 0015). A worker that dies mid-check leaves its job active; the next
 * working handle sees no session holding the job's lock and hands it back to pg-boss to
 * retry (selfcheck/claim-lock.ts). A check that runs longer than its expiry stops itself
 * before it expires (see selfcheck/handler.ts).
 */
export const SELF_CHECK_QUEUE = {
  name: 'self_check',
  sendOptions: { retryLimit: 5, retryDelay: 2, retryBackoff: true, expireInSeconds: 3600 },
} as const satisfies JobQueue;

export const JOB_QUEUES: readonly JobQueue[] = [SELF_CHECK_QUEUE];
