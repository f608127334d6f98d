"""Chats: validation, the system-role fallback and rendering with a
pre-filled assistant turn.

A chat is a list of ``{"role": ..., "content": ...}`` turns with roles
``system``, ``user`` and ``assistant``. When the last turn is an assistant
turn it is a *pre-fill*: the model continues that text. Rendering keeps the
pre-fill exactly as written (trailing spaces included, so ``"Answer: "``
stays ``"Answer: "``) and drops whatever the template appends after it
(end-of-turn tokens such as ``<|im_end|>``).

How the pre-fill is cut: the final assistant turn is rendered with a unique
marker appended to its content, and the text is cut where the marker
starts. This works for templates that ``trim`` their content (the pre-fill
is left untouched, the marker shields its end) and never depends on how a
template spells its end-of-turn tokens.

A pre-fill turn may instead ask for the rule of ReConnect's released code
(``{"role": "assistant", "content": "Answer: ", "cut": "end_of_turn"}``,
:data:`CUT_END_OF_TURN`): the turn is rendered as a *complete* assistant
message, as the template writes one (a template that trims content trims
it), and the prompt ends where the template's end-of-turn token begins:
that token and whatever the template writes after it (a newline) are cut,
nothing before it (:func:`render_closed_turn`). The end-of-turn text is
found by rendering the same turns with a marker as the final content.
Without a chat template the turn is the plain pre-fill.

Every chat is rendered through the template door,
:func:`rcn_fast._templates.chat_prompt` (the tokenizer's template, rendered
as transformers renders it, held to an allowlist and budgets in a worker
process under kernel limits); nothing here calls a tokenizer's own
``apply_chat_template``.

Models whose template has no system role (it raises, or drops the system
text) get the system instruction as user text: prepended to the first user
turn (separated by a blank line) when a user turn follows it directly, else
as a user turn of its own.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rcn_fast._templates import chat_prompt, chat_template_of

ROLES = ("system", "user", "assistant")
Chat = list[dict[str, str]]

_MARKER = "\u2063RCNFAST_PREFILL_END\u2063"
#: ``"cut"`` of a final assistant turn: render it complete and cut the template's end-of-turn token.
CUT_END_OF_TURN = "end_of_turn"


def validate_chats(chats: Any, name: str = "chats") -> list[Chat]:
    """Check ``chats`` is a list of chats (lists of role/content dicts).

    A single chat (a list of dicts) is a ValueError: the API is batch first.
    Returns plain lists of plain dicts (copies).
    """
    if isinstance(chats, (str, bytes)) or not isinstance(chats, Sequence):
        raise TypeError(f"{name}: expected a list of chats (lists of {{'role', 'content'}} dicts), got {type(chats).__name__}")
    out: list[Chat] = []
    for i, chat in enumerate(chats):
        if isinstance(chat, Mapping):
            raise ValueError(
                f"{name}[{i}]: expected a chat (a list of turns), got a dict; "
                f"wrap a single chat in a list: [chat]"
            )
        if isinstance(chat, (str, bytes)) or not isinstance(chat, Sequence):
            raise TypeError(f"{name}[{i}]: expected a list of turns, got {type(chat).__name__}")
        if len(chat) == 0:
            raise ValueError(f"{name}[{i}]: expected at least one turn, got an empty chat")
        turns: Chat = []
        for j, turn in enumerate(chat):
            if not isinstance(turn, Mapping) or "role" not in turn or "content" not in turn:
                raise TypeError(f"{name}[{i}][{j}]: expected a dict with 'role' and 'content', got {turn!r:.80}")
            role, content = turn["role"], turn["content"]
            if role not in ROLES:
                raise ValueError(f"{name}[{i}][{j}]['role']: expected one of {list(ROLES)}, got {role!r}")
            if not isinstance(content, str):
                raise TypeError(f"{name}[{i}][{j}]['content']: expected str, got {type(content).__name__}")
            if role == "system" and j != 0:
                raise ValueError(f"{name}[{i}][{j}]: a system turn must be the first turn")
            cut = turn.get("cut") if isinstance(turn, Mapping) else None
            if cut is not None and (cut != CUT_END_OF_TURN or role != "assistant" or j != len(chat) - 1):
                raise ValueError(f"{name}[{i}][{j}]['cut']: only a final assistant turn may carry "
                                 f"'cut': {CUT_END_OF_TURN!r}, got {cut!r} on a {role} turn")
            turns.append({"role": role, "content": content} if cut is None else
                         {"role": role, "content": content, "cut": cut})
        out.append(turns)
    return out


def split_prefill(chat: Chat) -> tuple[Chat, str | None]:
    """(turns before the pre-fill, pre-fill text or None)."""
    if chat[-1]["role"] == "assistant":
        return chat[:-1], chat[-1]["content"]
    return chat, None


def cuts_end_of_turn(chat: Chat) -> bool:
    """Whether the chat's final (assistant) turn asks for :func:`render_closed_turn`."""
    return bool(chat) and chat[-1].get("cut") == CUT_END_OF_TURN


def plain_turns(chat: Chat) -> Chat:
    """The turns as ``{role, content}`` only (what a template or a server is given)."""
    return [{"role": t["role"], "content": t["content"]} for t in chat]


def fold_system(chat: Chat) -> Chat:
    """The system-role fallback: the system text becomes user text."""
    if not chat or chat[0]["role"] != "system":
        return chat
    system, rest = chat[0]["content"], chat[1:]
    if rest and rest[0]["role"] == "user":
        merged = system + "\n\n" + rest[0]["content"] if system else rest[0]["content"]
        return [{"role": "user", "content": merged}, *rest[1:]]
    return [{"role": "user", "content": system}, *rest]


def template_supports_system(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders a system turn."""
    probe = "rcnfast-system-probe"
    try:
        text = chat_prompt(tokenizer, [{"role": "system", "content": probe}, {"role": "user", "content": "hi"}],
                           add_generation_prompt=True)
    except Exception:
        return False
    return probe in text


def has_chat_template(tokenizer: Any) -> bool:
    return chat_template_of(tokenizer) is not None


def render_plain(chat: Chat) -> str:
    """Rendering for tokenizers without a chat template (base models):
    ``"System: ...\\n\\nUser: ...\\n\\nAssistant: <pre-fill>"``."""
    turns, prefill = split_prefill(chat)
    names = {"system": "System", "user": "User", "assistant": "Assistant"}
    parts = [f"{names[t['role']]}: {t['content']}" for t in turns]
    parts.append("Assistant: " + (prefill or ""))
    return "\n\n".join(parts)


def render_chat(tokenizer: Any, chat: Chat, *, system_role: bool | None = None) -> str:
    """The prompt text for one chat (special tokens as text).

    Parameters
    ----------
    tokenizer : transformers tokenizer
        Its ``chat_template`` is used; without one, :func:`render_plain`.
    chat : list of dict
        Validated turns; a final assistant turn is a pre-fill.
    system_role : bool, optional
        Whether the template supports a system turn; probed when None.

    Returns
    -------
    str
        Ends with the generation prompt (no pre-fill) or with the pre-fill
        text exactly as given (no end-of-turn tokens after it); a pre-fill
        with ``"cut": "end_of_turn"`` ends as the template writes its
        content (:func:`render_closed_turn`: ``"Answer: "`` becomes
        ``"Answer:"`` under a template that trims content).
    """
    if not has_chat_template(tokenizer):
        return render_plain(chat)
    if system_role is None:
        system_role = template_supports_system(tokenizer)
    if not system_role:
        chat = fold_system(chat)
    if cuts_end_of_turn(chat):
        return render_closed_turn(tokenizer, plain_turns(chat))
    turns, prefill = split_prefill(plain_turns(chat))
    if prefill is None:
        return chat_prompt(tokenizer, turns, add_generation_prompt=True)
    marked = [*turns, {"role": "assistant", "content": prefill + _MARKER}]
    text = chat_prompt(tokenizer, marked)
    cut = text.rfind(_MARKER)
    if cut < 0:
        raise ValueError(
            "chats: the chat template dropped the pre-filled assistant turn; "
            "this model cannot continue a pre-filled answer"
        )
    # a template that trims content may drop the pre-fill's leading
    # whitespace; its trailing whitespace is protected by the marker
    return text[:cut]


def render_closed_turn(tokenizer: Any, chat: Chat) -> str:
    """The prompt of a chat whose final assistant turn is rendered complete
    and cut at the template's end-of-turn token (the rule of ReConnect's
    released code, ``"cut": "end_of_turn"``).

    The chat is rendered as a finished conversation; the template's text
    after an assistant turn's content (its end-of-turn token and, e.g., a
    newline) is found by rendering the same turns with a marker as the final
    content, and cut from the end. Whatever the template made of the turn's
    content stays: ``"Answer: "`` is ``"Answer:"`` under a template that
    trims content (Llama 3), ``"Answer: "`` under one that does not (ChatML).

    Raises
    ------
    ValueError
        The template ends the final turn otherwise than it ends the marked
        one (nothing is cut that is not the end-of-turn text).
    """
    turns, content = split_prefill(chat)
    if content is None:
        raise ValueError("chats: a chat to cut at the end of its final turn needs a final assistant turn")
    probe = chat_prompt(tokenizer, [*turns, {"role": "assistant", "content": _MARKER}])
    at = probe.rfind(_MARKER)
    if at < 0:
        raise ValueError("chats: the chat template dropped the final assistant turn; this model cannot score "
                         "an answer turn")
    tail = probe[at + len(_MARKER):]
    text = chat_prompt(tokenizer, [*turns, {"role": "assistant", "content": content}])
    if not text.endswith(tail):
        raise ValueError(f"chats: the chat template ends the answer turn otherwise than it ends a turn "
                         f"({text[-40:]!r} does not end with its end-of-turn text {tail!r}); cannot cut it")
    return text[:len(text) - len(tail)]
