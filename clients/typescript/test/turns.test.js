// Turns streamed and followed against real replicas: to completion, from a
// second replica, after a Last-Event-ID, and through one load-balanced URL
// whose connections are cut mid-answer.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { startBalancer } from "./support/balancer.js";
import {
  NEEDS_REPLICAS,
  PROMPT,
  REPLICAS,
  clientOf,
  messagesOf,
  readAll,
  reference,
  strictlyIncreasing,
} from "./support/replicas.js";

describe("turns", { skip: NEEDS_REPLICAS }, () => {
  /** @type {string} */
  let expected;

  before(async () => {
    expected = await reference(REPLICAS[0].url, "plain");
  });

  test("a turn streams to its end: cumulative messages, growing indexes, verdict", async () => {
    const [one, two] = REPLICAS;
    const client = clientOf([one.url, two.url]);
    const turn = await client.startTurn({ agent: "plain", content: PROMPT });
    assert.ok(turn.messageId, "the message id is known once the turn is accepted");
    const events = await readAll(turn);

    assert.deepEqual(events[0], { type: "turn", messageId: turn.messageId });
    assert.deepEqual(events[1], { type: "stream", via: "start", url: one.url });
    assert.deepEqual(events.at(-1), { type: "end", reason: "done", error: null });
    assert.ok(!events.some((event) => event.type === "recovering"));
    const messages = messagesOf(events);
    assert.ok(messages.length > 10, "the answer is seen growing, not at once");
    assert.equal(messages[0].index, 0);
    assert.ok(strictlyIncreasing(messages));
    for (let i = 1; i < messages.length; i++) {
      const [earlier, later] = [
        messages[i - 1].message.content ?? "",
        messages[i].message.content ?? "",
      ];
      assert.ok(later.startsWith(earlier), "each message extends the one before");
    }
    const last = messages.at(-1);
    assert.equal(last?.message.content, expected);
    assert.equal(last?.message.message_id, turn.messageId);
    assert.equal(last?.eventId, `${turn.messageId}:${last?.index}`);
    assert.equal(turn.lastEventId, last?.eventId);
    assert.deepEqual(turn.outcome, { reason: "done", error: null });

    const { conversation, messages: transcript } = await client.getConversation(turn.sessionId);
    assert.equal(conversation.last_turn_status, "complete");
    assert.deepEqual(
      transcript.map((message) => [message.sender, message.content]),
      [
        ["user", PROMPT],
        ["bot", expected],
      ],
    );
  });

  test("stream() yields the answer so far, message after message", async () => {
    const client = clientOf(REPLICAS[0].url);
    let last = "";
    for await (const message of client.stream({ agent: "plain", content: PROMPT })) {
      assert.ok((message.content ?? "").startsWith(last));
      last = message.content ?? "";
    }
    assert.equal(last, expected);
  });

  test("a second screen on another replica follows the same turn to the same end", async () => {
    const [one, two] = REPLICAS;
    const user = `screens-${Date.now()}`;
    const phone = clientOf(one.url, { user });
    const laptop = clientOf(two.url, { user });
    const turn = await phone.startTurn({ agent: "plain", content: PROMPT });
    const reading = readAll(turn);

    const followed = laptop.follow(turn.sessionId);
    const events = await readAll(followed);
    assert.deepEqual(events[0], { type: "turn", messageId: turn.messageId });
    assert.deepEqual(events[1], { type: "stream", via: "attach", url: two.url });
    assert.equal(events.at(-1)?.type, "end");
    assert.equal(followed.outcome?.reason, "done");
    assert.equal(followed.message?.content, expected);
    assert.ok(strictlyIncreasing(messagesOf(events)));
    await reading;
    assert.equal(turn.message?.content, expected);
  });

  test("following again after a Last-Event-ID continues after it, nothing repeated", async () => {
    const [one, two] = REPLICAS;
    const user = `reload-${Date.now()}`;
    const client = clientOf(one.url, { user });
    const turn = await client.startTurn({ agent: "plain", content: PROMPT });
    /** @type {string | null} */
    let saved = null;
    for await (const event of turn.events()) {
      if (event.type === "message" && (event.index ?? 0) >= 20) {
        saved = event.eventId;
        break; // the tab is reloaded: reading stops here
      }
    }
    assert.ok(saved && turn.closed);
    const savedIndex = Number(saved.split(":").at(-1));

    const again = clientOf(two.url, { user }).follow(turn.sessionId, { lastEventId: saved });
    const events = await readAll(again);
    const messages = messagesOf(events);
    assert.ok(messages.length > 0);
    assert.ok(
      /** @type {number} */ (messages[0].index) > savedIndex,
      "it goes on after the saved event",
    );
    assert.ok(strictlyIncreasing(messages));
    assert.equal(again.outcome?.reason, "done");
    assert.equal(again.message?.content, expected);
  });

  test("following a finished turn, or a conversation with none, says so at once", async () => {
    const client = clientOf(REPLICAS[0].url);
    const none = await readAll(client.follow(`never-${Date.now()}`));
    assert.deepEqual(none, [{ type: "end", reason: "none", error: null }]);

    const turn = await client.startTurn({ agent: "plain", content: PROMPT });
    await readAll(turn);
    const ended = await readAll(client.follow(turn.sessionId));
    assert.deepEqual(ended, [
      { type: "turn", messageId: turn.messageId },
      { type: "end", reason: "done", error: null },
    ]);
  });

  describe("through one load-balanced URL", () => {
    /** @type {Awaited<ReturnType<typeof startBalancer>>} */
    let balancer;
    before(async () => {
      balancer = await startBalancer(REPLICAS.slice(0, 2).map((replica) => replica.url));
    });
    after(() => balancer.close());

    test("connections cut mid-answer: the client comes back through the same URL", async () => {
      const client = clientOf(balancer.url);
      const turn = await client.startTurn({ agent: "plain", content: PROMPT });
      let cut = false;
      const events = await readAll(turn, (event) => {
        if (!cut && event.type === "message" && (event.index ?? 0) >= 25) {
          cut = true;
          // The network drops every open connection; both replicas live on.
          balancer.cutAll();
        }
      });
      const recovering = events.findIndex((event) => event.type === "recovering");
      assert.ok(recovering > 0, "the cut was noticed");
      assert.deepEqual(events[recovering], {
        type: "recovering",
        cause: "disconnected",
        error: /** @type {any} */ (events[recovering]).error,
      });
      const reattached = events.slice(recovering).find((event) => event.type === "stream");
      assert.deepEqual(reattached, { type: "stream", via: "attach", url: balancer.url });
      const messages = messagesOf(events);
      assert.ok(strictlyIncreasing(messages));
      for (let i = 1; i < messages.length; i++) {
        const [earlier, later] = [
          messages[i - 1].message.content ?? "",
          messages[i].message.content ?? "",
        ];
        assert.ok(later.startsWith(earlier), "no text lost or repeated across the cut");
      }
      assert.equal(turn.outcome?.reason, "done");
      assert.equal(turn.message?.content, expected);
    });
  });
});
