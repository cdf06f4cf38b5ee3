// A new turn's request whose answer is lost on the way is never sent twice:
// the status tells whether it started. Staged with the client's own fetch,
// which loses the answer of the first POST (after the server got it, or
// before), in front of real replicas.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";

import { TurnOutcomeUnknownError } from "tether-client";

import {
  NEEDS_REPLICAS,
  PROMPT,
  REPLICAS,
  clientOf,
  readAll,
  reference,
} from "./support/replicas.js";

/**
 * A fetch that loses the first new turn's answer: `sent` says whether the
 * request reached the server first. Counts the turns' POSTs.
 * @param {boolean} sent
 */
function losingFirstStart(sent) {
  const starts = { count: 0 };
  /** @type {typeof fetch} */
  const lossy = async (input, init) => {
    const starting =
      init?.method === "POST" &&
      String(input).includes("/chat/stream?") &&
      !String(input).includes("resume=");
    if (starting && starts.count++ === 0) {
      if (sent) await (await fetch(input, init)).body?.cancel();
      throw new TypeError("fetch failed", { cause: new Error("socket hang up") });
    }
    return fetch(input, init);
  };
  return { lossy, starts };
}

/**
 * The conversation's user messages, as the server keeps them.
 * @param {import("tether-client").TetherClient} client
 * @param {string} sessionId
 */
async function userMessages(client, sessionId) {
  const { messages } = await client.getConversation(sessionId);
  return messages.filter((message) => message.sender === "user").map((m) => m.content);
}

describe("a new turn's answer lost on the way", { skip: NEEDS_REPLICAS }, () => {
  test("it had started: the client follows that turn, and sends nothing again", async () => {
    const expected = await reference(REPLICAS[0].url, "plain");
    const { lossy, starts } = losingFirstStart(true);
    const client = clientOf(REPLICAS[0].url, { fetch: lossy });
    const turn = await client.startTurn({ agent: "plain", content: PROMPT });
    const events = await readAll(turn);
    assert.equal(starts.count, 1, "one POST: the status found the turn it started");
    assert.deepEqual(events[0], { type: "turn", messageId: turn.messageId });
    assert.equal(turn.outcome?.reason, "done");
    assert.equal(turn.message?.content, expected);
    assert.deepEqual(await userMessages(client, turn.sessionId), [PROMPT]);
  });

  test("in a conversation of the caller's, the transcript tells the turn is this one", async () => {
    const user = `lost-${randomUUID().slice(0, 8)}`;
    const first = clientOf(REPLICAS[0].url, { user });
    const earlier = await first.startTurn({ agent: "plain", content: "An earlier question." });
    await readAll(earlier);

    const { lossy, starts } = losingFirstStart(true);
    const client = clientOf(REPLICAS[1].url, { user, fetch: lossy });
    const turn = await client.startTurn({
      agent: "plain",
      content: PROMPT,
      sessionId: earlier.sessionId,
    });
    await readAll(turn);
    assert.equal(starts.count, 1);
    assert.notEqual(turn.messageId, earlier.messageId);
    assert.equal(turn.outcome?.reason, "done");
    assert.deepEqual(await userMessages(client, turn.sessionId), ["An earlier question.", PROMPT]);
  });

  test("it had not reached a server: no turn, so it is sent again, once", async () => {
    const { lossy, starts } = losingFirstStart(false);
    const client = clientOf(REPLICAS[0].url, { fetch: lossy });
    const turn = await client.startTurn({ agent: "plain", content: PROMPT });
    await readAll(turn);
    assert.equal(starts.count, 2);
    assert.equal(turn.outcome?.reason, "done");
    assert.deepEqual(await userMessages(client, turn.sessionId), [PROMPT]);
  });

  test("another turn holds the conversation: the outcome is unknown, and said so", async () => {
    const user = `unknown-${randomUUID().slice(0, 8)}`;
    const first = clientOf(REPLICAS[0].url, { user });
    const earlier = await first.startTurn({ agent: "plain", content: "An earlier question." });
    await readAll(earlier);

    const { lossy } = losingFirstStart(false);
    const client = clientOf(REPLICAS[0].url, { user, fetch: lossy });
    await assert.rejects(
      client.startTurn({ agent: "plain", content: PROMPT, sessionId: earlier.sessionId }),
      TurnOutcomeUnknownError,
    );
    assert.deepEqual(await userMessages(client, earlier.sessionId), ["An earlier question."]);
  });
});
