"""The chat page in a real headless Chromium, against two real replicas on one store.

What a person evaluating tether does by hand: start a long answer, reload the
tab, open a second tab on the other replica, kill the producing replica, stop
an answer, and see the conversation in the list. Each step writes a screenshot
(``TETHER_SCREENSHOT_DIR``, else a temp dir), and each test checks the counters
of ``GET /metrics`` the step should move.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.browser import DESKTOP, PHONE, wait_for
from tests.support.metrics import moved, scrape
from tests.support.replicas import Replicas

PROMPT = "Tell me about rivers and the towns along them."
AGENT = "writer"
SLOW_AGENT = "slow-writer"
"""The writer at 250 chunks: a 10 s answer, time enough to queue behind it and
see the queue on a second tab (which polls every 2 s)."""
TENANT = "demo"
ENDED = ("done", "cancelled", "errored")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.processes,
    # 150 chunks at 25/s: a 6 s answer, long enough to reload, open a second
    # tab or kill its replica mid-way; one calculator call after 5 chunks.
    pytest.mark.replica_cluster(
        chunks_per_second=25,
        answer_chunks=150,
        tool_call_after_chunks=5,
        variants={SLOW_AGENT: {"answer_chunks": 250}},
        tool_log=True,
    ),
]


@pytest.fixture(scope="module", autouse=True)
def _chromium_first(browser: Any) -> Any:
    """Skip (or fail) for want of Chromium before starting any server."""
    return browser


@pytest.fixture(scope="module")
def reference(replica_cluster: Replicas) -> str:
    """The answer to PROMPT in a crash-free run, read over the API, not the page."""
    session = f"reference-{uuid.uuid4().hex[:8]}"
    response = httpx2.post(
        f"{replica_cluster.one.url}/chat/response?tenant={TENANT}",
        headers={"requester-uuid": "reference"},
        json=_turn(PROMPT, session),
        timeout=60,
    )
    assert response.status_code == 201, response.text
    text = str(response.json()["content"])
    assert len(text) > 1000
    return text


@pytest.fixture
def user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def context(browser: Any, user: str) -> Iterator[Any]:
    """A browser profile of one user: every tab in it shares its localStorage."""
    profile = browser.new_context(viewport=DESKTOP)
    # What the page keeps after someone typed their name and tenant once.
    settings = json.dumps({"user": user, "tenant": TENANT})
    profile.add_init_script(f"localStorage.setItem('tether.settings', {json.dumps(settings)})")
    yield profile
    profile.close()


# Records every answer bubble whose text went from something to nothing.
BLANK_WATCH = """
window.blanked = [];
const shown = new WeakMap();
new MutationObserver(() => {
  for (const node of document.querySelectorAll("li.message.bot .text")) {
    const text = node.textContent;
    if (shown.get(node) && !text) window.blanked.push(node.closest("li").dataset.messageId);
    shown.set(node, text);
  }
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


@dataclass
class ChatPage:
    """One tab of the chat page, and what a test reads off it."""

    page: Any
    shots: Path
    name: str
    errors: list[str] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def open(cls, context: Any, url: str, shots: Path, name: str) -> ChatPage:
        tab = cls(context.new_page(), shots, name)
        tab.page.on("pageerror", lambda error: tab.errors.append(str(error)))
        tab.goto(url)
        return tab

    def goto(self, url: str) -> None:
        self.page.goto(url)
        # The page is ready once it knows its agents (GET /web/config answered).
        self.page.wait_for_selector("#agent option[value]:not([value=''])", state="attached")

    def send(self, text: str) -> None:
        self.page.fill("#prompt", text)
        self.page.click("#send")

    def text(self) -> str:
        """The newest answer on the page, exactly as shown."""
        return str(
            self.page.evaluate(
                "() => { const all = document.querySelectorAll('li.message.bot .text');"
                " return all.length ? all[all.length - 1].textContent : ''; }"
            )
        )

    def state(self) -> str:
        return str(self.page.get_attribute("#status", "data-state"))

    def session_id(self) -> str:
        fragment = str(self.page.evaluate("() => location.hash"))
        assert fragment.startswith("#/c/"), fragment
        return fragment.removeprefix("#/c/")

    def shot(self, step: str) -> Path:
        path = self.shots / f"{self.name}-{next(self.counter):02d}-{step}.png"
        self.page.screenshot(path=str(path))
        return path

    def watch(self, within: float = 30.0) -> list[str]:
        """Every distinct text the answer showed until the turn ended."""
        seen: list[str] = []

        def ended() -> bool:
            text = self.text()
            if text and (not seen or seen[-1] != text):
                seen.append(text)
            return self.state() in ENDED

        wait_for(ended, within, f"{self.name}: the answer to end")
        final = self.text()
        if not seen or seen[-1] != final:
            seen.append(final)
        return seen

    def wait_growing(self, at_least: int, within: float = 15.0) -> str:
        return str(wait_for(lambda: len(self.text()) >= at_least and self.text(), within, "text"))


def _turn(content: str, session: str) -> dict[str, Any]:
    return {
        "agent_identifier": AGENT,
        "stateful": True,
        "session_id": session,
        "conversation": [{"sender": "user", "content": content}],
    }


def _only_grows(texts: list[str]) -> None:
    """Each text the page showed continues the one before: nothing repeated or lost."""
    for before, after in itertools.pairwise(texts):
        assert after.startswith(before), f"{before[-80:]!r} is not continued by {after[-80:]!r}"


def _conversation(url: str, user: str, session: str) -> dict[str, Any]:
    response = httpx2.get(
        f"{url}/conversations/{session}?tenant={TENANT}",
        headers={"requester-uuid": user},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_long_answer_streams_and_the_list_shows_it(
    replicas: Replicas, context: Any, screenshot_dir: Path, reference: str, user: str
) -> None:
    before = scrape(replicas.one.url)
    tab = ChatPage.open(context, replicas.one.url, screenshot_dir, "stream")
    assert tab.page.input_value("#user") == user
    tab.page.select_option("#agent", AGENT)
    tab.page.click("#new button")
    tab.shot("empty")
    tab.send(PROMPT)
    tab.page.wait_for_selector(".tool[data-status='running'], .tool[data-status='completed']")
    tab.wait_growing(300)
    tab.page.wait_for_selector(".tool[data-status='completed']")
    tab.shot("streaming")

    texts = tab.watch()
    assert tab.state() == "done", tab.page.inner_text("#status")
    assert len(texts) > 10, "the answer should be seen growing, not arrive at once"
    _only_grows(texts)
    assert texts[-1] == reference
    assert "Result:" in tab.page.inner_text(".tool[data-status='completed']")

    # The list shows the new conversation, newest first, with its last-turn status.
    session = tab.session_id()
    first = tab.page.locator("#conversations li").first
    wait_for(lambda: "done" in first.inner_text(), 5, "the list to say done")
    assert first.locator("a").get_attribute("href") == f"#/c/{session}"
    assert PROMPT[:20] in first.inner_text()
    tab.shot("done")
    assert not tab.errors

    after = scrape(replicas.one.url)
    assert moved(before, after, "tether_turns_started_total") == 1
    assert moved(before, after, "tether_turns_completed_total") == 1
    assert after.value("tether_turns_in_flight") == 0
    assert moved(before, after, "tether_checkpoint_bytes_count") >= 1
    assert moved(before, after, "tether_checkpoint_bytes_sum") > 0
    assert (
        moved(
            before,
            after,
            "tether_store_operation_seconds_count",
            store="recording",
            backend="sqlite",
        )
        >= 1
    )


def test_a_reload_mid_answer_carries_on_without_gap_or_repeat(
    replicas: Replicas, context: Any, screenshot_dir: Path, reference: str
) -> None:
    tab = ChatPage.open(context, replicas.one.url, screenshot_dir, "reload")
    attaches: list[dict[str, str]] = []
    tab.page.on(
        "request",
        lambda request: (
            attaches.append(request.headers)
            if request.method == "GET"
            and "/chat/stream/" in request.url
            and "status" not in request.url
            else None
        ),
    )
    tab.send(PROMPT)
    shown = tab.wait_growing(400)
    tab.shot("before-reload")

    tab.page.reload()
    # At once, before any new event: what the tab had shown (kept in sessionStorage).
    first = str(wait_for(tab.text, 5, "the answer to show after the reload"))
    assert first.startswith(shown)
    assert tab.state() not in ENDED, "the answer should still be running after the reload"
    tab.shot("after-reload")
    texts = [shown, first, *tab.watch()]
    assert tab.state() == "done"
    _only_grows(texts)
    assert texts[-1] == reference
    # It attached after the last event it had shown, not from the start.
    assert attaches and attaches[0].get("last-event-id", "").count(":") == 1
    assert not tab.errors


def test_a_second_tab_on_the_other_replica_shows_the_same_answer_growing(
    replicas: Replicas, context: Any, screenshot_dir: Path, reference: str
) -> None:
    first = ChatPage.open(context, replicas.one.url, screenshot_dir, "tab-one")
    first.send(PROMPT)
    first.wait_growing(100)
    session = first.session_id()

    second = ChatPage.open(context, f"{replicas.two.url}/#/c/{session}", screenshot_dir, "tab-two")
    second.page.set_viewport_size(PHONE)
    early = second.wait_growing(150)
    later = str(
        wait_for(lambda: len(second.text()) > len(early) + 100 and second.text(), 10, "growth")
    )
    assert first.state() == "streaming" and second.state() == "streaming"
    assert later.startswith(early)
    second.shot("growing-phone")
    first.shot("growing-desktop")

    texts_two = second.watch()
    texts_one = first.watch()
    _only_grows(texts_two)
    _only_grows(texts_one)
    assert texts_one[-1] == texts_two[-1] == reference
    # The second tab shows the user's message too, from the stored transcript.
    assert PROMPT in second.page.inner_text("li.message.user")
    assert not first.errors and not second.errors


def test_the_page_resumes_an_answer_whose_replica_was_killed(
    replicas: Replicas, context: Any, screenshot_dir: Path, reference: str
) -> None:
    tools_before = replicas.tool_runs()
    tab = ChatPage.open(context, replicas.one.url, screenshot_dir, "kill")
    tab.send(PROMPT)
    tab.page.wait_for_selector(".tool[data-status='completed']")
    shown = tab.wait_growing(500)
    session = tab.session_id()
    before = scrape(replicas.two.url)

    replicas.one.kill()  # SIGKILL, mid-answer: no drain, no goodbye
    wait_for(lambda: tab.state() == "reconnecting", 10, "the page to notice")
    tab.shot("replica-killed")

    # The load balancer would send the reload to a survivor; here we go there.
    tab.goto(f"{replicas.two.url}/#/c/{session}")
    # The survivor takes the turn over by itself within a second of it reading
    # dead, and the page attaches to it; or the page finds it dead first and
    # resumes it. Either way one producer carries the answer on.
    tab.shot("resumed")
    texts = [shown, *tab.watch()]
    assert tab.state() == "done", tab.page.inner_text("#status")
    _only_grows(texts[1:])
    assert texts[-1] == reference
    assert texts[-1].startswith(shown)
    # The completed tool call was not run again by the resume.
    assert replicas.tool_runs() - tools_before == 1
    tab.shot("resumed-done")
    assert not tab.errors

    after = scrape(replicas.two.url)
    assert moved(before, after, "tether_turns_resumed_total") == 1
    assert moved(before, after, "tether_takeovers_total") == 1
    automatic = moved(before, after, "tether_takeovers_total", cause="automatic")
    assert automatic == 1 or "resumed" in tab.page.inner_text("#notice")
    assert moved(before, after, "tether_turns_completed_total") == 1
    assert (
        _conversation(replicas.two.url, tab.page.input_value("#user"), session)["conversation"][
            "last_turn_status"
        ]
        == "complete"
    )


def test_stop_on_the_other_replica_cancels_the_answer(
    replicas: Replicas, context: Any, screenshot_dir: Path, user: str
) -> None:
    before = scrape(replicas.one.url)
    producer = ChatPage.open(context, replicas.one.url, screenshot_dir, "stop-one")
    producer.send(PROMPT)
    producer.wait_growing(100)
    session = producer.session_id()
    other = ChatPage.open(context, f"{replicas.two.url}/#/c/{session}", screenshot_dir, "stop-two")
    other.wait_growing(200)

    other.page.click("#stop")
    wait_for(lambda: other.state() == "cancelled", 10, "the stop to land")
    wait_for(lambda: producer.state() == "cancelled", 10, "the producer's tab to hear it")
    stopped = other.text()
    other.page.wait_for_timeout(1000)
    # Both tabs show the partial answer that was kept, and nothing more comes.
    assert other.text() == stopped == producer.text()
    assert len(stopped) >= 200
    assert "Stopped" in other.page.inner_text("li.message.bot")
    # Any moment the kept answer shows blank after the reload is a defect,
    # however briefly (it once did, until the transcript was read again).
    other.page.add_init_script(BLANK_WATCH)
    other.page.reload()
    other.page.wait_for_selector(f"#conversations li a[href='#/c/{session}']")
    wait_for(lambda: "stopped" in other.page.inner_text("#conversations"), 5, "the list")
    assert f"{AGENT} · stopped" in other.page.inner_text("#conversations")
    # The list and the transcript load separately after a reload.
    wait_for(lambda: other.text() != "", 5, "the transcript after the reload")
    wait_for(lambda: other.state() == "cancelled", 10, "the follower to read the end")
    assert other.page.evaluate("() => window.blanked") == []
    assert other.text() == stopped
    other.shot("stopped")
    transcript = _conversation(replicas.two.url, user, session)
    assert transcript["conversation"]["last_turn_status"] == "cancelled"
    assert transcript["messages"][-1]["content"] == stopped

    after = scrape(replicas.one.url)
    assert moved(before, after, "tether_turns_cancelled_total") == 1
    assert moved(before, after, "tether_fencing_rejections_total") == 1
    assert moved(before, after, "tether_turns_completed_total") == 0
    assert not producer.errors and not other.errors


def test_a_busy_conversation_attaches_instead_of_failing(
    replicas: Replicas, context: Any, screenshot_dir: Path, user: str, reference: str
) -> None:
    # A conversation the page has not seen a turn of (so it is not polling it),
    # busy with a turn another device started.
    session = f"busy-{uuid.uuid4().hex[:8]}"
    tab = ChatPage.open(context, f"{replicas.one.url}/#/c/{session}", screenshot_dir, "busy")
    # Only once the page has looked the conversation up and found nothing: had
    # the other device's turn created it first, the page would (rightly) poll,
    # find the turn and attach by itself, and Send would meet no 409 to handle.
    tab.page.wait_for_function(
        "() => document.getElementById('title').textContent === 'New conversation'"
    )
    elsewhere = threading.Thread(
        target=httpx2.post,
        args=(f"{replicas.two.url}/chat/stream?tenant={TENANT}",),
        kwargs={"headers": {"requester-uuid": user}, "json": _turn(PROMPT, session), "timeout": 60},
    )
    elsewhere.start()
    try:

        def running() -> bool:
            response = httpx2.get(
                f"{replicas.one.url}/chat/stream/status?tenant={TENANT}&session_id={session}",
                headers={"requester-uuid": user},
            )
            return response.status_code == 200 and response.json()["status"] == "running"

        wait_for(running, 10, "the other device's turn")
        tab.send("A question of my own")
        wait_for(lambda: "already being written" in tab.page.inner_text("#notice"), 5, "notice")
        assert tab.page.input_value("#prompt") == "A question of my own", "the draft is kept"
        tab.wait_growing(100)
        tab.shot("busy-attached")
        texts = tab.watch()
        assert tab.state() == "done"
        _only_grows(texts)
        assert texts[-1] == reference
        assert not tab.errors
    finally:
        elsewhere.join(60)


def _bubbles(tab: ChatPage) -> list[tuple[str, str]]:
    """Every message on the page, top to bottom: (who, text); a queued one is ``queued``."""
    return [
        (str(who), str(text))
        for who, text in tab.page.evaluate(
            "() => [...document.querySelectorAll('#transcript > li.message')].map(li => ["
            " li.classList.contains('queued') ? 'queued'"
            " : li.classList.contains('user') ? 'user' : 'bot',"
            " li.querySelector('.text').textContent])"
        )
    ]


def _queued(tab: ChatPage) -> list[str]:
    """The messages the page shows as queued (sent, and named by the server)."""
    return [
        str(text)
        for text in tab.page.evaluate(
            "() => [...document.querySelectorAll('#transcript > li.queued[data-turn] .text')]"
            ".map(node => node.textContent)"
        )
    ]


def _answers(tab: ChatPage) -> int:
    return int(tab.page.locator("#transcript > li.message.bot").count())


def test_messages_sent_while_an_answer_runs_are_queued_then_answered_in_order(
    replicas: Replicas, context: Any, screenshot_dir: Path, user: str
) -> None:
    tab = ChatPage.open(context, replicas.one.url, screenshot_dir, "queue")
    tab.page.select_option("#agent", SLOW_AGENT)
    tab.page.click("#new button")
    tab.send(PROMPT)
    tab.wait_growing(100)
    session = tab.session_id()
    other = ChatPage.open(context, f"{replicas.two.url}/#/c/{session}", screenshot_dir, "queue-two")
    other.wait_growing(150)
    # While an answer is being written, Send queues and Interrupt is offered.
    assert tab.page.is_visible("#interrupt") and tab.page.is_visible("#send-hint")
    assert tab.page.get_attribute("#prompt", "aria-describedby") == "send-hint"
    assert tab.page.is_enabled("#send")

    follow_ups = ["And the lakes?", "And the seas?", "Never mind this one."]
    for count, text in enumerate(follow_ups, start=1):
        tab.send(text)
        # Shown at once, marked queued, before the next is sent (arrival order).
        wait_for(lambda n=count: len(_queued(tab)) == n, 10, f"{text!r} to show queued")
    assert _queued(tab) == follow_ups
    assert tab.page.input_value("#prompt") == ""
    assert tab.state() == "streaming", "the first answer goes on"
    cancel = tab.page.locator("li.queued", has_text=follow_ups[2]).locator("button.cancel-queued")
    assert str(cancel.get_attribute("aria-label")).startswith("Cancel the queued message")
    tab.shot("queued")
    # Every tab of the conversation shows them (the other one on its next poll).
    wait_for(lambda: _queued(other) == follow_ups, 10, "the other tab to show the queue")

    cancel.click()
    wait_for(lambda: _queued(tab) == follow_ups[:2], 10, "the cancelled message to go")
    wait_for(lambda: _queued(other) == follow_ups[:2], 10, "the other tab to drop it")

    # The first answer ends; the next queued message is answered at once,
    # streaming, without a reload, on both tabs.
    for screen in (tab, other):
        wait_for(
            lambda screen=screen: _queued(screen) == follow_ups[1:2] and _answers(screen) == 2,
            30,
            f"{screen.name}: the first queued message to be answered",
        )
    before = tab.wait_growing(1)
    wait_for(lambda: len(tab.text()) > len(before) + 50, 10, "the second answer to grow")
    assert tab.state() == "streaming"
    assert [who for who, _ in _bubbles(tab)] == ["user", "bot", "user", "bot", "queued"]
    tab.shot("next-streaming")

    for screen in (tab, other):
        wait_for(
            lambda screen=screen: (
                not _queued(screen) and _answers(screen) == 3 and screen.state() == "done"
            ),
            60,
            f"{screen.name}: every queued message to be answered",
        )
    transcript = _conversation(replicas.two.url, user, session)["messages"]
    stored = [("user" if m["sender"] == "user" else "bot", m["content"]) for m in transcript]
    assert [text for who, text in stored if who == "user"] == [PROMPT, *follow_ups[:2]]
    assert [who for who, _ in stored] == ["user", "bot"] * 3
    assert all(text for who, text in stored if who == "bot")
    assert _bubbles(tab) == stored
    assert _bubbles(other) == stored
    tab.shot("all-answered")
    assert not tab.errors and not other.errors


def test_a_cancelled_queued_message_stays_gone_when_an_older_poll_answers_late(
    replicas: Replicas, context: Any, screenshot_dir: Path, user: str
) -> None:
    """The page polls the status every 2 s; a poll read before the cancel and
    answered after it still lists the cancelled message. It must not bring
    the message back (it did, with a Cancel button, until the next poll)."""
    tab = ChatPage.open(context, replicas.one.url, screenshot_dir, "late-poll")
    tab.page.select_option("#agent", SLOW_AGENT)
    tab.page.click("#new button")
    tab.send(PROMPT)
    tab.wait_growing(100)
    tab.send("Never mind this one.")
    wait_for(lambda: _queued(tab) == ["Never mind this one."], 10, "the message to show queued")

    # Each status poll is read from the server at once and answered when the
    # test says.
    polls: list[tuple[Any, Any]] = []
    tab.page.route("**/chat/stream/status*", lambda route: polls.append((route, route.fetch())))
    wait_for(lambda: tab.page.evaluate("() => true") and polls, 10, "the next status poll")
    stale_route, stale = polls[0]
    assert "Never mind this one." in stale.text(), "read before the cancel"

    tab.page.locator("li.queued button.cancel-queued").click()
    wait_for(lambda: _queued(tab) == [], 10, "the cancelled message to go")
    stale_route.fulfill(response=stale)
    # The page asks again only once it has handled that answer.
    wait_for(lambda: tab.page.evaluate("() => true") and len(polls) > 1, 10, "the poll after")
    assert _queued(tab) == [], "the late answer brought the cancelled message back"
    for route, response in polls[1:]:
        route.fulfill(response=response)
    tab.page.unroute_all(behavior="ignoreErrors")
    assert not tab.errors


def test_interrupt_stops_the_answer_and_answers_the_new_message_now(
    replicas: Replicas, context: Any, screenshot_dir: Path, user: str
) -> None:
    tab = ChatPage.open(context, replicas.one.url, screenshot_dir, "interrupt")
    tab.send(PROMPT)
    # Past a recording flush (every 0.5 s): what an interrupt keeps is what
    # was recorded, as for any cancel.
    tab.wait_growing(300)
    session = tab.session_id()
    button = tab.page.locator("#interrupt")
    assert button.is_visible() and "Control+Enter" in str(button.get_attribute("aria-keyshortcuts"))

    tab.page.fill("#prompt", "Actually, tell me about lakes.")
    button.click()
    first = tab.page.locator("#transcript > li.message.bot").first
    wait_for(lambda: "Interrupted" in first.inner_text(), 10, "the answer to say interrupted")
    wait_for(lambda: _answers(tab) == 2 and tab.state() == "streaming", 10, "the new answer")
    tab.shot("interrupted")
    wait_for(lambda: _answers(tab) == 2 and tab.state() == "done", 30, "the new answer's end")
    assert not _queued(tab)

    transcript = _conversation(replicas.two.url, user, session)
    stored = [
        ("user" if m["sender"] == "user" else "bot", m["content"]) for m in transcript["messages"]
    ]
    assert [who for who, _ in stored] == ["user", "bot", "user", "bot"]
    assert stored[0][1] == PROMPT and stored[2][1] == "Actually, tell me about lakes."
    assert stored[1][1], "the interrupted answer keeps what it wrote"
    # The page shows what was kept of the interrupted answer, and the new one whole.
    assert _bubbles(tab) == stored
    assert transcript["conversation"]["last_turn_status"] == "complete"
    tab.shot("interrupt-done")
    # Reloaded, the interrupted answer still says it stopped: its transcript
    # answer carries the mark (``turn_cancelled``), not only this tab's memory.
    tab.page.reload()
    wait_for(lambda: _answers(tab) == 2, 10, "the transcript after the reload")
    stopped = tab.page.locator("#transcript > li.message.bot").first.locator(".turn-note")
    wait_for(lambda: stopped.inner_text() == "Stopped.", 10, "the interrupted answer's note")
    assert (
        tab.page.locator("#transcript > li.message.bot").nth(1).locator(".turn-note").inner_text()
        == ""
    )
    assert not tab.errors


REWINDING = (
    "Once upon a time there was a river.",
    "Once upon a time",  # shorter
    "Once upon a time there was a lake.",  # as long, other text
    "Once upon a time there was a river. It ran to the sea.",
)
"""The rewinder agent's answer, message by message (its ``steps.json``)."""

# Records each text the newest answer bubble showed, in order.
TEXT_WATCH = """
window.shownTexts = [];
new MutationObserver(() => {
  const all = document.querySelectorAll("li.message.bot .text");
  const text = all.length ? all[all.length - 1].textContent : "";
  if (text && window.shownTexts.at(-1) !== text) window.shownTexts.push(text);
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


def test_a_reloaded_tab_never_shows_an_answer_going_backwards(
    replicas: Replicas, context: Any, screenshot_dir: Path, tmp_path: Path
) -> None:
    """The rewinder's answer goes backwards twice after the tab was reloaded:
    the tab keeps showing what it showed, counts both updates on the bubble
    (``data-dropped``), and shows the answer once it extends that text."""
    (tmp_path / "steps.json").write_text(json.dumps(REWINDING))
    tab = ChatPage.open(context, replicas.one.url, screenshot_dir, "rewind")
    tab.page.select_option("#agent", "rewinder")
    tab.send(str(tmp_path))
    wait_for(lambda: tab.text() == REWINDING[0], 15, "the first text")

    # The tab comes back with what it showed (sessionStorage), and its stream
    # continues after the last event it showed.
    tab.page.add_init_script(TEXT_WATCH)
    tab.page.reload()
    wait_for(lambda: tab.text() == REWINDING[0], 10, "the text after the reload")

    def dropped() -> str:
        return str(
            tab.page.evaluate(
                "() => { const all = document.querySelectorAll('li.message.bot');"
                " return all.length ? all[all.length - 1].dataset.dropped ?? '0' : '0'; }"
            )
        )

    for gate, count in ((1, "1"), (2, "2")):
        (tmp_path / f"go-{gate}").touch()
        wait_for(lambda count=count: dropped() == count, 15, f"update {gate + 1} to be dropped")
    assert tab.text() == REWINDING[0]
    (tmp_path / "go-3").touch()
    wait_for(lambda: tab.state() == "done", 15, "the answer to end")
    tab.shot("rewound")
    assert tab.text() == REWINDING[3]
    shown = tab.page.evaluate("() => window.shownTexts")
    _only_grows(shown)
    assert shown[-1] == REWINDING[3] and dropped() == "2"
    assert not tab.errors
