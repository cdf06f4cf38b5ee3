// The real replicas a test talks to, as tests/test_typescript_client.py
// started them, and what a test does to them.
//
// TETHER_TEST_REPLICAS: JSON [{name, url, pid}], every replica on one store.
// TETHER_TEST_TOOL_LOG: the file the writer agent's calculator appends to,
// once per execution. Without them (`npm test` alone) these tests skip.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import { TetherClient } from "tether-client";

/** @typedef {{name: string, url: string, pid: number}} Replica */

export const TENANT = "t";
export const PROMPT = "Tell me about rivers and the towns along them.";

/** @type {Replica[]} */
export const REPLICAS = JSON.parse(process.env.TETHER_TEST_REPLICAS ?? "[]");

/** The `skip` option of a suite that needs replicas: false, or why it skips. */
export const NEEDS_REPLICAS =
  REPLICAS.length > 0 ? false : "no replicas: run through tests/test_typescript_client.py";

/** A user of one's own, so that no two tests see each other's conversations. */
export function newUser() {
  return `user-${randomUUID().slice(0, 8)}`;
}

/**
 * A client of `urls` for `user`, retrying faster than the default (the
 * replicas are on this machine).
 * @param {string | string[]} urls
 * @param {Partial<import("tether-client").ClientOptions>} [options]
 */
export function clientOf(urls, options = {}) {
  return new TetherClient({
    urls,
    tenant: TENANT,
    user: newUser(),
    retryDelaysMs: [50, 100, 200, 400],
    ...options,
  });
}

/**
 * The answer of a crash-free run of `prompt`, read as one JSON body (not
 * through the client under test). The offline model is deterministic.
 * @param {string} url
 * @param {string} agent
 * @param {string} [prompt]
 */
export async function reference(url, agent, prompt = PROMPT) {
  const response = await fetch(`${url}/chat/response?tenant=${TENANT}`, {
    method: "POST",
    headers: { "content-type": "application/json", "requester-uuid": "reference" },
    body: JSON.stringify({
      agent_identifier: agent,
      stateful: true,
      session_id: `reference-${randomUUID()}`,
      conversation: [{ sender: "user", content: prompt }],
    }),
  });
  if (response.status !== 201)
    throw new Error(`reference: ${response.status} ${await response.text()}`);
  return String((await response.json()).content);
}

/**
 * SIGKILL a replica (no drain, no goodbye) and wait until its port refuses
 * connections, so that what follows meets a dead replica.
 * @param {Replica} replica
 */
export async function kill(replica) {
  process.kill(replica.pid, "SIGKILL");
  await until(
    async () => {
      try {
        await fetch(`${replica.url}/probes/alive`, { signal: AbortSignal.timeout(1000) });
        return false;
      } catch {
        return true;
      }
    },
    10_000,
    `${replica.name} to be gone`,
  );
}

/** Executions of the writer's calculator so far, on every replica. */
export function toolRuns() {
  const log = process.env.TETHER_TEST_TOOL_LOG;
  if (!log) throw new Error("TETHER_TEST_TOOL_LOG is not set");
  try {
    return readFileSync(log, "utf8").split("\n").filter(Boolean).length;
  } catch {
    return 0;
  }
}

/**
 * Wait until `predicate` holds, polling, at most `ms`.
 * @param {() => boolean | Promise<boolean>} predicate
 * @param {number} ms
 * @param {string} what
 */
export async function until(predicate, ms, what) {
  const deadline = Date.now() + ms;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/**
 * Read a turn's events to the end; `during(event, seen)` runs after each one
 * (a fault injected at a chosen point).
 * @param {import("tether-client").Turn} turn
 * @param {(event: import("tether-client").TurnEvent, seen: import("tether-client").TurnEvent[]) => Promise<void> | void} [during]
 */
export async function readAll(turn, during) {
  /** @type {import("tether-client").TurnEvent[]} */
  const seen = [];
  for await (const event of turn.events()) {
    seen.push(event);
    await during?.(event, seen);
  }
  return seen;
}

/**
 * The message events among `events`.
 * @param {import("tether-client").TurnEvent[]} events
 */
export function messagesOf(events) {
  return events.flatMap((event) => (event.type === "message" ? [event] : []));
}

/**
 * Each index is above the one before: nothing handed on twice.
 * @param {{index: number | null}[]} messages
 */
export function strictlyIncreasing(messages) {
  const indexes = messages.map((message) => message.index);
  return indexes.every(
    (index, i) => index !== null && (i === 0 || index > /** @type {number} */ (indexes[i - 1])),
  );
}
