/**
 * Why `error` is worth another try: `unreachable` (no answer) or
 * `unavailable` (the replica or proxy cannot serve now); null when it is not.
 * @param {unknown} error
 * @returns {"unreachable" | "unavailable" | null}
 */
export function passing(error: unknown): "unreachable" | "unavailable" | null;
/**
 * How long to wait before the next try: `delays[failures]` (the last one
 * repeats), jittered, or as long as a 503 asked. A replica that dies drops
 * every client streaming from it at once; without jitter they would all try
 * again at the same moments, in lockstep, a burst on the survivors each
 * time. Each pause is drawn between half its delay and the delay ("equal
 * jitter"): spread out, yet never much shorter than asked.
 * @param {unknown} error  the failure that led here, if any
 * @param {number} failures  tries that failed in a row before this one
 * @param {number[]} delays
 * @param {() => number} random  a source of numbers in [0, 1)
 * @returns {number} milliseconds
 */
export function delayMs(error: unknown, failures: number, delays: number[], random: () => number): number;
/**
 * Wait before the next try (`delayMs`); at once when `signal` aborts.
 * @param {unknown} error  the failure that led here, if any
 * @param {number} failures  tries that failed in a row before this one
 * @param {number[]} delays
 * @param {AbortSignal} signal
 * @param {() => number} random  a source of numbers in [0, 1)
 * @returns {Promise<void>}
 */
export function pause(error: unknown, failures: number, delays: number[], signal: AbortSignal, random: () => number): Promise<void>;
