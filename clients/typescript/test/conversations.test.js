// Conversations: list (newest first, page by page), read, share, delete.

import assert from "node:assert/strict";
import { before, describe, test } from "node:test";

import { ConversationBusyError, NotFoundError, PermissionDeniedError } from "tether-client";

import { NEEDS_REPLICAS, PROMPT, REPLICAS, clientOf, readAll } from "./support/replicas.js";

describe("conversations", { skip: NEEDS_REPLICAS }, () => {
  const owner = `owner-${Date.now()}`;
  /** @type {string[]} */
  const sessions = [];
  /** @type {string[]} */
  const answers = [];

  before(async () => {
    const client = clientOf(REPLICAS[0].url, { user: owner });
    for (const words of ["First: rivers.", "Second: towns."]) {
      const turn = await client.startTurn({ agent: "plain", content: words });
      await readAll(turn);
      sessions.push(turn.sessionId);
      answers.push(turn.message?.content ?? "");
    }
  });

  test("the list is the owner's own, newest first, page by page", async () => {
    const client = clientOf(REPLICAS[1].url, { user: owner });
    const page = await client.listConversations({ limit: 1 });
    assert.deepEqual(
      page.items.map((item) => item.session_id),
      [sessions[1]],
    );
    assert.ok(page.next_cursor);
    const next = await client.listConversations({ limit: 1, cursor: page.next_cursor });
    assert.deepEqual(
      next.items.map((item) => item.session_id),
      [sessions[0]],
    );

    const all = [];
    for await (const item of client.conversations({ pageSize: 1 })) all.push(item);
    assert.deepEqual(
      all.map((item) => item.session_id),
      [sessions[1], sessions[0]],
    );
    assert.equal(all[0].owner_uuid, owner);
    assert.equal(all[0].agent_identifier, "plain");
    assert.equal(all[0].last_turn_status, "complete");
    assert.equal(all[0].title, "Second: towns.");

    const stranger = clientOf(REPLICAS[1].url);
    assert.deepEqual((await stranger.listConversations()).items, []);
  });

  test("a conversation reads back with its transcript", async () => {
    const client = clientOf(REPLICAS[1].url, { user: owner });
    const { conversation, messages } = await client.getConversation(sessions[0]);
    assert.equal(conversation.session_id, sessions[0]);
    assert.equal(conversation.message_count, 2);
    assert.deepEqual(
      messages.map((message) => [message.sender, message.content]),
      [
        ["user", "First: rivers."],
        ["bot", answers[0]],
      ],
    );
  });

  test("sharing lets another user of the tenant read it, until it is private again", async () => {
    const client = clientOf(REPLICAS[0].url, { user: owner });
    const reader = clientOf(REPLICAS[1].url);
    await assert.rejects(reader.getConversation(sessions[0]), PermissionDeniedError);

    const shared = await client.shareConversation(sessions[0]); // shared: true by default
    assert.equal(shared.shared, true);
    const seen = await reader.getConversation(sessions[0]);
    assert.equal(seen.messages.at(-1)?.content, answers[0]);
    await assert.rejects(reader.shareConversation(sessions[0], false), PermissionDeniedError);
    await assert.rejects(reader.deleteConversation(sessions[0]), PermissionDeniedError);

    assert.equal((await client.shareConversation(sessions[0], false)).shared, false);
    await assert.rejects(reader.getConversation(sessions[0]), PermissionDeniedError);
  });

  test("delete removes it everywhere; not while a turn runs in it", async () => {
    const client = clientOf(REPLICAS[0].url, { user: owner });
    const running = await client.startTurn({
      agent: "plain",
      content: PROMPT,
      sessionId: sessions[1],
    });
    await assert.rejects(client.deleteConversation(sessions[1]), ConversationBusyError);
    await running.cancel();
    await readAll(running);

    await client.deleteConversation(sessions[1]);
    const other = clientOf(REPLICAS[1].url, { user: owner });
    await assert.rejects(other.getConversation(sessions[1]), NotFoundError);
    await assert.rejects(other.deleteConversation(sessions[1]), NotFoundError);
    assert.deepEqual(
      (await other.listConversations()).items.map((item) => item.session_id),
      [sessions[0]],
    );
  });
});
