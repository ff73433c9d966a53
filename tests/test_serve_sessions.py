"""What a session of the rollout server accepts as the reply it returned: each difference agent libraries
make when they re-send it (none can change the sampled tokens) extends the session, anything else starts a
new branch whose reason names the message and what differs."""

from __future__ import annotations

import json

import pytest

from srt_agent.agent.chat import added_turns_text, render_prompt
from srt_agent.agent.hermes import ChatFormat
from srt_agent.agent.trajectory import Trajectory
from srt_agent.serve.sessions import Session, Turn, message_difference, normalize_messages, reply_difference

STOP = "</code>"
REPLY = {"role": "assistant", "content": " Let me run it.\n<code>\nprint(6 * 7)\n"}  # as shown: the stop cut
CALLS = [
    {"id": "call_a", "type": "function", "function": {"name": "calc", "arguments": '{"a": 6, "b": [7, 1]}'}},
    {"id": "call_b", "type": "function", "function": {"name": "note", "arguments": "{}"}},
]
CALL_REPLY = {"role": "assistant", "content": "", "tool_calls": CALLS}


def normalized(message: dict) -> dict:
    return normalize_messages([message, {"role": "user", "content": "next"}])[0]


TOLERATED = {
    "as returned": dict(REPLY),
    "the stop string added back": {"role": "assistant", "content": REPLY["content"] + STOP},
    "stripped, then the stop string": {"role": "assistant", "content": (REPLY["content"] + STOP).strip()},
    "surrounding whitespace": {"role": "assistant", "content": "\n\n" + REPLY["content"].strip() + "  "},
    "text parts": {
        "role": "assistant",
        "content": [{"type": "text", "text": REPLY["content"][:9]}, {"type": "text", "text": REPLY["content"][9:]}],
    },
    "extra fields": {
        **REPLY,
        "name": "coder",
        "refusal": None,
        "reasoning_content": "I should compute.",
        "annotations": [],
        "audio": None,
        "tool_calls": None,
        "function_call": None,
    },
}


@pytest.mark.parametrize("case", list(TOLERATED))
def test_a_reply_resent_as_libraries_do_is_still_the_reply(case):
    assert reply_difference(normalized(TOLERATED[case]), REPLY, STOP) is None


def test_tool_calls_reserialized_with_new_ids_are_the_same_calls():
    resent = [
        {"id": "call_9", "function": {"arguments": '{"b":[7,1],"a":6}', "name": "calc"}},
        {"id": "call_8", "type": "function", "function": {"name": "note", "arguments": ""}},
    ]
    for content in (None, "", "  "):
        sent = normalized({"role": "assistant", "content": content, "tool_calls": resent})
        assert reply_difference(sent, CALL_REPLY) is None
    as_dict = [{"function": {"name": "calc", "arguments": {"a": 6, "b": [7, 1]}}}, resent[1]]
    assert reply_difference(normalized({"role": "assistant", "tool_calls": as_dict}), CALL_REPLY) is None


BRANCHING = {
    "an edited text": ({"role": "assistant", "content": REPLY["content"].replace("7", "8")}, REPLY, "text differs"),
    "text the model did not write added": (
        {"role": "assistant", "content": REPLY["content"] + STOP + "\nCalling tools:\n[...]"},
        REPLY,
        "text differs",
    ),
    "the stop string of no turn": ({"role": "assistant", "content": REPLY["content"] + "</answer>"}, REPLY, "text"),
    "inner whitespace": ({"role": "assistant", "content": REPLY["content"].replace("\n", " ")}, REPLY, "text"),
    "other arguments": (
        {"role": "assistant", "tool_calls": [{**CALLS[0], "function": {"name": "calc", "arguments": '{"a": 7}'}}]},
        CALL_REPLY,
        "tool calls differ",
    ),
    "a call dropped": ({"role": "assistant", "tool_calls": CALLS[:1]}, CALL_REPLY, "tool calls differ"),
    "another role": ({"role": "user", "content": REPLY["content"]}, REPLY, "a user message where"),
}


@pytest.mark.parametrize("case", list(BRANCHING))
def test_other_differences_are_named(case):
    sent, kept, expected = BRANCHING[case]
    why = message_difference(normalized(sent), kept, STOP)
    assert why is not None and expected in why


def test_messages_other_than_replies_must_be_sent_exactly():
    kept = {"role": "user", "content": "Add 2 and 3."}
    assert message_difference(normalized(dict(kept)), kept) is None
    assert "content differ" in message_difference(normalized({"role": "user", "content": "Add 2 and 3. "}), kept)
    assert "name differ" in message_difference(normalized({**kept, "name": "bob"}), kept)


@pytest.fixture(scope="module")
def held(smollm2_tokenizer):
    """A session after one turn that stopped on the stop string: its messages and tokens."""
    tok = smollm2_tokenizer
    opening = [{"role": "system", "content": "Write code."}, {"role": "user", "content": "What is 6 * 7?"}]
    prompt_ids = tok.encode(render_prompt(tok, opening), add_special_tokens=False)
    sampled = tok.encode(REPLY["content"] + STOP, add_special_tokens=False)
    session = Session("s")
    branch = Trajectory(request_id="srt-session-s-b0", task_index=0, sample_index=0, prompt_ids=prompt_ids)
    branch.append(sampled, [-0.5] * len(sampled))
    session.branches.append(branch)
    session.record_chat(Turn(branch.request_id, prompt_ids, [], True), opening, None, dict(REPLY), STOP)
    return tok, opening, session


def encoder(tok):
    return lambda text: tok.encode(text, add_special_tokens=False)


def test_a_resent_reply_extends_the_session_by_the_new_messages_only(held):
    tok, opening, session = held
    observation = {"role": "user", "content": "Observation:\n42"}
    sent = opening + [normalized(TOLERATED["stripped, then the stop string"]), observation]
    turn = session.plan_chat(ChatFormat.of(tok), sent, None, encoder(tok))
    assert not turn.new_branch and turn.reason is None and turn.kept == 3
    suffix = added_turns_text(tok, [observation], session.closed_by_eos)
    assert turn.forced_ids == encoder(tok)(suffix) and turn.prompt_ids == session.tokens + turn.forced_ids
    before = [dict(m) for m in session.messages]
    try:
        session.record_chat(turn, sent, None, {"role": "assistant", "content": "42"}, None)
        assert session.messages[2] == REPLY  # the session keeps the reply it returned, not the copy sent
        assert session.messages[3:] == [observation, {"role": "assistant", "content": "42"}]
    finally:
        session.messages, session.cut = before, {2: STOP}


def test_a_request_that_edits_history_branches_with_its_reason(held):
    tok, opening, session = held
    edited = opening + [{"role": "assistant", "content": "It is 43."}, {"role": "user", "content": "Sure?"}]
    turn = session.plan_chat(ChatFormat.of(tok), edited, None, encoder(tok))
    assert turn.new_branch and turn.request_id == "srt-session-s-b1"
    assert turn.reason.startswith("the messages do not extend the session's conversation: message 2:")
    assert turn.prompt_ids == encoder(tok)(render_prompt(tok, edited))
    other_tools = session.plan_chat(
        ChatFormat.of(tok), opening + [REPLY, {"role": "user", "content": "go"}], [{}], encoder(tok)
    )
    assert other_tools.new_branch and "tools differ" in other_tools.reason
    fewer = session.plan_chat(ChatFormat.of(tok), opening, None, encoder(tok))
    assert fewer.new_branch and "3 held" in fewer.reason
    json.dumps(turn.reason)
