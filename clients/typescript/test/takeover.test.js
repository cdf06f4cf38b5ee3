// A replica SIGKILLed mid-answer, with automatic takeover on (as deployed):
// the client, given the replicas' URLs, carries on through another one and
// ends with the whole answer, each index handed on once. This file kills the
// third replica, which no other test uses.

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

describe("a replica dies mid-answer", { skip: NEEDS_REPLICAS }, () => {
  test("the client recovers through another URL, with the complete answer", async () => {
    const [one, , victim] = REPLICAS;
    const expected = await reference(one.url, "writer");
    const toolsBefore = toolRuns();
    const client = clientOf([victim.url, one.url]);
    const turn = await client.startTurn({ agent: "writer", content: PROMPT });

    /** @type {string | null} */
    let shownAtKill = null;
    let killedAt = -1;
    const events = await readAll(turn, async (event, seen) => {
      // Well past the tool call (after 5 chunks): its result is checkpointed.
      if (killedAt === -1 && event.type === "message" && (event.index ?? 0) >= 40) {
        killedAt = seen.length;
        shownAtKill = event.message.content ?? "";
        await kill(victim);
      }
    });
    assert.ok(killedAt > 0 && shownAtKill !== null, "the replica was killed mid-answer");

    const before = messagesOf(events.slice(0, killedAt));
    const afterKill = events.slice(killedAt);
    // Read live from the producer, from the first index. (A reader can skip an
    // index: the live buffer keeps only the newest message, which holds all
    // the ones before it.)
    assert.equal(before[0]?.index, 0);
    assert.equal(afterKill[0]?.type, "recovering");
    assert.equal(/** @type {any} */ (afterKill[0]).cause, "disconnected");
    const streams = afterKill.filter((event) => event.type === "stream");
    assert.ok(streams.length >= 1);
    for (const stream of streams) assert.equal(/** @type {any} */ (stream).url, one.url);

    const messages = messagesOf(events);
    assert.ok(strictlyIncreasing(messages), "no index handed on twice");
    const recovered = messagesOf(afterKill);
    assert.ok(recovered.length > 0, "the answer went on after the kill");
    for (let i = 1; i < recovered.length; i++) {
      const [earlier, later] = [
        recovered[i - 1].message.content ?? "",
        recovered[i].message.content ?? "",
      ];
      assert.ok(later.startsWith(earlier), "after the kill the answer only grows");
    }
    assert.deepEqual(turn.outcome, { reason: "done", error: null });
    assert.equal(turn.message?.content, expected, "the same answer as a crash-free run");
    assert.ok(expected.startsWith(shownAtKill), "nothing shown before the kill is taken back");
    assert.equal(toolRuns() - toolsBefore, 1, "the completed tool call was not run again");

    const { conversation, messages: transcript } = await client.getConversation(turn.sessionId);
    assert.equal(conversation.last_turn_status, "complete");
    assert.deepEqual(
      transcript.filter((message) => message.sender === "bot").map((message) => message.content),
      [expected],
    );
  });
});
