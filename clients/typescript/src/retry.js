// When to try again, and how long to wait first.
//
// A failure that says nothing about the turn, only that a replica (or the
// proxy in front of it) cannot answer right now, is worth another try,
// elsewhere: no answer at all, a 503 (draining, a store unavailable), a
// proxy's 502 or 504. Tries that fail in a row wait longer each time, each
// wait jittered so that clients that failed together do not retry together.

import {
  BadGatewayError,
  ConnectionFailedError,
  GatewayTimeoutError,
  ServiceUnavailableError,
} from "./errors.js";

/** The longest a 503's Retry-After makes the client wait: other replicas may answer sooner. */
const LONGEST_ASKED_WAIT_MS = 5_000;

/**
 * Why `error` is worth another try: `unreachable` (no answer) or
 * `unavailable` (the replica or proxy cannot serve now); null when it is not.
 * @param {unknown} error
 * @returns {"unreachable" | "unavailable" | null}
 */
export function passing(error) {
  if (error instanceof ConnectionFailedError) return "unreachable";
  if (
    error instanceof ServiceUnavailableError ||
    error instanceof BadGatewayError ||
    error instanceof GatewayTimeoutError
  ) {
    return "unavailable";
  }
  return null;
}

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
export function delayMs(error, failures, delays, random) {
  const step = delays[Math.min(failures, delays.length - 1)];
  let ms = step / 2 + (random() * step) / 2;
  if (error instanceof ServiceUnavailableError && error.retryAfter !== null) {
    ms = Math.max(ms, Math.min(error.retryAfter * 1000, LONGEST_ASKED_WAIT_MS));
  }
  return ms;
}

/**
 * Wait before the next try (`delayMs`); at once when `signal` aborts.
 * @param {unknown} error  the failure that led here, if any
 * @param {number} failures  tries that failed in a row before this one
 * @param {number[]} delays
 * @param {AbortSignal} signal
 * @param {() => number} random  a source of numbers in [0, 1)
 * @returns {Promise<void>}
 */
export function pause(error, failures, delays, signal, random) {
  const ms = delayMs(error, failures, delays, random);
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
