/**
 * Why `error` is worth another try: `unreachable` (no answer) or
 * `unavailable` (the replica or proxy cannot serve now); null when it is not.
 * @param {unknown} error
 * @returns {"unreachable" | "unavailable" | null}
 */
export function passing(error: unknown): "unreachable" | "unavailable" | null;
/**
 * Wait before the next try: `delays[failures]` (the last one repeats), or as
 * long as a 503 asked; at once when `signal` aborts.
 * @param {unknown} error  the failure that led here, if any
 * @param {number} failures  tries that failed in a row before this one
 * @param {number[]} delays
 * @param {AbortSignal} signal
 * @returns {Promise<void>}
 */
export function pause(error: unknown, failures: number, delays: number[], signal: AbortSignal): Promise<void>;
