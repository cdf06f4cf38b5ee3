// With automatic takeover off (TETHER_TAKEOVER=false), a dead turn goes on
// only when a client resumes it: this client does, by itself. And when
// another client resumes first, this one's resume is refused (409) and it
// attaches instead: staged, not hoped for, by letting the other client's
// resume through just before this one's.
//
// The replicas: the first is killed by the first test, the second by the
// second; the third survives both.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  NEEDS_REPLICAS,
  PROMPT,
  REPLICAS,
  clientOf,
  kill,
  messagesOf,
  readAll,
  reference,
  strictlyIncreasing,
  toolRuns,
} from "./support/replicas.js";

/**
 * Kill `victim` once the turn has streamed 40 messages; the events, and
 * where the kill happened in them.
 * @param {import("tether-client").Turn} turn
 * @param {import("./support/replicas.js").Replica} victim
 */
async function killMidAnswer(turn, victim) {
  let killedAt = -1;
  const events = await readAll(turn, async (event, seen) => {
    if (killedAt === -1 && event.type === "message" && (event.index ?? 0) >= 40) {
      killedAt = seen.length;
      await kill(victim);
    }
  });
  assert.ok(killedAt > 0, "the replica was killed mid-answer");
  return { events, after: events.slice(killedAt) };
}

/**
 * The whole answer, once, as a crash-free run gives it.
 * @param {import("tether-client").Turn} turn
 * @param {import("tether-client").TurnEvent[]} events
 * @param {string} expected
 */
function assertComplete(turn, events, expected) {
  assert.ok(strictlyIncreasing(messagesOf(events)), "no index handed on twice");
  assert.deepEqual(turn.outcome, { reason: "done", error: null });
  assert.equal(turn.message?.content, expected);
}

describe("no replica takes dead turns over", { skip: NEEDS_REPLICAS }, () => {
  test("the client resumes the dead turn itself, on a survivor", async () => {
    const [victim, , survivor] = REPLICAS;
    const expected = await reference(survivor.url, "writer");
    const toolsBefore = toolRuns();
    const client = clientOf([victim.url, survivor.url]);
    const turn = await client.startTurn({ agent: "writer", content: PROMPT });
    const { events, after } = await killMidAnswer(turn, victim);

    // Attached to a survivor, the stream ends "dead" once the producer's
    // heartbeat is 3 s old; the status says dead; the client resumes.
    const causes = after.flatMap((event) => (event.type === "recovering" ? [event.cause] : []));
    assert.equal(causes[0], "disconnected");
    assert.ok(causes.includes("dead"), `recovering causes: ${causes}`);
    const resumed = after.filter((event) => event.type === "stream" && event.via === "resume");
    assert.deepEqual(resumed, [{ type: "stream", via: "resume", url: survivor.url }]);
    assertComplete(turn, events, expected);
    assert.equal(toolRuns() - toolsBefore, 1, "the completed tool call was not run again");
  });

  test("a resume refused because another client resumed first attaches instead", async () => {
    const [, victim, survivor] = REPLICAS;
    const expected = await reference(survivor.url, "writer");
    /** @type {number[]} */
    const resumeAnswers = [];
    /** @type {Response | null} */
    let other = null;
    // The client's fetch, with another device slipped in front of its resume:
    // that one's resume is sent (and accepted) first, then the client's.
    /** @type {typeof fetch} */
    const racing = async (input, init) => {
      const resuming = init?.method === "POST" && String(input).includes("resume=true");
      if (resuming && other === null) {
        other = await fetch(input, { ...init, signal: null });
        assert.equal(other.status, 201, "the other device's resume is accepted");
      }
      const response = await fetch(input, init);
      if (resuming) resumeAnswers.push(response.status);
      return response;
    };
    const client = clientOf([victim.url, survivor.url], { fetch: racing });
    const turn = await client.startTurn({ agent: "writer", content: PROMPT });
    const { events, after } = await killMidAnswer(turn, victim);
    await /** @type {Response | null} */ (other)?.body?.cancel();

    assert.deepEqual(resumeAnswers, [409], "the client's resume lost the race");
    const streams = after.filter((event) => event.type === "stream");
    assert.ok(streams.every((event) => event.type === "stream" && event.via === "attach"));
    assert.deepEqual(streams.at(-1), { type: "stream", via: "attach", url: survivor.url });
    assertComplete(turn, events, expected);
  });
});
