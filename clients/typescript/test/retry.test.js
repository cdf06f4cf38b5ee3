// The client's retries back off with jitter, so clients that failed together
// (a replica died under all of them) do not come back together. The random
// source is injected: each pause is drawn between half its delay and the
// delay, and a 503's Retry-After is a floor.

import assert from "node:assert/strict";
import { test } from "node:test";

import { TetherClient } from "../src/index.js";
import { ServiceUnavailableError } from "../src/errors.js";
import { delayMs } from "../src/retry.js";

const DELAYS = [100, 250, 500, 1000, 2000];

/**
 * A seeded source of numbers in [0, 1) (mulberry32), so a failure replays.
 * @param {number} seed
 */
function seeded(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test("each pause lies between half its delay and the delay", () => {
  const failures = [0, 1, 2, 3, 4, 5];
  const lowest = failures.map((n) => delayMs(null, n, DELAYS, () => 0));
  assert.deepEqual(lowest, [50, 125, 250, 500, 1000, 1000]);
  const highest = failures.map((n) => delayMs(null, n, DELAYS, () => 1));
  assert.deepEqual(highest, [100, 250, 500, 1000, 2000, 2000]);
});

test("two clients that fail together pause differently", () => {
  const first = seeded(1);
  const second = seeded(2);
  for (let n = 0; n < DELAYS.length; n++) {
    const a = delayMs(null, n, DELAYS, first);
    const b = delayMs(null, n, DELAYS, second);
    for (const ms of [a, b]) assert.ok(DELAYS[n] / 2 <= ms && ms <= DELAYS[n], `${ms}`);
    assert.notEqual(a, b);
  }
});

test("a 503's Retry-After is a floor, capped", () => {
  const asked = new ServiceUnavailableError(503, "DRAINING", "draining", { retryAfter: 3 });
  assert.equal(
    delayMs(asked, 0, DELAYS, () => 0),
    3000,
  );
  const long = new ServiceUnavailableError(503, "DRAINING", "draining", { retryAfter: 600 });
  assert.equal(
    delayMs(long, 0, DELAYS, () => 0),
    5000,
  );
});

test("the client takes its jitter from the source it is given", () => {
  const random = () => 0.5;
  const client = new TetherClient({ urls: ["http://127.0.0.1:1"], tenant: "t", user: "u", random });
  assert.equal(client.random, random);
  assert.equal(
    new TetherClient({ urls: ["http://127.0.0.1:1"], tenant: "t", user: "u" }).random,
    Math.random,
  );
});
