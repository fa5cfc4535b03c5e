"""The VS Code extension end to end, in a real VS Code (code-server 4.100.3 = VS Code
1.100.3) in Debian's headless chromium, with the real server and the embedded model.

One session for the module, its cases in an order that works on it: cold start first,
reloads last. Needs ``tests/e2e/setup.sh`` once (the tests fail, not skip, without it:
CI must run them). README's third command runs them. Timeouts are generous bounds
against hangs on a loaded 2-core machine, not timings (benchmarks/vscode_editor.py has those).
On a failure the report's "e2e" section names a screenshot and has the server log's tail.
"""
from __future__ import annotations

import json
import re
import time

import pytest

from harness.vscode import EXTENSION_SRC, SetupMissing, VSCode

pytestmark = pytest.mark.e2e

FIRST_S = 180     # cold start: code-server, extension host, server, model, calibration
SUGGEST_S = 60    # a suggestion on the warm model
EVENT_S = 15      # an editor event reaching the server's database
INDENT = "    "   # the editor's indentation in Python (4 spaces)
HEADER_LINE = 13  # `def square_area(side):` in the workspace's geometry.py


def title(command: str) -> str:
    """The command palette's label of one of the extension's commands ("assistd: ...")."""
    for c in json.loads((EXTENSION_SRC / "package.json").read_text())["contributes"]["commands"]:
        if c["command"] == command:
            return f"{c['category']}: {c['title']}" if c.get("category") else c["title"]
    raise AssertionError(f"{command} is not in editors/vscode/package.json")


@pytest.fixture(scope="module")
def vscode(tmp_path_factory, artifacts):
    root = tmp_path_factory.mktemp("vscode")
    # No latency budget: the suggestion is the model's whole greedy line, however loaded
    # the machine, so that a word-by-word accept has more than one word to take.
    try:
        session = VSCode(root, {"assistd.maxLatencyMs": 0, "assistd.maxTokens": 24},
                         nice=5, shots=artifacts / "vscode")
    except SetupMissing as e:
        pytest.fail(f"e2e prerequisites missing: {e}", pytrace=False)
    try:
        session.open_workbench()
        yield session
    finally:
        session.close()


def offset(text: str, pos: dict) -> int:
    """An LSP position (ASCII text here, so UTF-16 units are characters) as an offset."""
    lines = text.split("\n")
    return sum(len(line) + 1 for line in lines[:pos["line"]]) + pos["character"]


def applied(text: str, item: dict) -> str:
    """``text`` with the inline item's insertText put over its range."""
    start, end = offset(text, item["range"]["start"]), offset(text, item["range"]["end"])
    return text[:start] + item["insertText"] + text[end:]


def wait_for(check, timeout_s: float):
    """check()'s first truthy value within timeout_s, else its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def python_acceptance(v: VSCode) -> dict:
    return v.user_acceptance().get("python", {})


def new_function(v: VSCode, header: str) -> str | None:
    """At the end of geometry.py, on a new empty line: ``header``, Enter; the ghost text
    after it (None when none came)."""
    v.empty_last_line()
    v.page.keyboard.type(f"\n{header}", delay=20)
    v.page.keyboard.press("Escape")  # whatever was suggested while typing the header
    v.page.keyboard.press("Enter")
    return v.wait_ghost(SUGGEST_S)


def test_first_suggestion_on_a_cold_start(vscode):
    """Enter after line 13's header on a cold model shows ghost text, the first answer comes
    from the "target", and the status bar item reads 'assistd'."""
    v = vscode
    # A keystroke made before the client has registered its provider gets no request
    # (VS Code asks again only at the next edit): wait for the server's `initialized`.
    # The model still loads after it, so the suggestion below waits for a cold model.
    assert v.wait_log(r"'initialized' received", FIRST_S), "the server did not start"
    v.open_file("geometry.py")
    v.goto_line(HEADER_LINE)
    v.page.keyboard.press("Enter")
    ghost = v.wait_ghost(FIRST_S)
    v.screenshot("01-first-suggestion")
    assert ghost, f"no ghost text {FIRST_S} s after Enter; answers: {v.requests_since(0)}"
    assert v.requests_since(0)[0] == "target"
    assert v.status_item() == "assistd", "the status bar item should say ready"


def test_accepted_text_is_indented_like_the_editor(vscode):
    """Tab writes the suggestion's first line on the line after `def square_area(side):`,
    indented by exactly 4 spaces."""
    v = vscode
    assert v.ghost().strip(), "needs the suggestion of the previous test on screen"
    item = v.last_item()
    v.page.keyboard.press("Tab")
    assert v.wait_no_ghost(5) or v.ghost() != item["insertText"]
    lines = v.saved_text().split("\n")
    v.screenshot("02-accepted")
    body = lines[HEADER_LINE]  # the line after the header (0-based index = 1-based header)
    assert lines[HEADER_LINE - 1] == "def square_area(side):"
    assert body.startswith(INDENT) and not body[len(INDENT)].isspace(), (
        f"the accepted line {body!r} should start with exactly {len(INDENT)} spaces")
    first_line = item["insertText"].lstrip("\n").split("\n")[0].strip()
    assert body.strip() == first_line


def test_tab_accepts_what_the_server_said_and_reports_it(vscode):
    """Tab leaves the file as the item's insertText applied over its range, sends executeCommand
    `assistd.accepted` with the item's arguments, and raises the python `accepted` count."""
    v = vscode
    accepted_before = python_acceptance(v).get("accepted", 0)
    ghost = new_function(v, "def cube_volume(side):")
    assert ghost, f"no suggestion after the header; answers: {v.requests_since(0)[-5:]}"
    item = v.last_item()
    before = v.saved_text()
    assert v.ghost().strip(), "saving hid the suggestion"
    v.page.keyboard.press("Tab")
    wait_for(lambda: v.ghost() != ghost, 5)
    after = v.saved_text()
    v.screenshot("03-tab")
    assert after == applied(before, item), "the file should hold the server's item"
    sid = item["command"]["arguments"][0]["id"]
    sent = v.trace("Sending request", "workspace/executeCommand")
    assert {"command": "assistd.accepted", "arguments": [item["command"]["arguments"][0]]} in sent
    assert wait_for(lambda: python_acceptance(v).get("accepted", 0) > accepted_before, EVENT_S), (
        f"the accept is not in the server's stats: {v.user_acceptance()}")


def test_ctrl_right_accepts_the_next_word_and_reports_it(vscode):
    """Ctrl+Right inserts only the first word, the rest stays ghost text; it sends
    didPartiallyAcceptCompletion (the id, acceptedLength > 0) and a `partial` is counted."""
    v = vscode
    ghost = new_function(v, "def triangle_area(base, height):")
    assert ghost, f"no suggestion after the header; answers: {v.requests_since(0)[-5:]}"
    item = v.last_item()
    before = v.saved_text()
    whole = applied(before, item)
    start = offset(before, item["range"]["start"])
    suggested = whole[start:len(whole) - (len(before) - offset(before, item["range"]["end"]))]
    assert len(suggested.split()) > 1, f"a one-word suggestion {suggested!r}: nothing to test"
    v.page.keyboard.press("Control+ArrowRight")  # the extension's assistd.acceptNextWord
    time.sleep(1)
    v.screenshot("04-next-word")
    rest = v.ghost()
    after = v.saved_text()
    # Only a prefix of the suggestion went in: its first word (and the space before it).
    inserted = after[start:len(after) - (len(before) - offset(before, item["range"]["end"]))]
    assert re.fullmatch(r"\s*\w+\s?", inserted), f"inserted {inserted!r} of {suggested!r}"
    assert suggested.startswith(inserted) and rest.strip(), "the rest should stay as ghost text"
    sid = item["command"]["arguments"][0]["id"]
    partial = wait_for(lambda: v.trace("Sending notification", "assistd/didPartiallyAcceptCompletion"), 5)
    assert partial and partial[-1]["id"] == sid and partial[-1]["acceptedLength"] > 0, partial
    assert wait_for(lambda: python_acceptance(v).get("partial", 0) >= 1, EVENT_S), (
        f"the partial accept is not in the server's stats: {v.user_acceptance()}")


def test_a_dismissed_suggestion_is_not_shown_again_there(vscode):
    """Escape sends didDismissCompletion {"id": ...}; typing 'x' then Backspace (the same place)
    gets a response without items, and no ghost text is shown."""
    v = vscode
    ghost = new_function(v, "def circle_perimeter(radius):")
    assert ghost, "no suggestion after the header"
    sid = v.last_item()["command"]["arguments"][0]["id"]
    v.page.keyboard.press("Escape")
    assert v.wait_no_ghost(5), "Escape did not hide the suggestion"
    asked = len(v.trace("Sending request", "textDocument/inlineCompletion"))
    v.page.keyboard.type("x")  # away and back: the same text before and after the cursor
    v.page.keyboard.press("Backspace")
    assert wait_for(lambda: len(v.trace("Received response", "textDocument/inlineCompletion"))
                    > asked, SUGGEST_S), "no request after the edit"
    time.sleep(1)
    v.screenshot("05-dismissed")
    assert not v.ghost().strip(), f"shown again where it was dismissed: {v.ghost()!r}"
    last = v.trace("Received response", "textDocument/inlineCompletion")[-1]
    assert not (last or {}).get("items"), f"served again where it was dismissed: {last}"
    # The server knows because the extension said so (before the next request).
    assert {"id": sid} in v.trace("Sending notification", "assistd/didDismissCompletion")


def test_tab_still_accepts_from_the_editors_completion_menu(vscode):
    """With no inline suggestion, Tab accepts from the editor's own Ctrl+Space menu:
    'area = rect' becomes 'area = rectangle_area'."""
    v = vscode
    v.empty_last_line()
    v.page.keyboard.type("area = rect", delay=20)
    v.page.keyboard.press("Escape")  # no inline suggestion on screen
    assert v.wait_no_ghost(5)
    v.page.keyboard.press("Control+Space")  # the editor's own menu (words of the file)
    v.page.wait_for_selector(".editor-widget.suggest-widget.visible", timeout=15_000)
    v.page.keyboard.press("Tab")
    time.sleep(0.5)
    v.screenshot("05-completion-menu")
    assert v.saved_text().split("\n")[-1] == "area = rectangle_area"


def test_show_stats_opens_a_read_only_document(vscode):
    """assistd.showStats opens a "stats" tab holding "ledger", "user_acceptance" (with "python")
    and "server", neither dirty nor Untitled; Ctrl+W closes it with no save dialog."""
    v = vscode
    v.page.keyboard.press("Escape")
    v.command(title("assistd.showStats"))
    v.page.wait_for_function("() => document.querySelector('.tab.active').textContent.includes('stats')",
                             timeout=15_000)
    tab = v.page.wait_for_selector(".tab.active")
    v.page.locator(".editor-group-container.active .monaco-editor").first.click()
    for key in ('"ledger": {', '"user_acceptance": {', '"server": {'):  # each top-level key
        v.page.keyboard.press("Control+f")
        v.page.keyboard.type(key)
        v.page.keyboard.press("Enter")
        v.page.keyboard.press("Escape")
        assert wait_for(lambda: key in (v.editor_lines() or ""), 10), f"no {key} in the stats"
        if key.startswith('"user_acceptance"'):
            v.screenshot("05-stats")
            assert '"python": {' in v.editor_lines(), v.editor_lines()
    assert "dirty" not in (tab.get_attribute("class") or ""), "the stats tab is an unsaved editor"
    assert "Untitled" not in tab.text_content()
    v.page.keyboard.press("Control+w")
    time.sleep(1)
    assert not v.page.query_selector(".monaco-dialog-box"), "closing the stats asked to save"


def settled(count, quiet_s: float = 1.5, timeout: float = 20) -> int:
    """``count()`` once it has stopped changing for ``quiet_s``: the client's trace is
    written asynchronously, so a request sent before a toggle may be logged after it."""
    last, since, end = count(), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < end:
        time.sleep(0.25)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return last


@pytest.mark.parametrize("toggle", ["assistd.toggle", "assistd.toggleLanguage"])
def test_toggle_turns_suggestions_off_and_on(vscode, toggle):
    """Off: status '$(circle-slash) assistd', no inlineCompletion request, no ghost text;
    toggled again: status 'assistd' and a suggestion after a new header."""
    v = vscode
    v.open_file("geometry.py")  # also when this test runs alone (-k toggle)
    v.command(title(toggle))
    assert wait_for(lambda: v.status_item() == "$(circle-slash) assistd", 10), v.status_item()
    v.page.locator(".editor-group-container.active .monaco-editor").first.click()
    v.page.keyboard.press("Control+End")
    v.page.keyboard.press("Enter")
    asked = settled(lambda: len(v.trace("Sending request", "textDocument/inlineCompletion")))
    v.page.keyboard.type(f"def off_{toggle[8:]}(side):\n", delay=20)
    time.sleep(3)
    assert not v.ghost().strip(), f"a suggestion while off: {v.ghost()!r}"
    # Off, the extension asks for nothing (assistd.enabled may be set per language,
    # which the server cannot see).
    assert len(v.trace("Sending request", "textDocument/inlineCompletion")) == asked
    v.command(title(toggle))
    assert wait_for(lambda: v.status_item() == "assistd", 10), v.status_item()
    v.page.locator(".editor-group-container.active .monaco-editor").first.click()
    assert new_function(v, f"def on_{toggle[8:]}(side):"), "no suggestion once back on"


def test_five_reloads_leave_one_server(vscode):
    """Each of five 'Developer: Reload Window' starts a new server that answers initialize;
    after them exactly one server process is alive."""
    v = vscode
    assert wait_for(lambda: len(v.server_pids()) == 1, 10), v.server_pids()
    for n in range(5):
        before = set(v.server_pids())
        started = len(v.trace("Received response", "initialize"))
        v.command("Developer: Reload Window")
        v.page.wait_for_selector(".monaco-workbench", timeout=120_000)
        # Up: a server process that was not there before has answered initialize.
        assert wait_for(lambda: len(v.trace("Received response", "initialize")) > started
                        and set(v.server_pids()) - before, 120), f"no new server after reload {n + 1}"
    alive = wait_for(lambda: len(v.server_pids()) == 1 and v.server_pids(), 30)
    v.screenshot("07-after-reloads")
    assert alive and len(alive) == 1, f"servers alive after 5 reloads: {v.server_pids()}"
