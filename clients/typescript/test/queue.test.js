// Double texting: a message sent while another turn runs is queued
// (`multitaskStrategy: "enqueue"`, answered 202), runs after it in arrival
// order, can be cancelled before it runs, is followed from a second screen,
// and survives the death of the replica its stream waited on; `interrupt`
// starts at once. This file kills the third replica, which no other test
// of its cluster uses.

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
  until,
} from "./support/replicas.js";

/**
 * A turn streaming in a new conversation of `client`, read in the
 * background once `after` of its messages are in.
 * @param {import("tether-client").TetherClient} client
 * @param {number} [after]
 */
async function running(client, after = 1) {
  const turn = await client.startTurn({ agent: "plain", content: PROMPT });
  const events = turn.events();
  /** @type {import("tether-client").TurnEvent[]} */
  const seen = [];
  while (messagesOf(seen).length < after) {
    const next = await events.next();
    assert.ok(!next.done, "the turn ended before it was interrupted");
    seen.push(next.value);
  }
  const rest = (async () => {
    for await (const event of events) seen.push(event);
    return seen;
  })();
  return { turn, reading: rest };
}

/**
 * The transcript as [sender, message_id] pairs.
 * @param {import("tether-client").TetherClient} client
 * @param {string} sessionId
 */
async function shape(client, sessionId) {
  const { messages } = await client.getConversation(sessionId);
  return messages.map((message) => [message.sender, message.message_id]);
}

/**
 * An event in a line, for a failure's message: its type, and its index or reason.
 * @param {import("tether-client").TurnEvent} event
 */
function summary(event) {
  if (event.type === "message") return `message@${event.index}`;
  return `${event.type}:${JSON.stringify(event).slice(0, 120)}`;
}

describe("double texting", { skip: NEEDS_REPLICAS }, () => {
  test("messages sent while a turn runs are queued, then run in arrival order", async () => {
    const [one, two] = REPLICAS;
    const user = `queue-${Date.now()}`;
    const client = clientOf(one.url, { user });
    const { turn: first, reading } = await running(client);

    const queued = [];
    for (const content of ["And lakes?", "And seas?"]) {
      queued.push(
        await client.startTurn({
          agent: "plain",
          content,
          sessionId: first.sessionId,
          multitaskStrategy: "enqueue",
        }),
      );
    }
    assert.deepEqual(
      queued.map((turn) => [turn.queued, turn.queuePosition]),
      [
        [true, 1],
        [true, 2],
      ],
    );
    assert.ok(queued.every((turn) => turn.messageId && turn.messageId !== first.messageId));

    // Any replica's status lists them, in the order they will run.
    const status = await clientOf(two.url, { user }).status(first.sessionId);
    assert.equal(status?.message_id, first.messageId);
    assert.deepEqual(
      status?.queue?.map((entry) => [entry.message_id, entry.content]),
      [
        [queued[0].messageId, "And lakes?"],
        [queued[1].messageId, "And seas?"],
      ],
    );
    // The transcript shows them at once, marked queued.
    const { messages } = await client.getConversation(first.sessionId);
    assert.deepEqual(
      messages.filter((m) => m.queued).map((m) => [m.message_id, m.queued?.message_id]),
      queued.map((turn) => [`${turn.messageId}-queued`, turn.messageId]),
    );

    const [firstEvents, ...queuedEvents] = await Promise.all([
      reading,
      ...queued.map((turn) => readAll(turn)),
    ]);
    assert.equal(firstEvents.at(-1)?.type, "end");
    assert.equal(first.outcome?.reason, "done");
    queued.forEach((turn, i) => {
      const events = queuedEvents[i];
      assert.deepEqual(events.slice(0, 3), [
        { type: "turn", messageId: turn.messageId },
        { type: "stream", via: "start", url: one.url },
        { type: "queued", messageId: turn.messageId, position: i + 1 },
      ]);
      assert.ok(
        messagesOf(events).length > 10,
        `its answer is seen growing: ${JSON.stringify(events.map(summary))}`,
      );
      assert.ok(strictlyIncreasing(messagesOf(events)));
      assert.deepEqual(turn.outcome, { reason: "done", error: null });
    });

    const ids = [first, ...queued].map((turn) => turn.messageId);
    assert.deepEqual(
      await shape(client, first.sessionId),
      ids.flatMap((id) => [
        ["user", `${id}-user`],
        ["bot", id],
      ]),
    );
    const after = await client.status(first.sessionId);
    assert.equal(after?.message_id, queued[1].messageId);
    assert.deepEqual(after?.queue, []);
  });

  test("a queued turn cancelled from another replica never runs", async () => {
    const [one, two] = REPLICAS;
    const user = `unqueue-${Date.now()}`;
    const client = clientOf(one.url, { user });
    const { turn: first, reading } = await running(client);
    const waiting = await client.startTurn({
      agent: "plain",
      content: "Never mind",
      sessionId: first.sessionId,
      multitaskStrategy: "enqueue",
    });
    const waitingEvents = readAll(waiting);

    const cancelled = await clientOf(two.url, { user }).cancel(
      first.sessionId,
      /** @type {string} */ (waiting.messageId),
    );
    assert.equal(cancelled, true);
    const events = await waitingEvents;
    assert.deepEqual(events.at(-1), { type: "end", reason: "cancelled", error: null });
    assert.equal(messagesOf(events).length, 0);
    assert.deepEqual((await client.status(first.sessionId))?.queue, []);

    await reading;
    assert.equal(first.outcome?.reason, "done");
    assert.deepEqual(await shape(client, first.sessionId), [
      ["user", `${first.messageId}-user`],
      ["bot", first.messageId],
    ]);
  });

  test("a second screen follows a queued turn by its id: it waits, then streams", async () => {
    const [one, two] = REPLICAS;
    const user = `second-${Date.now()}`;
    const client = clientOf(one.url, { user });
    const { turn: first, reading } = await running(client);
    const waiting = await client.startTurn({
      agent: "plain",
      content: "And lakes?",
      sessionId: first.sessionId,
      multitaskStrategy: "enqueue",
    });
    waiting.close(); // the first screen hangs up; the turn stays queued
    const messageId = /** @type {string} */ (waiting.messageId);

    const followed = clientOf(two.url, { user }).follow(first.sessionId, { messageId });
    const events = await readAll(followed);
    assert.deepEqual(events.slice(0, 3), [
      { type: "turn", messageId },
      { type: "stream", via: "attach", url: two.url },
      { type: "queued", messageId, position: 1 },
    ]);
    assert.ok(strictlyIncreasing(messagesOf(events)));
    assert.equal(followed.queued, true);
    await reading;
    const { messages } = await client.getConversation(first.sessionId);
    assert.equal(followed.message?.content, messages.at(-1)?.content);
    assert.equal(messages.at(-1)?.message_id, messageId);
    // Read through the other replica, it may end "unknown": see the README.
    assert.ok(
      ["done", "unknown"].includes(followed.outcome?.reason ?? ""),
      followed.outcome?.reason,
    );
  });

  test("the replica a queued turn's stream waited on dies: the client attaches elsewhere", async () => {
    const [one, , victim] = REPLICAS;
    const expected = await reference(one.url, "plain", "And lakes?");
    const user = `survivor-${Date.now()}`;
    const { turn: first, reading } = await running(clientOf(one.url, { user }));
    const client = clientOf([victim.url, one.url], { user });
    const turn = await client.startTurn({
      agent: "plain",
      content: "And lakes?",
      sessionId: first.sessionId,
      multitaskStrategy: "enqueue",
    });
    assert.equal(turn.queued, true);

    const events = await readAll(turn, async (event) => {
      if (event.type === "queued" && event.position !== null) await kill(victim);
    });
    const recovering = events.findIndex((event) => event.type === "recovering");
    assert.ok(recovering > 0, "the broken stream was noticed");
    assert.deepEqual(
      events.slice(recovering + 1, recovering + 3).map((event) => event.type),
      ["stream", "queued"],
      "found still waiting in the queue, and attached to",
    );
    assert.deepEqual(events[recovering + 1], { type: "stream", via: "attach", url: one.url });
    assert.ok(messagesOf(events).length > 10, JSON.stringify(events.map(summary)));
    assert.ok(strictlyIncreasing(messagesOf(events)));
    assert.deepEqual(turn.outcome, { reason: "done", error: null });
    assert.equal(turn.message?.content, expected);
    await reading;
  });

  test("an interrupting message starts at once; the partial answer is kept", async () => {
    const [one, two] = REPLICAS;
    const user = `interrupt-${Date.now()}`;
    // Past a recording flush (every 0.5 s; the delta-mode stream brings at
    // most one message per 0.125 s): the partial answer an interrupt keeps is
    // what was recorded, as for any cancel from another replica.
    const { turn: first, reading } = await running(clientOf(one.url, { user }), 8);
    const other = clientOf(two.url, { user });
    const turn = await other.startTurn({
      agent: "plain",
      content: "Actually, lakes?",
      sessionId: first.sessionId,
      multitaskStrategy: "interrupt",
    });
    assert.equal(turn.queued, false);
    assert.equal(turn.queuePosition, null);
    assert.equal(turn.position, null, "position: the old name of queuePosition");
    await readAll(turn);
    assert.deepEqual(turn.outcome, { reason: "done", error: null });
    const firstEvents = await reading;
    assert.equal(firstEvents.at(-1)?.type, "end");
    assert.deepEqual(await shape(other, first.sessionId), [
      ["user", `${first.messageId}-user`],
      ["bot", first.messageId],
      ["user", `${turn.messageId}-user`],
      ["bot", turn.messageId],
    ]);
    await until(async () => (await other.status(first.sessionId))?.status === "done", 5000, "done");
  });
});
