"""ctxkeep's LangChain integration: prune_messages against trim_messages' own contract,
the chat history on every store, and a v1 agent run through ContextMiddleware.

The trim tests are langchain-core 1.8.3's own (``tests/unit_tests/messages/test_utils.py``)
where they are about the contract, run against ``prune_messages``; the partial-message ones
are replaced by the refusal of ``allow_partial``. Every model here is a real LangChain
``BaseChatModel`` that scripts its replies and records what it is sent.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("langchain")

from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain_core._api.deprecation import LangChainDeprecationWarning
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
    message_to_dict,
    trim_messages,
)
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import Runnable
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from conftest_services import (
    STORES,
    fresh_store_url,
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep import MemoryConfig, Message, get_counter, is_valid_sequence, open_memory
from ctxkeep.artifacts import MemoryArtifactStore
from ctxkeep.episodic import open_episodic, parse_prior_context
from ctxkeep.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
    MissingToolResultError,
    UnknownRoleError,
)
from ctxkeep.integrations.langchain import (
    ContextMiddleware,
    CtxkeepChatMessageHistory,
    from_ctxkeep_messages,
    prune_messages,
    to_ctxkeep_messages,
)

__all__ = [
    "postgres_schema_factory",
    "postgres_url",
    "redis_prefix_factory",
    "redis_url",
]  # fixtures, re-exported for pytest

COUNTER = get_counter("o200k_base")


_TOKENS: dict[str, int] = {}


def exact_tokens(messages: list[BaseMessage]) -> int:
    """Tokens of a prompt counted independently of the integration's own conversion:
    LangChain's OpenAI form of each message, counted by ctxkeep's exact o200k counter (per
    message, cached by the message's value; a prompt adds the reply priming).
    """
    total = COUNTER.count_messages([])
    for m in messages:
        key = json.dumps(message_to_dict(m), sort_keys=True, default=str)
        n = _TOKENS.get(key)
        if n is None:
            n = _TOKENS[key] = COUNTER.count_message(
                Message.from_openai(convert_to_openai_messages(m))
            )
        total += n
    return total


def valid(messages: list[BaseMessage]) -> bool:
    return is_valid_sequence(convert_to_openai_messages(messages))


# -- trim_messages' contract ---------------------------------------------------------------


def dummy_token_counter(messages: list[BaseMessage]) -> int:
    # langchain-core's own: 3 + 4 + 3 = 10 tokens a string message, 4 more a block.
    count = 0
    for msg in messages:
        if isinstance(msg.content, str):
            count += 3 + 4 + 3
        if isinstance(msg.content, list):
            count += 3 + len(msg.content) * 4 + 3
    return count


_MESSAGES_TO_TRIM = [
    SystemMessage("This is a 4 token text."),
    HumanMessage("This is a 4 token text.", id="first"),
    AIMessage(
        [
            {"type": "text", "text": "This is the FIRST 4 token block."},
            {"type": "text", "text": "This is the SECOND 4 token block."},
        ],
        id="second",
    ),
    HumanMessage("This is a 4 token text.", id="third"),
    AIMessage("This is a 4 token text.", id="fourth"),
]
_MESSAGES_TO_TRIM_COPY = [m.model_copy(deep=True) for m in _MESSAGES_TO_TRIM]


def test_first_30_keeps_the_oldest_that_fit() -> None:
    actual = prune_messages(
        _MESSAGES_TO_TRIM, max_tokens=30, token_counter=dummy_token_counter, strategy="first"
    )
    assert actual == [
        SystemMessage("This is a 4 token text."),
        HumanMessage("This is a 4 token text.", id="first"),
    ]
    assert _MESSAGES_TO_TRIM == _MESSAGES_TO_TRIM_COPY


def test_first_30_end_on_human() -> None:
    actual = prune_messages(
        _MESSAGES_TO_TRIM,
        max_tokens=30,
        token_counter=dummy_token_counter,
        strategy="first",
        end_on="human",
    )
    assert actual == _MESSAGES_TO_TRIM[:2]
    assert _MESSAGES_TO_TRIM == _MESSAGES_TO_TRIM_COPY


def test_last_30_include_system() -> None:
    kwargs: dict[str, Any] = {
        "max_tokens": 30,
        "include_system": True,
        "token_counter": dummy_token_counter,
        "strategy": "last",
    }
    expected = [
        SystemMessage("This is a 4 token text."),
        HumanMessage("This is a 4 token text.", id="third"),
        AIMessage("This is a 4 token text.", id="fourth"),
    ]
    assert trim_messages(_MESSAGES_TO_TRIM, **kwargs) == expected
    assert prune_messages(_MESSAGES_TO_TRIM, **kwargs) == expected
    assert _MESSAGES_TO_TRIM == _MESSAGES_TO_TRIM_COPY


def test_last_30_without_include_system_drops_the_leading_system_message() -> None:
    kwargs: dict[str, Any] = {"max_tokens": 30, "token_counter": dummy_token_counter}
    expected = trim_messages(_MESSAGES_TO_TRIM, include_system=False, **kwargs)
    assert prune_messages(_MESSAGES_TO_TRIM, include_system=False, **kwargs) == expected
    assert expected == _MESSAGES_TO_TRIM[3:]


def test_without_include_system_the_leading_system_message_stays_when_all_fits() -> None:
    out = prune_messages(
        _MESSAGES_TO_TRIM, max_tokens=54, token_counter=dummy_token_counter, include_system=False
    )
    assert out == _MESSAGES_TO_TRIM


def test_last_30_include_system_end_on_human() -> None:
    kwargs: dict[str, Any] = {
        "max_tokens": 30,
        "token_counter": dummy_token_counter,
        "include_system": True,
        "end_on": "human",
    }
    expected = trim_messages(_MESSAGES_TO_TRIM, **kwargs)
    assert expected == [_MESSAGES_TO_TRIM[0], _MESSAGES_TO_TRIM[3]]
    assert prune_messages(_MESSAGES_TO_TRIM, **kwargs) == expected
    assert _MESSAGES_TO_TRIM == _MESSAGES_TO_TRIM_COPY


def test_last_30_include_system_start_on_human() -> None:
    kwargs: dict[str, Any] = {
        "max_tokens": 30,
        "token_counter": dummy_token_counter,
        "include_system": True,
        "start_on": "human",
    }
    expected = [
        SystemMessage("This is a 4 token text."),
        HumanMessage("This is a 4 token text.", id="third"),
        AIMessage("This is a 4 token text.", id="fourth"),
    ]
    assert trim_messages(_MESSAGES_TO_TRIM, **kwargs) == expected
    assert prune_messages(_MESSAGES_TO_TRIM, **kwargs) == expected
    assert _MESSAGES_TO_TRIM == _MESSAGES_TO_TRIM_COPY


def test_start_on_drops_what_comes_before_the_first_match() -> None:
    messages = [
        HumanMessage(content="First human message"),
        AIMessage(content="AI response"),
        HumanMessage(content="Second human message"),
    ]
    copied = [m.model_copy(deep=True) for m in messages]
    result = prune_messages(
        messages, max_tokens=20, token_counter=dummy_token_counter, start_on="human"
    )
    assert result == [messages[2]]
    assert messages == copied


def test_exact_token_boundary() -> None:
    messages = [
        SystemMessage(content="10 tokens exactly."),
        HumanMessage(content="Another 10 tokens."),
    ]
    first = prune_messages(
        messages, max_tokens=10, token_counter=dummy_token_counter, strategy="first"
    )
    assert first == messages[:1]
    both = prune_messages(messages, max_tokens=20, token_counter=dummy_token_counter)
    assert both == messages
    assert all(a is b for a, b in zip(both, messages, strict=True))


def test_exact_budget_with_the_exact_counter_fits_and_one_less_does_not() -> None:
    messages = [SystemMessage("be brief"), HumanMessage("a question"), AIMessage("an answer")]
    n = exact_tokens(messages)
    assert prune_messages(messages, max_tokens=n) == messages
    fewer = prune_messages(messages, max_tokens=n - 1)
    assert fewer == [messages[0], messages[1]]
    assert exact_tokens(fewer) <= n - 1


def test_newest_human_message_is_never_dropped_but_refused_clearly() -> None:
    messages = [SystemMessage("system " * 20), HumanMessage("question " * 20)]
    with pytest.raises(BudgetExceededError, match="over"):
        prune_messages(messages, max_tokens=10, compress_threshold=None)


def test_invoke_equals_the_direct_call() -> None:
    runnable = prune_messages(max_tokens=30, token_counter=dummy_token_counter)
    assert isinstance(runnable, Runnable)
    assert runnable.invoke(_MESSAGES_TO_TRIM) == prune_messages(
        _MESSAGES_TO_TRIM, max_tokens=30, token_counter=dummy_token_counter
    )


def test_invoke_on_no_messages_gives_none() -> None:
    trimmer = prune_messages(max_tokens=10, token_counter=dummy_token_counter)
    assert trimmer.invoke([]) == []


def test_runnable_composes_in_a_chain() -> None:
    model = ScriptedChat(script=lambda msgs: AIMessage(f"saw {len(msgs)}"))
    chain = prune_messages(max_tokens=30, token_counter=dummy_token_counter) | model
    reply = chain.invoke(_MESSAGES_TO_TRIM)
    assert reply.content == "saw 3"


def test_message_like_inputs_are_accepted() -> None:
    out = prune_messages(
        [("system", "sys"), ("human", "hi"), {"role": "assistant", "content": "yo"}, "bye"],
        max_tokens=1000,
    )
    assert [type(m) for m in out] == [SystemMessage, HumanMessage, AIMessage, HumanMessage]


def test_approximate_shortcut_is_langchains_approximate_counter() -> None:
    messages = [
        SystemMessage("This is a test message"),
        HumanMessage("Another test message", id="first"),
        AIMessage("AI response here", id="second"),
    ]
    a = prune_messages(messages, max_tokens=25, token_counter="approximate")
    b = prune_messages(messages, max_tokens=25, token_counter=count_tokens_approximately)
    assert a == b
    assert count_tokens_approximately(a) <= 25


def test_model_token_counter_is_used_on_the_whole_output() -> None:
    model = CountingChat(script=lambda msgs: AIMessage("x"))
    out = prune_messages(_MESSAGES_TO_TRIM, max_tokens=3, token_counter=model.bind(foo="bar"))
    assert model.get_num_tokens_from_messages(out) <= 3
    assert out == [_MESSAGES_TO_TRIM[0], _MESSAGES_TO_TRIM[3], _MESSAGES_TO_TRIM[4]]


def test_per_message_counter_is_summed() -> None:
    def per_message(message: BaseMessage) -> int:
        return 10

    out = prune_messages(_MESSAGES_TO_TRIM, max_tokens=30, token_counter=per_message)
    assert out == [_MESSAGES_TO_TRIM[0], *_MESSAGES_TO_TRIM[3:]]


def test_len_counts_messages() -> None:
    assert len(prune_messages(_MESSAGES_TO_TRIM, max_tokens=3, token_counter=len)) == 3


def test_a_counter_that_is_not_additive_is_still_held_to_the_budget() -> None:
    def with_overhead(messages: list[BaseMessage]) -> int:  # grows faster than the sum
        return 10 * len(messages) + len(messages) ** 2

    out = prune_messages(_MESSAGES_TO_TRIM, max_tokens=40, token_counter=with_overhead)
    assert with_overhead(out) <= 40
    assert out[0] == _MESSAGES_TO_TRIM[0] and out[-1] == _MESSAGES_TO_TRIM[-1]


def test_bad_token_counter_is_a_typed_error() -> None:
    with pytest.raises(InvalidTypeError, match="token_counter"):
        prune_messages(max_tokens=10, token_counter={})


def test_unknown_encoding_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model or encoding"):
        prune_messages([HumanMessage("x")], max_tokens=10, token_counter="invalid")


def test_allow_partial_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="compresses"):
        prune_messages(_MESSAGES_TO_TRIM, max_tokens=40, allow_partial=True)


def test_start_on_with_strategy_first_is_refused() -> None:
    with pytest.raises(ConfigError, match="start_on is only valid with strategy='last'"):
        prune_messages(_MESSAGES_TO_TRIM, max_tokens=40, strategy="first", start_on="human")


# -- tool units, compression, conversion ------------------------------------------------------


def tool_turn(n: int, size: int, calls: int = 1) -> list[BaseMessage]:
    ids = [f"call_{n}_{k}" for k in range(calls)]
    out: list[BaseMessage] = [
        AIMessage(
            "",
            tool_calls=[{"name": "read", "args": {"path": f"f{n}"}, "id": i} for i in ids],
            id=f"ai{n}",
        )
    ]
    out += [
        ToolMessage(f"output {n}.{k} " + "lorem ipsum " * (size // 12), tool_call_id=i, id=i)
        for k, i in enumerate(ids)
    ]
    return out


def test_old_tool_output_is_compressed_losslessly_instead_of_dropped() -> None:
    store = MemoryArtifactStore()
    history: list[BaseMessage] = [SystemMessage("sys"), HumanMessage("go", id="h")]
    history += tool_turn(1, 20_000) + tool_turn(2, 200)
    history.append(AIMessage("done", id="end"))
    snapshot = copy.deepcopy(history)
    out = prune_messages(history, max_tokens=600, artifacts=store, preserve_last_n=2)
    assert history == snapshot
    assert valid(out) and exact_tokens(out) <= 600
    compressed = [m for m in out if m.response_metadata.get("ctxkeep", {}).get("compressed")]
    assert len(compressed) == 1
    ref = compressed[0].response_metadata["ctxkeep"]["artifact_ref"]
    assert store.get(ref) == history[3].content
    assert ref in compressed[0].content
    assert [m is h for m, h in zip(out, history, strict=True)] == [
        True, True, True, False, True, True, True,
    ]  # fmt: skip


def test_end_on_cuts_after_the_whole_unit() -> None:
    history = [HumanMessage("go", id="h"), *tool_turn(1, 100, calls=2), AIMessage("x", id="z")]
    out = prune_messages(history, max_tokens=10_000, end_on="tool")
    assert out == history[:4]
    assert valid(out)


def test_start_on_tool_starts_at_the_call_of_that_result() -> None:
    history = [HumanMessage("go", id="h"), *tool_turn(1, 100), AIMessage("x", id="z")]
    out = prune_messages(history, max_tokens=10_000, start_on="tool")
    assert out == history[1:]


def test_damaged_history_is_repaired_not_sent_broken() -> None:
    history = [
        HumanMessage("go", id="h"),
        AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "lost"}], id="a"),
        HumanMessage("and?", id="h2"),
        ToolMessage("orphan", tool_call_id="nobody", id="t"),
    ]
    out = prune_messages(history, max_tokens=10_000)
    assert valid(out)
    synthetic = [m for m in out if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in synthetic] == ["lost"]
    assert synthetic[0].response_metadata["ctxkeep"]["synthetic"] is True


def lossless_cases() -> list[BaseMessage]:
    return [
        SystemMessage("rules", id="s", additional_kwargs={"__openai_role__": "developer"}),
        SystemMessage([{"type": "text", "text": "cached", "cache_control": {"type": "x"}}]),
        HumanMessage(
            ["plain string part", {"type": "image_url", "image_url": "https://x/y.png"}],
            id="h",
            name="ana",
        ),
        AIMessage(
            [{"type": "thinking", "thinking": "hmm", "signature": "sig"}, "text part"],
            tool_calls=[{"name": "f", "args": {"a": [1, 2], "b": "é"}, "id": "c1"}],
            id="a",
            response_metadata={"model_name": "m", "finish_reason": "tool_calls"},
            additional_kwargs={"refusal": None},
            usage_metadata={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
        ),
        ToolMessage(
            [{"type": "text", "text": "result"}],
            tool_call_id="c1",
            name="f",
            status="error",
            artifact={"rows": 3},
            id="t",
        ),
        AIMessageChunk("chunk", id="k"),
        ChatMessage("from a user", role="user", id="c"),
    ]


def test_conversion_round_trips_every_field() -> None:
    given = lossless_cases()
    snapshot = copy.deepcopy(given)
    back = from_ctxkeep_messages(to_ctxkeep_messages(given))
    assert back == given
    assert [type(m) for m in back] == [type(m) for m in given]
    assert given == snapshot


def test_a_history_read_builds_each_message_as_model_construct_does_without_calling_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A history read rebuilds each stored LangChain message from its record's data (every
    # field but the type) without model_construct's walk over the fields: what it makes must
    # be what model_construct makes, field order (repr) and fields set included.
    from ctxkeep.integrations.langchain import convert

    given = [m for m in lossless_cases() if m.type in convert._PLANS]
    assert {m.type for m in given} >= {"system", "human", "ai", "tool", "chat"}
    expected = [
        type(m).model_construct(**{k: v for k, v in m.model_dump().items() if k != "type"})
        for m in given
    ]

    def refused(*_: Any, **__: Any) -> Any:
        raise AssertionError("model_construct called")

    for m in given:
        monkeypatch.setattr(type(m), "model_construct", refused)
    built = [convert._from_record(m.type, m.model_dump()) for m in given]
    for made, want in zip(built, expected, strict=True):
        assert type(made) is type(want)
        assert made == want
        assert list(made.__dict__) == list(want.__dict__)
        assert repr(made) == repr(want)
        assert made.model_fields_set == want.model_fields_set
        assert made.__pydantic_extra__ == want.__pydantic_extra__
        assert made.__pydantic_private__ == want.__pydantic_private__
        assert made.model_dump() == want.model_dump()


def test_a_record_with_a_key_that_is_no_field_is_built_by_model_construct() -> None:
    from ctxkeep.integrations.langchain import convert

    data = HumanMessage("hi", id="h").model_dump()
    data["surprise"] = 1
    made = convert._from_record("human", dict(data))
    assert made.__pydantic_extra__ == {"surprise": 1}
    assert made == HumanMessage.model_construct(**{k: v for k, v in data.items() if k != "type"})


def test_conversion_gives_ctxkeep_what_it_counts() -> None:
    converted = to_ctxkeep_messages(lossless_cases())
    assert [m.role for m in converted] == [
        "developer", "system", "user", "assistant", "tool", "assistant", "user",
    ]  # fmt: skip
    assert converted[3].tool_calls[0].parsed_arguments() == {"a": [1, 2], "b": "é"}
    assert converted[2].content == [
        {"type": "text", "text": "plain string part"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
    ]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": None}]), InvalidMessageError),
        (FunctionMessage("x", name="f"), InvalidMessageError),
        (ChatMessage("x", role="wizard"), UnknownRoleError),
    ],
)
def test_messages_ctxkeep_cannot_represent_are_named(message: BaseMessage, error: type) -> None:
    with pytest.raises(error, match="message 1"):
        prune_messages([HumanMessage("hi"), message], max_tokens=100)


# -- properties: prune_messages versus trim_messages ------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[BaseMessage]:
    """A system prompt, then turns: a human message, tool rounds (parallel calls too), an
    answer; tool outputs of very different sizes.
    """
    out: list[BaseMessage] = [SystemMessage("You are a careful agent.")]
    n = 0
    for t in range(draw(st.integers(1, 4))):
        out.append(HumanMessage(f"task {t}: " + "please " * draw(st.integers(0, 20)), id=f"h{t}"))
        for _ in range(draw(st.integers(0, 3))):
            n += 1
            sizes = draw(st.lists(st.integers(10, 3000), min_size=1, max_size=3))
            ids = [f"c{n}_{k}" for k in range(len(sizes))]
            calls = [{"name": "grep", "args": {"n": n}, "id": i} for i in ids]
            out.append(AIMessage("", tool_calls=calls, id=f"a{n}"))
            out += [
                ToolMessage("match " * (s // 6), tool_call_id=i, id=f"t{i}")
                for s, i in zip(sizes, ids, strict=True)
            ]
        out.append(AIMessage("answer " * draw(st.integers(1, 30)), id=f"r{t}"))
    return out


def _must_keep(conv: list[BaseMessage]) -> int:
    last_human = max(i for i, m in enumerate(conv) if isinstance(m, HumanMessage))
    return exact_tokens([conv[0], conv[last_human]])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(conv=conversations(), share=st.floats(0.0, 1.0))
def test_prune_never_separates_tool_calls_and_never_exceeds_the_budget(
    conv: list[BaseMessage], share: float
) -> None:
    snapshot = copy.deepcopy(conv)
    total = exact_tokens(conv)
    low = _must_keep(conv) + 150  # room for the newest human message and a compressed unit
    budget = max(low, int(low + share * (total - low)))
    out = prune_messages(conv, max_tokens=budget)
    assert valid(out)
    assert exact_tokens(out) <= budget
    assert conv == snapshot
    kept_ids = {id(m) for m in conv}
    for m in out:  # a message either comes back as itself or as a compressed tool output
        assert id(m) in kept_ids or m.response_metadata["ctxkeep"]["compressed"]
    if total <= budget:
        assert out == conv


def _trim_breaks_pairs(conv: list[BaseMessage]) -> bool:
    budget = max(_must_keep(conv) + 150, exact_tokens(conv) // 2)
    trimmed = trim_messages(
        conv, max_tokens=budget, token_counter=exact_tokens, include_system=True
    )
    return not valid(trimmed)


def test_trim_messages_breaks_tool_pairs_where_prune_messages_does_not() -> None:
    example = find(
        conversations(),
        _trim_breaks_pairs,
        settings=settings(max_examples=500, database=None, deadline=None),
    )
    budget = max(_must_keep(example) + 150, exact_tokens(example) // 2)
    trimmed = trim_messages(
        example, max_tokens=budget, token_counter=exact_tokens, include_system=True
    )
    print("trim_messages sent:", [f"{type(m).__name__}:{m.id}" for m in trimmed])
    assert not valid(trimmed)  # the counterexample: a ToolMessage without its call
    assert isinstance(trimmed[1], ToolMessage)
    pruned = prune_messages(example, max_tokens=budget)
    assert valid(pruned) and exact_tokens(pruned) <= budget


# -- scripted chat models ------------------------------------------------------------------


class ScriptedChat(BaseChatModel):
    """Replies with ``script(messages)``; records each request's messages and tools."""

    script: Callable[[list[BaseMessage]], AIMessage]
    requests: list[tuple[list[BaseMessage], list[dict[str, Any]]]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.requests.append((list(messages), list(kwargs.get("tools", []))))
        return ChatResult(generations=[ChatGeneration(message=self.script(list(messages)))])

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


class CountingChat(ScriptedChat):
    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Any = None) -> int:
        return len(messages)


# -- chat message history ------------------------------------------------------------------


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_store_url(request, tmp_path, "history")


@pytest.fixture
def histories(store_url: str) -> Iterator[Callable[[str], CtxkeepChatMessageHistory]]:
    memory = open_memory(store_url)

    def make(session_id: str) -> CtxkeepChatMessageHistory:
        return CtxkeepChatMessageHistory(session_id, memory=memory)

    yield make
    memory.close()


def test_history_is_a_base_chat_message_history(
    histories: Callable[[str], CtxkeepChatMessageHistory],
) -> None:
    assert isinstance(histories("s"), BaseChatMessageHistory)
    assert histories("never-written").messages == []


def test_runnable_with_message_history_remembers_across_turns(
    histories: Callable[[str], CtxkeepChatMessageHistory],
) -> None:
    model = ScriptedChat(script=lambda msgs: AIMessage(f"reply to {msgs[-1].text}"))
    prompt = ChatPromptTemplate.from_messages(
        [("system", "be kind"), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    with pytest.warns(LangChainDeprecationWarning, match="RunnableWithMessageHistory"):
        chain = RunnableWithMessageHistory(
            prompt | model,
            histories,
            input_messages_key="question",
            history_messages_key="history",
        )
    cfg: Any = {"configurable": {"session_id": "chat-1"}}
    chain.invoke({"question": "one"}, config=cfg)
    chain.invoke({"question": "two"}, config=cfg)
    seen = [m.text for m in model.requests[-1][0]]
    assert seen == ["be kind", "one", "reply to one", "two"]
    stored = histories("chat-1").messages
    assert [m.text for m in stored] == ["one", "reply to one", "two", "reply to two"]
    assert [type(m) for m in stored] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    assert histories("other").messages == []


def test_history_gives_back_equal_messages_tool_units_included(
    histories: Callable[[str], CtxkeepChatMessageHistory],
) -> None:
    given = [m for m in lossless_cases() if not isinstance(m, SystemMessage)]
    given = [given[0], given[1], given[2], given[4], given[3]]  # the tool result follows its call
    h = histories("lossless")
    h.add_messages(given)
    assert h.messages == given
    h.add_message(AIMessage("more"))
    assert h.messages == [*given, AIMessage("more")]


def test_history_reads_are_new_objects_that_share_nothing_with_the_store(
    histories: Callable[[str], CtxkeepChatMessageHistory],
) -> None:
    given = [
        HumanMessage([{"type": "text", "text": "look"}], additional_kwargs={"k": [1]}),
        AIMessage("", tool_calls=[{"name": "f", "args": {"q": [1]}, "id": "c1"}]),
        ToolMessage([{"type": "text", "text": "found"}], tool_call_id="c1", artifact={"a": 1}),
    ]
    h = histories("owned")
    h.add_messages(copy.deepcopy(given))
    got = h.messages
    cast(list[Any], got[0].content)[0]["text"] = "changed"
    got[0].additional_kwargs["k"].append(2)
    cast(AIMessage, got[1]).tool_calls[0]["args"]["q"].append(2)
    cast(ToolMessage, got[2]).artifact["a"] = 2
    assert h.messages == given
    assert h.messages[0] is not h.messages[0]


def test_history_read_counts_as_an_access() -> None:
    now = [1000.0]
    memory = open_memory("memory://", MemoryConfig(session_ttl=60), clock=lambda: now[0])
    h = CtxkeepChatMessageHistory("touched", memory=memory)
    h.add_user_message("still here")
    for _ in range(3):
        now[0] += 40
        assert [m.text for m in h.messages] == ["still here"]
    memory.close()


def test_history_refuses_a_broken_tool_sequence_and_keeps_what_it_had(
    histories: Callable[[str], CtxkeepChatMessageHistory],
) -> None:
    h = histories("strict")
    h.add_messages([HumanMessage("go"), *tool_turn(1, 50)])
    before = h.messages
    with pytest.raises(MissingToolResultError):
        h.add_messages(
            [AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "x"}]), HumanMessage("?")]
        )
    assert h.messages == before


def test_history_async_variants(histories: Callable[[str], CtxkeepChatMessageHistory]) -> None:
    h = histories("async")

    async def scenario() -> tuple[list[BaseMessage], list[BaseMessage]]:
        await h.aadd_messages([HumanMessage("a"), AIMessage("b")])
        got = await h.aget_messages()
        await h.aclear()
        return got, await h.aget_messages()

    got, after = asyncio.run(scenario())
    assert [m.text for m in got] == ["a", "b"]
    assert after == []


def test_history_clear_then_add_starts_again(
    histories: Callable[[str], CtxkeepChatMessageHistory],
) -> None:
    h = histories("again")
    h.add_user_message("first")
    h.clear()
    assert h.messages == []
    h.add_ai_message("second")
    assert [m.text for m in h.messages] == ["second"]


def test_history_ttl_and_max_history_come_from_memory_config() -> None:
    now = [1000.0]
    memory = open_memory(
        "memory://", MemoryConfig(session_ttl=60, max_history=3), clock=lambda: now[0]
    )
    h = CtxkeepChatMessageHistory("ttl", memory=memory)
    h.add_messages([HumanMessage("q1"), AIMessage("a1"), HumanMessage("go"), *tool_turn(1, 10)])
    assert [type(m) for m in h.messages] == [HumanMessage, AIMessage, ToolMessage]
    now[0] += 61
    assert h.messages == []  # idle past the TTL: reclaimed
    h.add_user_message("back")
    assert [m.text for m in h.messages] == ["back"]
    memory.close()


def test_history_opens_a_url_itself(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'own.db'}"
    h = CtxkeepChatMessageHistory("own", url)
    h.add_user_message("kept on disk")
    h.close()
    again = CtxkeepChatMessageHistory("own", url)
    assert [m.text for m in again.messages] == ["kept on disk"]
    again.close()
    with pytest.raises(ConfigError, match="either url or memory"):
        CtxkeepChatMessageHistory("x", url, memory=open_memory("memory://"))


# -- ContextMiddleware on a create_agent run ---------------------------------------------------


def make_tools(rng: random.Random) -> list[Any]:
    @tool
    def read_file(path: str) -> str:
        """Read a file of the project."""
        words = ["alpha", "beta", "gamma", "delta", "error:", "line", "\n"]
        size = rng.randint(5_000, 20_000)
        text = f"{path}: "
        while len(text) < size:
            text += rng.choice(words) + " "
        return text

    @tool
    def search(query: str) -> str:
        """Search the project."""
        return f"3 hits for {query}"

    return [read_file, search]


def agent_script(steps: int) -> Callable[[list[BaseMessage]], AIMessage]:
    """Call tools for ``steps`` steps (every fifth a parallel pair), then answer."""
    done = [0]

    def script(messages: list[BaseMessage]) -> AIMessage:
        n = done[0]
        done[0] += 1
        if n >= steps:
            return AIMessage("The bug is in rounding; fixed.")
        calls = [{"name": "read_file", "args": {"path": f"src/m{n}.py"}, "id": f"call_{n}"}]
        if n % 5 == 0:
            calls.append({"name": "search", "args": {"query": f"q{n}"}, "id": f"call_{n}_s"})
        return AIMessage("", tool_calls=calls)

    return script


def test_agent_runs_50_steps_within_its_window_and_never_breaks_a_tool_sequence() -> None:
    window = 6_000
    model = ScriptedChat(script=agent_script(50))
    mw = ContextMiddleware(max_tokens=window)
    agent = create_agent(
        model, make_tools(random.Random(7)), system_prompt="You fix bugs.", middleware=[mw]
    )
    result = agent.invoke(
        {"messages": [HumanMessage("find the rounding bug")]}, config={"recursion_limit": 500}
    )
    assert len(model.requests) == 51
    for messages, tools in model.requests:
        tools_tokens = COUNTER.count_text(json.dumps(tools, ensure_ascii=False, sort_keys=True))
        assert exact_tokens(messages) + tools_tokens <= window
        assert valid(messages)
        assert isinstance(messages[0], SystemMessage) and messages[0].text == "You fix bugs."
        assert messages[1].text == "find the rounding bug"  # the task is never dropped
    last_messages, last_tools = model.requests[-1]
    assert mw.last_report is not None
    assert mw.last_report.tokens_sent == exact_tokens(last_messages) + COUNTER.count_text(
        json.dumps(last_tools, ensure_ascii=False, sort_keys=True)
    )
    state = result["messages"]
    assert sum(isinstance(m, ToolMessage) for m in state) == 60
    sent_chars = sum(len(m.text) for m in last_messages)
    assert sum(len(m.text) for m in state) > 20 * sent_chars  # the state keeps it all
    assert state[-1].text == "The bug is in rounding; fixed."


def test_agent_compressed_outputs_can_be_read_back_with_the_read_artifact_tool() -> None:
    mw = ContextMiddleware(max_tokens=6_000, compress_threshold=256)
    model = ScriptedChat(script=agent_script(6))
    tools = [*make_tools(random.Random(3)), mw.read_artifact]
    agent = create_agent(model, tools, middleware=[mw])
    result = agent.invoke({"messages": [HumanMessage("look")]}, config={"recursion_limit": 100})
    refs = [
        m.response_metadata["ctxkeep"]["artifact_ref"]
        for m in model.requests[-1][0]
        if isinstance(m, ToolMessage) and "ctxkeep" in m.response_metadata
    ]
    assert refs
    full = {m.content for m in result["messages"] if isinstance(m, ToolMessage)}
    text = mw.read_artifact.invoke({"ref": refs[0], "limit": 100_000})
    assert text in full


def test_agent_async_run_is_fitted_too() -> None:
    window = 5_000
    model = ScriptedChat(script=agent_script(8))
    agent = create_agent(
        model, make_tools(random.Random(1)), middleware=[ContextMiddleware(window)]
    )
    asyncio.run(agent.ainvoke({"messages": [HumanMessage("go")]}, config={"recursion_limit": 100}))
    assert len(model.requests) == 9
    for messages, tools in model.requests:
        tools_tokens = COUNTER.count_text(json.dumps(tools, ensure_ascii=False, sort_keys=True))
        assert exact_tokens(messages) + tools_tokens <= window and valid(messages)


def test_window_comes_from_the_model_profile() -> None:
    model = ScriptedChat(script=agent_script(3), profile={"max_input_tokens": 4_000})
    agent = create_agent(model, make_tools(random.Random(2)), middleware=[ContextMiddleware()])
    agent.invoke({"messages": [HumanMessage("go")]}, config={"recursion_limit": 100})
    for messages, tools in model.requests:
        tools_tokens = COUNTER.count_text(json.dumps(tools, ensure_ascii=False, sort_keys=True))
        assert exact_tokens(messages) + tools_tokens <= 4_000


def test_no_window_anywhere_is_a_config_error() -> None:
    agent = create_agent(ScriptedChat(script=agent_script(0)), [], middleware=[ContextMiddleware()])
    with pytest.raises(ConfigError, match="max_input_tokens"):
        agent.invoke({"messages": [HumanMessage("go")]})


def test_prior_context_is_injected_and_the_run_saved_as_an_episode() -> None:
    store = open_episodic("memory://", embedder="hash")
    store.save_episode(
        "old-run",
        "fix the invoice rounding bug",
        "Rounding must happen once per invoice, not per line item.",
    )
    mw = ContextMiddleware(max_tokens=8_000, episodic=store, agent_id="fixer")
    model = ScriptedChat(script=agent_script(3))
    agent = create_agent(model, make_tools(random.Random(5)), system_prompt="Fix.", middleware=[mw])
    agent.invoke(
        {"messages": [HumanMessage("the invoice rounding bug is back")]},
        config={"recursion_limit": 50, "configurable": {"thread_id": "run-2"}},
    )
    system = model.requests[0][0][0]
    assert isinstance(system, SystemMessage)
    assert system.text.startswith("Fix.\n\n### Prior Historical Context")
    headers, items = parse_prior_context(system.text[len("Fix.\n\n") :])
    assert headers == ["### Prior Historical Context"]
    assert "once per invoice" in items[0].text and items[0].session == "old-run"
    assert store.count() == 2
    saved = store.search("invoice rounding bug is back", top_k=5, filters={"agent_id": "fixer"})
    assert len(saved) == 1
    episode = saved[0].episode
    assert episode.task_goal == "the invoice rounding bug is back"
    assert episode.session_id == "run-2"
    assert "read_file x3" in episode.summary and "fixed" in episode.summary


def test_recall_gives_way_when_the_conversation_needs_the_room() -> None:
    store = open_episodic("memory://", embedder="hash")
    store.save_episode("old", "rounding bug", "rounding " * 400)
    model = ScriptedChat(script=agent_script(0))
    question = "rounding bug " + "detail " * 300
    n = exact_tokens([SystemMessage("Fix."), HumanMessage(question)])
    mw = ContextMiddleware(max_tokens=n + 20, episodic=store, save_episodes=False)
    agent = create_agent(model, [], system_prompt="Fix.", middleware=[mw])
    agent.invoke({"messages": [HumanMessage(question)]})
    assert model.requests[0][0][0].text == "Fix."
    assert mw.last_report is not None and mw.last_report.recalled == 0
    assert store.count() == 1


def test_middleware_rejects_bad_arguments() -> None:
    with pytest.raises(InvalidTypeError):
        ContextMiddleware(max_tokens="big")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ContextMiddleware(max_tokens=0)
    with pytest.raises(InvalidTypeError):
        ContextMiddleware(1000, episodic="memory://")  # type: ignore[arg-type]
