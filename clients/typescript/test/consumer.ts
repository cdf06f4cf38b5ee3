// What a TypeScript user of the package writes; type-checked by
// test/types.test.js against the published declarations (never run).

import {
  ConversationBusyError,
  TetherClient,
  TurnFailedError,
  type ChatMessage,
  type TurnEvent,
} from "tether-client";

export async function example(): Promise<string> {
  const client = new TetherClient({
    urls: ["http://replica-1:8000", "http://replica-2:8000"],
    tenant: "acme",
    user: "alice",
  });
  let answer: ChatMessage | null = null;
  try {
    for await (const message of client.stream({ agent: "assistant", content: "Hi" })) {
      answer = message;
    }
  } catch (error) {
    if (error instanceof TurnFailedError) return error.code;
    if (error instanceof ConversationBusyError) return error.occupant ?? "";
    throw error;
  }
  const turn = client.follow("session-1", { lastEventId: "m:3" });
  for await (const event of turn.events()) {
    const seen: TurnEvent = event;
    if (seen.type === "message") answer = seen.message;
    if (seen.type === "end" && seen.reason === "cancelled") break;
  }
  const queued = await client.startTurn({
    agent: "assistant",
    content: "And then?",
    sessionId: "session-1",
    multitaskStrategy: "enqueue",
  });
  const place: number | null = queued.queued ? queued.queuePosition : null;
  for await (const event of queued.events()) {
    if (event.type === "queued")
      answer = { sender: "user", content: `#${event.position ?? place}` };
  }
  const waiting = (await client.status("session-1"))?.queue?.map((entry) => entry.content);
  const page = await client.listConversations({ limit: 10 });
  const first = page.items[0]?.session_id;
  if (first) await client.shareConversation(first);
  const gone: boolean = await queued.cancel();
  const final: ChatMessage | null = gone ? null : await queued.answer();
  return final?.content ?? answer?.content ?? waiting?.join() ?? "";
}
