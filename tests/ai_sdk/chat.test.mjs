// A front end written for the AI SDK, against real tether replicas.
//
// It uses the AI SDK's own pieces and nothing of tether's: `Chat` from
// @ai-sdk/react (the object `useChat` wraps: `useChat({resume: true})`
// calls its `resumeStream()` when the page mounts), `DefaultChatTransport`,
// and `readUIMessageStream`. tests/test_ai_sdk.py starts the replicas and
// runs each test here by name; TETHER_AI_SDK holds what it started:
// {"replicas": [{"url", "pid"}], "tenant", "prompt", "reference", "pausing"}.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Chat } from '@ai-sdk/react';
import { DefaultChatTransport, readUIMessageStream } from 'ai';

import { Balancer } from './balancer.mjs';

const config = JSON.parse(process.env.TETHER_AI_SDK ?? '{}');
const TENANT = config.tenant;
const PROMPT = config.prompt;
const REFERENCE = config.reference; // the crash-free answer to PROMPT, as text
const WAIT = 60_000; // ms: the bound on any one wait below
// The stop route takes only JSON, so a cross-site form cannot post to it.
const STOP = { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' };

let balancer;

before(async () => {
  balancer = await new Balancer(config.replicas.map((r) => r.url)).start();
});

after(async () => {
  await balancer?.close();
});

function user() {
  return `user-${Math.random().toString(36).slice(2, 10)}`;
}

function chatId() {
  return `chat${Math.random().toString(36).slice(2, 14)}`;
}

// What a front end configures, once: one URL (the load balancer), the
// tenant as a query parameter and the identity a gateway would set.
function transport(requester, extra = {}) {
  return new DefaultChatTransport({
    api: `${balancer.url}/ai-sdk/chat?tenant=${TENANT}`,
    headers: { 'requester-uuid': requester },
    ...extra,
  });
}

function newChat({ id, requester, messages = [], body, onFinish }) {
  return new Chat({
    id,
    messages,
    transport: transport(requester, body ? { body } : {}),
    ...(onFinish ? { onFinish } : {}),
  });
}

function answer(chat) {
  const last = chat.messages.at(-1);
  return last?.role === 'assistant' ? last : undefined;
}

// The answer's text as tether's `content` joins it: text parts, a blank line apart.
function text(message) {
  return (message?.parts ?? [])
    .filter((part) => part.type === 'text')
    .map((part) => part.text)
    .join('\n\n');
}

// Wait for a condition, polling, with a bound: never a bare sleep.
async function until(what, predicate, within = WAIT) {
  const deadline = Date.now() + within;
  while (!predicate()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function api(path, requester, init = {}) {
  const separator = path.includes('?') ? '&' : '?';
  return fetch(`${balancer.url}${path}${separator}tenant=${TENANT}`, {
    ...init,
    headers: { 'requester-uuid': requester, ...(init.headers ?? {}) },
  });
}

async function transcript(id, requester) {
  const response = await api(`/conversations/${id}`, requester);
  assert.equal(response.status, 200, await response.clone().text());
  return response.json();
}

function assertWholeAnswer(message) {
  assert.ok(message, 'an assistant message');
  assert.equal(text(message), REFERENCE, 'the same answer as a crash-free run');
  const tools = message.parts.filter((part) => part.type === 'tool-calculator');
  assert.equal(tools.length, 1, 'one calculator call');
  assert.equal(tools[0].state, 'output-available');
  for (const part of message.parts.filter((p) => p.type === 'text')) {
    assert.equal(part.state, 'done');
  }
}

test('stream: useChat sends, streams and finishes an answer with the default agent', async () => {
  balancer.prefer(0);
  const requester = user();
  const id = chatId();
  const chat = newChat({ id, requester });
  await chat.sendMessage({ text: PROMPT });
  assert.equal(chat.status, 'ready', String(chat.error));
  assert.equal(chat.messages.length, 2);
  assertWholeAnswer(answer(chat));

  // The message id is the turn's: the transcript's answer has the same one.
  const stored = await transcript(id, requester);
  assert.equal(stored.conversation.agent_identifier, 'writer', 'the first agent set up');
  assert.equal(stored.messages.at(-1).message_id, answer(chat).id);

  // After the turn, a reconnect finds nothing to resume (204): nothing changes.
  await chat.resumeStream();
  assert.equal(chat.status, 'ready');
  assert.equal(chat.messages.length, 2);

  // A reloaded page starts from the transcript, as UIMessages.
  const messages = await (await api(`/ai-sdk/chat/${id}/messages`, requester)).json();
  assert.deepEqual(
    messages.map((m) => m.role),
    ['user', 'assistant'],
  );
  assert.equal(text(messages[1]), REFERENCE);
  assert.equal(messages[1].id, answer(chat).id);
});

test('stream: the wire is the UI message stream protocol, read by the SDK', async () => {
  balancer.prefer(1);
  const requester = user();
  const response = await api('/ai-sdk/chat', requester, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      id: chatId(),
      trigger: 'submit-message',
      messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: PROMPT }] }],
      agent_identifier: 'writer',
      some_field_of_the_front_end: 'ignored',
    }),
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('x-vercel-ai-ui-message-stream'), 'v1');
  assert.match(response.headers.get('content-type'), /^text\/event-stream/);
  const lines = (await response.text())
    .split(/\r?\n/)
    .filter((line) => line.startsWith('data: '))
    .map((line) => line.slice('data: '.length));
  assert.equal(lines.at(-1), '[DONE]');
  const parts = lines.slice(0, -1).map((line) => JSON.parse(line));
  const types = new Set(parts.map((p) => p.type));
  assert.equal(parts[0].type, 'start');
  assert.ok(parts[0].messageId);
  assert.equal(parts.at(-1).type, 'finish');
  for (const type of ['text-start', 'text-delta', 'text-end', 'tool-input-available', 'tool-output-available']) {
    assert.ok(types.has(type), `a ${type} part`);
  }

  // The SDK's own reader builds the same answer from the transport's stream.
  const chunks = await transport(requester).sendMessages({
    chatId: chatId(),
    messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: PROMPT }] }],
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
  });
  let last;
  for await (const message of readUIMessageStream({ stream: chunks, terminateOnError: true })) {
    last = message;
  }
  assertWholeAnswer(last);
});

test('stream: an agent that fails is the chat error; nothing to resume is a 204', async () => {
  balancer.prefer(0);
  const requester = user();
  const chat = newChat({ id: chatId(), requester, body: { agent_identifier: 'broken' } });
  await chat.sendMessage({ text: PROMPT });
  assert.equal(chat.status, 'error');
  assert.match(chat.error.message, /^INTERNAL: /);

  const nothing = await transport(requester).reconnectToStream({ chatId: chatId() });
  assert.equal(nothing, null, 'no running turn: 204, and the SDK does not resume');

  const unknown = newChat({ id: chatId(), requester, body: { agent_identifier: 'nobody' } });
  await unknown.sendMessage({ text: PROMPT });
  assert.equal(unknown.status, 'error');
  assert.match(unknown.error.message, /UNKNOWN_AGENT/);
});

test('reconnect: a reload mid-answer resumes through the other replica', async () => {
  const requester = user();
  const id = chatId();
  balancer.prefer(0);
  const first = newChat({ id, requester });
  const sending = first.sendMessage({ text: PROMPT });
  await until('the answer to start', () => text(answer(first)).length > 200);
  const answerId = answer(first).id;
  const seen = text(answer(first));
  // The tab goes away: its fetch is aborted, the connection closes. The turn
  // must go on (closing never cancels).
  await first.stop();
  await sending;

  // The reload lands on the other replica. The page loads the transcript,
  // then useChat({resume: true}) calls resumeStream().
  balancer.prefer(1);
  const stored = await (await api(`/ai-sdk/chat/${id}/messages`, requester)).json();
  assert.deepEqual(
    stored.map((m) => m.role),
    ['user'],
    'the answer is still being written',
  );
  const second = newChat({ id, requester, messages: stored });
  const resuming = second.resumeStream();
  await until('the replay', () => answer(second) !== undefined);
  // The replay brings back at once at least what the first tab had shown.
  await until('the replayed text', () => text(answer(second)).length >= seen.length);
  assert.ok(text(answer(second)).startsWith(seen), 'the replay continues what was shown');
  await resuming;
  assert.equal(second.status, 'ready', String(second.error));
  assert.equal(second.messages.length, 2, 'one answer, not a duplicate');
  assert.equal(answer(second).id, answerId, 'the same answer, by id');
  assertWholeAnswer(answer(second));
  const reconnects = balancer.routes.filter((r) => r.path.startsWith(`/ai-sdk/chat/${id}/stream`));
  assert.deepEqual(
    reconnects.map((r) => r.upstream),
    [1],
    'the reconnect was served by the other replica',
  );
  const turn = await transcript(id, requester);
  assert.equal(turn.conversation.last_turn_status, 'complete');
});

test('kill: the producing replica is SIGKILLed mid-answer and the answer completes', async () => {
  const requester = user();
  const id = chatId();
  balancer.prefer(0);
  const chat = newChat({ id, requester });
  const sending = chat.sendMessage({ text: PROMPT });
  // Past the tool call, so its completed result must not run again.
  await until(
    'the answer past its tool call',
    () => answer(chat)?.parts.some((p) => p.type === 'tool-calculator' && p.state === 'output-available') &&
      text(answer(chat)).length > 300,
  );
  const seen = text(answer(chat));
  process.kill(config.replicas[0].pid, 'SIGKILL');
  await sending;
  // The stream was cut: the chat says so, with what it had kept.
  assert.notEqual(chat.status, 'streaming');
  assert.ok(text(answer(chat)).startsWith(seen));

  // What useChat({resume: true}) does on its next mount; the balancer sends
  // it to the surviving replica, which takes the turn over by itself.
  await chat.resumeStream();
  assert.equal(chat.status, 'ready', String(chat.error));
  assert.equal(chat.messages.length, 2, 'one answer, not a duplicate');
  assertWholeAnswer(answer(chat));
  const turn = await transcript(id, requester);
  assert.equal(turn.conversation.last_turn_status, 'complete');
  assert.equal(turn.messages.length, 2, 'the user message once, the answer once');
  assert.equal(turn.messages[1].content, REFERENCE);
});

test('stop: the stopping page hears its own stop as an abort, on its own replica too', async () => {
  // The stop endpoint and the stream on one replica: the turn ends there at
  // once, and the page's stop() that follows must still find its stream open.
  for (const replica of [0, 1]) {
    const requester = user();
    const id = chatId();
    balancer.prefer(replica);
    const finished = [];
    const chat = newChat({ id, requester, onFinish: (event) => finished.push(event) });
    const sending = chat.sendMessage({ text: PROMPT });
    await until('the answer to start', () => text(answer(chat)).length > 200);
    const stopped = await api(`/ai-sdk/chat/${id}/stop`, requester, STOP);
    assert.equal(stopped.status, 204);
    await chat.stop();
    await sending;
    assert.equal(finished.length, 1);
    assert.equal(finished[0].isAbort, true, `onFinish reports the stop (replica ${replica})`);
    assert.equal(chat.status, 'ready');
  }
});

test('stop: stopping cancels the turn from any replica and keeps the partial answer', async () => {
  const requester = user();
  const id = chatId();
  balancer.prefer(0);
  const finished = [];
  const chat = newChat({ id, requester, onFinish: (event) => finished.push(event) });
  const sending = chat.sendMessage({ text: PROMPT });
  await until('the answer to start', () => text(answer(chat)).length > 200);

  // A second screen follows the same answer through the other replica.
  balancer.prefer(1);
  const watching = await transport(requester).reconnectToStream({ chatId: id });
  assert.ok(watching, 'a running turn to follow');
  const watched = [];
  const reading = (async () => {
    for await (const chunk of watching) watched.push(chunk);
  })();
  await until('the second screen to catch up', () => watched.some((c) => c.type === 'text-delta'));

  // The AI SDK's pattern for a resumable chat: the stop endpoint, then stop().
  const stopped = await api(`/ai-sdk/chat/${id}/stop`, requester, STOP);
  assert.equal(stopped.status, 204);
  await chat.stop();
  await sending;
  await reading;
  assert.equal(watched.at(-1).type, 'abort', 'the second screen is told the answer was stopped');
  // The stopping page's own onFinish says it was stopped, as after any stop().
  assert.equal(finished.length, 1);
  assert.equal(finished[0].isAbort, true, 'onFinish reports the stop');
  assert.equal(finished[0].isError, false);

  const status = await (await api(`/chat/stream/status?session_id=${id}`, requester)).json();
  assert.equal(status.status, 'cancelled');
  const turn = await transcript(id, requester);
  assert.equal(turn.conversation.last_turn_status, 'cancelled');
  const partial = turn.messages.at(-1).content;
  assert.ok(partial.length > 0 && partial.length < REFERENCE.length, 'a partial answer');
  assert.ok(REFERENCE.startsWith(partial), 'kept as it was written');

  // Nothing runs any more: a reconnect resumes nothing, a second stop is harmless.
  await chat.resumeStream();
  assert.equal(chat.status, 'ready');
  const again = await api(`/ai-sdk/chat/${id}/stop`, requester, STOP);
  assert.equal(again.status, 204);
});
