// Cancel, from any replica: the reader hears `cancelled`, the partial answer
// is kept in the transcript.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { NEEDS_REPLICAS, PROMPT, REPLICAS, clientOf, readAll } from "./support/replicas.js";

describe("cancel", { skip: NEEDS_REPLICAS }, () => {
  test("a cancel from another replica ends the reader's turn cancelled", async () => {
    const [one, two] = REPLICAS;
    const user = `canceller-${Date.now()}`;
    const reader = clientOf(one.url, { user });
    const elsewhere = clientOf(two.url, { user });
    const turn = await reader.startTurn({ agent: "plain", content: PROMPT });
    let cancelled = false;
    const events = await readAll(turn, async (event) => {
      if (!cancelled && event.type === "message" && (event.index ?? 0) >= 20) {
        cancelled = true;
        await elsewhere.cancel(turn.sessionId, /** @type {string} */ (turn.messageId));
      }
    });
    assert.deepEqual(events.at(-1), { type: "end", reason: "cancelled", error: null });
    assert.deepEqual(turn.outcome, { reason: "cancelled", error: null });

    const { conversation, messages } = await elsewhere.getConversation(turn.sessionId);
    assert.equal(conversation.last_turn_status, "cancelled");
    const kept = messages.at(-1);
    assert.equal(kept?.sender, "bot");
    assert.ok((kept?.content ?? "").length > 0, "the partial answer is kept");
    assert.ok((turn.message?.content ?? "").startsWith(kept?.content ?? "\0"));
  });

  test("turn.cancel() stops the turn being read; iterating its messages just ends", async () => {
    const client = clientOf(REPLICAS[0].url);
    const turn = await client.startTurn({ agent: "plain", content: PROMPT });
    let count = 0;
    for await (const message of turn) {
      assert.equal(message.message_id, turn.messageId);
      if (++count === 10) assert.equal(await turn.cancel(), true);
    }
    assert.equal(turn.outcome?.reason, "cancelled");
    assert.equal((await client.status(turn.sessionId))?.status, "cancelled");
  });
});
