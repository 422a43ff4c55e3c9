"""Conversations as SFT data: chat turns (system, user, assistant, tool) in the chat-template convention.

A row's `messages` is a list of {role, content}. SFT's loss covers the assistant turns only
(`stages.train.model.conversation_example` finds their tokens through the tokenizer's chat template); the data build
deduplicates and decontaminates a conversation by its user turns, which is what an eval prompt could leak into.
A single-turn row (one user turn, one assistant turn) keeps its prompt-and-answer key, as every build before
conversations had it.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant", "tool")
Messages = list[dict[str, str]]


def check_messages(messages: Any) -> Messages:
    """The turns of one conversation as {role, content} dicts; a ValueError in one line names what is wrong. A
    conversation has a user turn and ends with an assistant turn (a turn after the last answer would carry no loss)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages is not a non-empty list of {role, content} turns")
    turns = []
    for i, turn in enumerate(messages):
        if not isinstance(turn, dict) or turn.get("role") not in ROLES or not isinstance(turn.get("content"), str):
            raise ValueError(f"turn {i}: not a {{role, content}} turn with role in {', '.join(ROLES)}")
        turns.append({"role": turn["role"], "content": turn["content"]})
    if not any(t["role"] == "user" for t in turns):
        raise ValueError("the conversation has no user turn")
    if turns[-1]["role"] != "assistant":
        raise ValueError(f"the conversation ends with a {turns[-1]['role']} turn, not an assistant turn")
    return turns


def single_turn(prompt: str, answer: str) -> Messages:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def user_text(messages: Messages) -> str:
    """The user turns, joined: what decontamination compares with eval prompts."""
    return "\n".join(t["content"] for t in messages if t["role"] == "user")


def dedup_text(messages: Messages) -> tuple[str, str]:
    """(prompt, response) that the duplicate filters compare: a single-turn row's prompt and answer; a
    conversation's user turns alone."""
    if [t["role"] for t in messages] == ["user", "assistant"]:
        return messages[0]["content"], messages[1]["content"]
    return user_text(messages), ""
