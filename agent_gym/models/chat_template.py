"""The Qwen2.5-style chat template, and token-level rendering of whole contexts and of context deltas.

The rollout never re-encodes model output (Agent-R1 issue #30): it renders the *new* messages of a turn
(tool responses, feedback) as a delta appended after the exact tokens the model sampled. `render_delta`
derives that delta from the tokenizer's own chat template, so the same code serves our locally built
models and real Qwen2.5 checkpoints.

Message contents are text, never markup: a tool result holding "<|im_end|>\n<|im_start|>user" must not open a
turn in the model's context. Contents are located in the rendering (each is rendered as a sentinel first) and
encoded with special-token strings as plain text; only the template's own markers become special ids.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_gym.error import AgentGymError

# Qwen2.5-Instruct's template (tools rendered into the system turn, tool messages folded into a user turn
# wrapped in <tool_response>), minus its default "You are Qwen" system prompt.
QWEN25_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
        or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Stand-ins used to locate the template's text around one assistant message.
_PLACEHOLDER_USER = "agent-gym-placeholder-user"
_PLACEHOLDER_ASSISTANT = "agent-gym-placeholder-assistant"
_SUFFIX_CACHE: dict[str, str] = {}  # chat template -> its assistant turn suffix, rendered once
# Private-use characters around an index: what each message's content is rendered as to find where it lands.
_SENTINEL = "\ue000agent-gym-content-{}\ue001"
_SENTINEL_PATTERN = re.compile("\ue000agent-gym-content-(\\d+)\ue001")


class ChatTemplateError(AgentGymError, ValueError):
    """The tokenizer has no chat template, or its template cannot render the given messages."""


def _render_text(
    tokenizer: Any,
    messages: Sequence[dict],
    tools: Sequence[dict] | None,
    add_generation_prompt: bool,
) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            "the tokenizer has no chat_template; build the model with `agent-gym model init` or set "
            "tokenizer.chat_template (agent_gym.models.chat_template.QWEN25_CHAT_TEMPLATE fits Qwen-style "
            "tokenizers)"
        )
    try:
        return tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    except Exception as error:  # jinja errors carry no type we can name
        raise ChatTemplateError(
            f"chat template failed to render {len(messages)} messages: {error}"
        ) from error


@dataclass(frozen=True)
class _Rendered:
    """A rendered context and the [start, end) spans of message contents in it."""

    text: str
    content_spans: tuple[tuple[int, int], ...]


def _render_marked(
    tokenizer: Any,
    messages: Sequence[dict],
    tools: Sequence[dict] | None,
    add_generation_prompt: bool,
) -> _Rendered:
    """Render `messages` and find where each message's content lands (see the module docstring).

    A template that does not copy a content verbatim (e.g. one that splits reasoning out of assistant turns)
    gets its assistant contents left unmarked; env messages must be copied verbatim.
    """
    text = _render_text(tokenizer, messages, tools, add_generation_prompt)
    for roles_left_alone in ((), ("assistant",)):
        contents: list[str] = []
        marked = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, str) and content and message.get("role") not in roles_left_alone:
                marked.append({**message, "content": _SENTINEL.format(len(contents))})
                contents.append(content)
            else:
                marked.append(message)
        rendered = _substitute(_render_text(tokenizer, marked, tools, add_generation_prompt), contents)
        if rendered.text == text:
            return rendered
    raise ChatTemplateError(
        "the chat template does not copy message contents verbatim; cannot tell env text from template markers"
    )


def _substitute(template_text: str, contents: Sequence[str]) -> _Rendered:
    pieces: list[str] = []
    spans: list[tuple[int, int]] = []
    length, position = 0, 0
    for match in _SENTINEL_PATTERN.finditer(template_text):
        pieces.append(template_text[position : match.start()])
        length += match.start() - position
        content = contents[int(match.group(1))]
        pieces.append(content)
        spans.append((length, length + len(content)))
        length += len(content)
        position = match.end()
    pieces.append(template_text[position:])
    return _Rendered("".join(pieces), tuple(spans))


def _special_token_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """Matches the special-token strings (those ``split_special_tokens`` encodes as text), longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    specials = {str(token) for token in decoder.values() if getattr(token, "special", False)}
    specials |= set(getattr(tokenizer, "all_special_tokens", ()) or ())
    if not specials:
        return None
    return re.compile("|".join(re.escape(token) for token in sorted(specials, key=len, reverse=True)))


def _encode_rendered(tokenizer: Any, rendered: _Rendered) -> list[int]:
    """Ids of a rendering: special-token strings outside contents become their ids, all other text is plain.

    Split only at the template's own special tokens, each piece encodes as the tokenizer would encode it in
    the whole text, so benign contexts get exactly the ids of ``tokenizer(text)``.
    """
    pattern = _special_token_pattern(tokenizer)
    if pattern is None:
        return encode_text(tokenizer, rendered.text)
    ids: list[int] = []
    position = 0
    spans = iter(rendered.content_spans)
    span = next(spans, None)
    for match in pattern.finditer(rendered.text):
        while span is not None and span[1] <= match.start():
            span = next(spans, None)
        if span is not None and span[0] < match.end() and match.start() < span[1]:
            continue  # inside a message's content: plain text
        if match.start() > position:
            ids += encode_plain_text(tokenizer, rendered.text[position : match.start()])
        ids.append(tokenizer.convert_tokens_to_ids(match.group()))
        position = match.end()
    if position < len(rendered.text):
        ids += encode_plain_text(tokenizer, rendered.text[position:])
    return ids


def turn_stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end a model turn: EOS, and Qwen2.5's ``<|endoftext|>`` where the vocabulary has it."""
    ids = {tokenizer.eos_token_id}
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(end_of_text, int) and end_of_text != tokenizer.unk_token_id:
        ids.add(end_of_text)  # Qwen2.5 ends turns with <|im_end|> or <|endoftext|>
    return sorted(i for i in ids if i is not None)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` with no BOS/EOS added (special-token strings become their single ids)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_plain_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` with special-token strings kept as plain text (e.g. "<|im_start|>" as its bytes).

    Added tokens that are not special (markup such as "<tool_call>" or "<answer>") stay single ids.
    """
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def render_prompt(
    tokenizer: Any,
    messages: Sequence[dict],
    tools: Sequence[dict] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of a whole context rendered with the tokenizer's chat template (contents as plain text)."""
    return _encode_rendered(tokenizer, _render_marked(tokenizer, messages, tools, add_generation_prompt))


def assistant_turn_suffix(tokenizer: Any) -> str:
    """The text the template writes after an assistant message's content (Qwen: "<|im_end|>\\n")."""
    template = getattr(tokenizer, "chat_template", None)
    if template in _SUFFIX_CACHE:
        return _SUFFIX_CACHE[template]
    messages = [
        {"role": "user", "content": _PLACEHOLDER_USER},
        {"role": "assistant", "content": _PLACEHOLDER_ASSISTANT},
    ]
    text = _render_text(tokenizer, messages, None, add_generation_prompt=False)
    position = text.rfind(_PLACEHOLDER_ASSISTANT)
    if position < 0:
        raise ChatTemplateError("the chat template does not render assistant content verbatim")
    _SUFFIX_CACHE[template] = text[position + len(_PLACEHOLDER_ASSISTANT) :]
    return _SUFFIX_CACHE[template]


def render_delta(
    tokenizer: Any,
    new_messages: Sequence[dict],
    model_ended_turn_with: str | None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Tokens that follow a sampled assistant turn: the turn's closing, the new messages, the next prompt.

    Args:
        tokenizer: a tokenizer with a chat template.
        new_messages: the messages the env appended after the assistant's turn (tool results, feedback).
        model_ended_turn_with: the decoded text of the model's last sampled token (e.g. "<|im_end|>" or
            "</tool_call>"); the part of the template's turn closing the model already produced is skipped.
        add_generation_prompt: append the prompt that opens the next assistant turn.
    """
    closing = assistant_turn_suffix(tokenizer)
    ended = (model_ended_turn_with or "").strip()
    if ended and closing.startswith(ended):
        closing = closing[len(ended) :]
    prefix = [
        {"role": "user", "content": _PLACEHOLDER_USER},
        {"role": "assistant", "content": _PLACEHOLDER_ASSISTANT},
    ]
    full = _render_marked(tokenizer, prefix + list(new_messages), None, add_generation_prompt)
    before = _render_text(tokenizer, prefix, None, add_generation_prompt=False)
    if not full.text.startswith(before):
        raise ChatTemplateError("the chat template is not prefix-stable; cannot render a context delta")
    shift = len(closing) - len(before)
    spans = tuple((start + shift, end + shift) for start, end in full.content_spans if start >= len(before))
    return _encode_rendered(tokenizer, _Rendered(closing + full.text[len(before) :], spans))
