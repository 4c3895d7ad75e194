"""OpenAI chat completions: streaming, tool calls, cancellation; and server-side generation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import voluptuous as vol
from aiohttp import web

from fairlane.api.common import (
    CLIENT_TOKEN,
    DEADLINE_FIELD,
    PRIORITY_FIELD,
    PRIORITY_NAMES,
    ApiError,
    Services,
    chat_template,
    deadline_passed,
    read_json,
    refuse_early,
    refused,
    request_class,
    request_deadline,
    services_of,
)
from fairlane.api.grammars import Grammars
from fairlane.api.message_parts import read_parts
from fairlane.api.openapi import WHOLE, operation
from fairlane.api.remote import lane_for, remote_chat, remote_generate
from fairlane.api.response_format import WORDS_GRAMMAR
from fairlane.api.speculation import Guess, Owner, Speculation
from fairlane.engines.chat_template import ChatTemplateError, may_be_tool_call, parse_tool_calls
from fairlane.engines.llm import TokenEvent
from fairlane.engines.sampling import GRAMMAR_OVER_BUDGET, SamplingParams
from fairlane.policy import NO_WAIT_LIMIT, Kind, Priority, Request
from fairlane.runtime.device import LoopSink

# --- request validation ------------------------------------------------------------------------

_ROLES = vol.In(["system", "developer", "user", "assistant", "tool"])
# Content parts are checked by kind in `read_parts`, which can say what is wrong with each.
_CONTENT = vol.Any(None, str, [vol.Schema({vol.Required("type"): str}, extra=vol.ALLOW_EXTRA)])
MESSAGE = vol.Schema(
    {
        vol.Required("role"): _ROLES,
        vol.Optional(
            "content",
            description="a string, or parts: text, and file (file.file_data a base64 data URL "
            "of text, Markdown, HTML or PDF; its text is extracted); image and audio parts are "
            "refused with a 400",
        ): _CONTENT,
        vol.Optional("name"): str,
        vol.Optional("tool_calls"): vol.Any(
            None,
            [
                vol.Schema(
                    {
                        vol.Required("function"): vol.Schema(
                            {vol.Required("name"): str}, extra=vol.ALLOW_EXTRA
                        )
                    },
                    extra=vol.ALLOW_EXTRA,
                )
            ],
        ),
        vol.Optional("tool_call_id"): str,
    },
    extra=vol.ALLOW_EXTRA,
)
CHAT_REQUEST = vol.Schema(
    {
        vol.Required("messages"): vol.All([MESSAGE], vol.Length(min=1, msg="must not be empty")),
        vol.Optional("model"): str,
        vol.Optional("stream", default=False): bool,
        vol.Optional("stream_options"): vol.Any({vol.Optional("include_usage"): bool}, None),
        vol.Optional("max_tokens"): vol.Any(vol.All(WHOLE, vol.Range(min=1)), None),
        vol.Optional("max_completion_tokens"): vol.Any(vol.All(WHOLE, vol.Range(min=1)), None),
        vol.Optional("temperature"): vol.Any(
            vol.All(vol.Coerce(float), vol.Range(min=0, max=2)), None
        ),
        vol.Optional("top_p"): vol.Any(
            vol.All(vol.Coerce(float), vol.Range(min=0, max=1, min_included=False)), None
        ),
        vol.Optional("top_k"): vol.Any(vol.All(WHOLE, vol.Range(min=0)), None),
        vol.Optional("seed"): vol.Any(WHOLE, None),
        vol.Optional("stop"): vol.Any(str, vol.All([str], vol.Length(max=4)), None),
        vol.Optional("n"): vol.Any(
            vol.All(WHOLE, vol.Range(min=1, max=1, msg="only n=1 is supported")), None
        ),
        vol.Optional("user", description="the household member (fairness)"): vol.Any(str, None),
        vol.Optional("tools"): vol.Any(
            [
                {
                    vol.Required("type"): "function",
                    vol.Required("function"): {
                        vol.Required("name"): str,
                    },
                }
            ],
            None,
        ),
        vol.Optional(
            "tool_choice",
            description="auto (the default), none, required, or {type: function, function: "
            "{name}}; with a Qwen-format model a tool call is sampled under a grammar of the "
            "tools' names and argument schemas (required or a name: from the first token)",
        ): vol.Any(
            vol.In(["auto", "none", "required"]),
            vol.Schema(
                {
                    vol.Required("type"): "function",
                    vol.Required("function"): vol.Schema(
                        {vol.Required("name"): str}, extra=vol.ALLOW_EXTRA
                    ),
                }
            ),
            None,
        ),
        vol.Optional(
            "parallel_tool_calls",
            description="whether a reply may hold more than one tool call (default false, as "
            "llama.cpp's server: a small model under a grammar may go on calling tools it was "
            "never asked for)",
        ): vol.Any(bool, None),
        vol.Optional(
            "fairlane_speculative",
            description="begin this turn on a guess (a voice client's transcript at the "
            "speaker's first pause): the answer is 202 with the guess's id, and the tokens are "
            "held for the same client's next request if it is the same turn; any other turn, "
            "a newer guess, a cancel or the expiry discards it (its KV freed, its tokens sent "
            "to no one)",
        ): bool,
        vol.Optional(
            "fairlane_words",
            description="a reply in words: it opens with a letter or a digit and holds no "
            "braces, brackets or backticks (a reply to be read or spoken: after a tool's result "
            "the small default model otherwise echoes the result as JSON); only where no other "
            "grammar applies (no response_format, and no tool call possible: tool_choice none "
            "or no tools)",
        ): bool,
        vol.Optional("fairlane_class"): vol.In(PRIORITY_NAMES),
        vol.Optional("priority", description=PRIORITY_FIELD): vol.Any(None, WHOLE, str),
        vol.Optional("deadline_ms", description=DEADLINE_FIELD): vol.Any(None, vol.Coerce(float)),
        vol.Optional(
            "response_format",
            description="text, json_object, or json_schema with json_schema.schema: sampling "
            "is constrained to that JSON (a schema llama.cpp's grammar converter cannot take is "
            "a 400)",
        ): vol.Any(
            {vol.Required("type"): vol.In(["text", "json_object"])},
            {
                vol.Required("type"): "json_schema",
                vol.Required("json_schema"): vol.Schema(
                    {vol.Required("schema"): dict}, extra=vol.ALLOW_EXTRA
                ),
            },
            None,
        ),
    },
    extra=vol.ALLOW_EXTRA,  # other OpenAI fields (penalties, logprobs…) are accepted and ignored
)


@operation(
    "Cancel a running completion or a held guess; its KV is freed at the next iteration",
    errors=(401, 404),
)
async def cancel_completion(request: web.Request) -> web.Response:
    svc = services_of(request)
    completion_id = request.match_info["id"]
    held = svc.speculation
    discarded = (
        held is not None
        and held.holds(completion_id, request.get(CLIENT_TOKEN))
        and held.discard(completion_id)
    )
    if not discarded and not svc.device.cancel(completion_id) and not any(
        lane.cancel(completion_id) for lane in svc.remotes
    ):
        raise ApiError(404, f"no running completion {completion_id!r}", code="not_found")
    return web.json_response({"id": completion_id, "cancelled": True})


# --- chat completions --------------------------------------------------------------------------


@dataclass
class _Turn:
    """One chat completion in flight: its id, queue of token events and measurements."""

    id: str
    queue: asyncio.Queue[TokenEvent]
    prompt_tokens: int
    first: TokenEvent | None = None  # read before the response starts, so it can still fail
    cached_tokens: int = 0  # leading prompt tokens found in the prefix cache

    def usage(self, completion: int) -> dict[str, Any]:
        """OpenAI's usage object, with the prefix cache's share of the prompt."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@operation(
    "Chat completion (SSE with stream: true)",
    ok={
        200: "chat.completion, or text/event-stream of chat.completion.chunk ending in [DONE]",
        202: "with fairlane_speculative: the guess is running ({id, object: "
        "chat.completion.guess, expires_in_s})",
    },
    errors=(400, 401, 413, 429, 502, 503, 504),
    json=CHAT_REQUEST,
    class_header=True,
)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    svc = services_of(request)
    body = await read_json(request)
    template = chat_template(svc)
    priority = request_class(request, body, Priority.CHAT)
    client = body.get("user") or request.headers.get("X-Fairlane-Client") or "anonymous"
    speculative = bool(body.get("fairlane_speculative"))
    if (lane := lane_for(svc, priority)) is not None:
        if speculative:
            raise ApiError(
                400, f"{priority.label} turns run on a remote lane, where a turn cannot be "
                "begun on a guess", param="fairlane_speculative",
            )
        return await remote_chat(request, svc, lane, body, priority, client)
    refuse_early(svc, priority, Kind.LLM)
    if any(isinstance(m.get("content"), list) for m in body["messages"]):
        # Parts may hold files to read (PDFs take a while): off the event loop.
        body["messages"] = await asyncio.to_thread(read_parts, body["messages"], svc.model_name)
    offered = body.get("tools") or []
    # "none": the tools stay in the prompt (the model knows them, and the prefix cache holds
    # the same text as the turn's other calls), but the reply is text, never a call.
    tools = [] if body.get("tool_choice") == "none" else offered
    try:
        prompt_text = template.render(body["messages"], offered or None)
    except ChatTemplateError as err:
        raise ApiError(400, str(err), param="messages") from err
    prompt = await asyncio.to_thread(svc.engine.tokenize_prompt, prompt_text)
    limit = capacity(svc, priority)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    max_tokens = max_tokens or svc.config.llm.max_tokens
    if len(prompt) + 1 > limit:
        raise ApiError(
            400,
            f"the prompt has {len(prompt)} tokens; a {priority.label} request may hold "
            f"{limit} (the context less the prefix cache"
            + (
                " and the share kept free for voice and chat)"
                if limit < svc.engine.capacity
                else ")"
            ),
            param="messages",
            code="context_length_exceeded",
        )
    max_tokens = min(max_tokens, limit - len(prompt))
    stop = body.get("stop")
    if svc.grammars is None:
        svc.grammars = Grammars(svc.engine.grammar_parses)
    grammar = await svc.grammars.output(body.get("response_format"))
    triggers: tuple[str, ...] = ()
    forced = body.get("tool_choice") not in (None, "auto")
    if tools and grammar is None and (template.tagged_tool_calls or forced):
        # A call is spelt as the template writes it back, except where JSON at the start may
        # be the small model's echo of a tool's result (see tool_calls).
        after_result = body["messages"][-1].get("role") == "tool"
        grammar, triggers = await svc.grammars.tools(
            tools, body.get("tool_choice"),
            template_shape=template.tagged_tool_calls and (forced or not after_result),
            parallel=bool(body.get("parallel_tool_calls")),
        )
    if body.get("fairlane_words") and grammar is None and not tools:
        grammar = WORDS_GRAMMAR
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.7 if body.get("temperature") is None else body["temperature"],
        top_p=1.0 if body.get("top_p") is None else body["top_p"],
        top_k=body.get("top_k") or 0,
        seed=body.get("seed"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        grammar=grammar,
        grammar_triggers=triggers,
    )
    loop = asyncio.get_running_loop()

    def admit(request_id: str, deliver: Any) -> Request:
        policy_request = Request(
            request_id,
            Kind.LLM,
            priority,
            client,
            0.0,
            prompt_tokens=len(prompt),
            max_tokens=max_tokens,
            deadline_s=request_deadline(request, body),
        )
        admission = svc.device.submit(
            policy_request,
            lambda: svc.engine.add(request_id, prompt, params),
            LoopSink(loop, deliver),
        )
        if not admission.accepted:
            svc.telemetry.refuse(priority)
            raise refused(admission)
        return policy_request

    speculation = svc.speculation
    # A guess is the token's: another token naming the same `user` cannot claim or discard it.
    owner = Owner(request.get(CLIENT_TOKEN), client)
    key = Speculation.key(prompt_text, params, priority.label, body.get("tool_choice"))
    if speculative:
        if speculation is None:
            raise ApiError(400, "this server holds no guesses", param="fairlane_speculative")
        guess = Guess(f"chatcmpl-{uuid.uuid4().hex}", key, owner)
        guess.cached_tokens = admit(guess.id, guess.deliver).cached_tokens
        speculation.hold(guess)
        return web.json_response(
            {"id": guess.id, "object": "chat.completion.guess", "expires_in_s": speculation.ttl_s},
            status=202,
        )
    claimed = speculation.claim(key, owner) if speculation is not None else None
    if claimed is not None:
        # The guess was this turn: its tokens so far are read at once, the rest as they come;
        # the turn's latency is measured from this request's arrival.
        turn = _Turn(claimed.id, claimed.queue, len(prompt), cached_tokens=claimed.cached_tokens)
        arrival = svc.device.clock()
    else:
        turn = _Turn(f"chatcmpl-{uuid.uuid4().hex}", asyncio.Queue(), len(prompt))
        policy_request = admit(turn.id, turn.queue.put_nowait)
        turn.cached_tokens, arrival = policy_request.cached_tokens, policy_request.arrival
    record = svc.telemetry.begin(
        Kind.LLM, priority, client, len(prompt), arrival, turn.cached_tokens
    )
    try:
        # The first token before the response starts: a turn that fails or expires while it
        # waits gets an HTTP error, not a stream that breaks off.
        turn.first = await _next_event(turn)
        if body["stream"]:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            # A client that goes away mid-stream: `finally` cancels its sequence.
            with contextlib.suppress(ConnectionResetError):
                await _stream(response, svc, turn, record, tools, include_usage)
            return response
        return await _complete(svc, turn, record, tools)
    finally:
        if record.finished_at is None:  # the client went away or the handler failed
            svc.device.cancel(turn.id)
            svc.telemetry.finish(record, svc.device.clock(), outcome="cancelled")


def capacity(svc: Services, priority: Priority) -> int:
    """Prompt + reply tokens one request of this class may hold: the policy's number (the
    context less the prefix cache, in whole blocks; background also leaves the watermark)."""
    return min(svc.engine.capacity, svc.device.policy_for(Kind.LLM).capacity_tokens(priority))


async def _next_event(turn: _Turn) -> TokenEvent:
    if turn.first is not None:
        event, turn.first = turn.first, None
        return event
    event = await turn.queue.get()
    if event.finish_reason and event.finish_reason.startswith("error"):
        raise ApiError(500, f"the engine failed: {event.finish_reason}", kind="server_error")
    if event.finish_reason and event.finish_reason.startswith("deadline"):
        raise deadline_passed(event.finish_reason)
    if event.finish_reason and event.finish_reason.startswith(GRAMMAR_OVER_BUDGET):
        why = event.finish_reason.partition(": ")[2]
        raise ApiError(
            400,
            f"the request's grammar is too slow to sample: {why} (a schema with ambiguous "
            "nested repetitions?); its reply was stopped so that others' are not held up",
            param="response_format",
            code="grammar_too_slow",
        )
    return event


def _finish(svc: Services, record: Any, event: TokenEvent) -> None:
    # A cancelled turn ends its stream cleanly; it is counted as cancelled, not as served.
    outcome = "cancelled" if event.finish_reason == "cancelled" else "finished"
    svc.telemetry.finish(record, svc.device.clock(), outcome=outcome)


async def _complete(svc: Services, turn: _Turn, record: Any, tools: list[Any]) -> web.Response:
    parts: list[str] = []
    while True:
        event = await _next_event(turn)
        if event.finish_reason != "cancelled":
            svc.telemetry.token(record, svc.device.clock())
        parts.append(event.text)
        if event.finish_reason:
            break
    _finish(svc, record, event)
    text = "".join(parts)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish = "stop" if event.finish_reason == "cancelled" else event.finish_reason
    calls = parse_tool_calls(text, tools) if tools else None
    if calls:
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    completion = len(record.token_times)
    return web.json_response(
        {
            "id": turn.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": svc.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": turn.usage(completion),
        }
    )


async def _stream(
    response: web.StreamResponse,
    svc: Services,
    turn: _Turn,
    record: Any,
    tools: list[Any],
    include_usage: bool,
) -> None:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": turn.id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": svc.model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    async def send(payload: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode())

    # SSE as OpenAI streams it:
    #   data: {"choices":[{"delta":{"role":"assistant","content":""}}]}
    #   data: {"choices":[{"delta":{"content":"The"}}]} …
    #   data: {"choices":[{"delta":{},"finish_reason":"stop"}]}
    #   data: [DONE]
    await send(chunk({"role": "assistant", "content": ""}))
    held = ""  # with tools offered, text that may still turn out to be a tool call
    holding = bool(tools)
    while True:
        try:
            event = await _next_event(turn)
        except ApiError as err:  # mid-stream: said in the stream, as OpenAI does
            svc.telemetry.finish(record, svc.device.clock(), outcome="failed")
            await send(err.body())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return
        if event.finish_reason != "cancelled":
            svc.telemetry.token(record, svc.device.clock())
        if holding:
            held += event.text
            holding = may_be_tool_call(held)
            if not holding and held:
                await send(chunk({"content": held}))
        elif event.text:
            await send(chunk({"content": event.text}))
        if event.finish_reason:
            break
    finish = event.finish_reason
    if held and holding:
        calls = parse_tool_calls(held, tools)
        if calls:
            for index, call in enumerate(calls):
                await send(chunk({"tool_calls": [{"index": index, **call}]}))
            finish = "tool_calls"
        else:
            await send(chunk({"content": held}))
    _finish(svc, record, event)
    await send(chunk({}, "stop" if finish == "cancelled" else finish))
    if include_usage:
        completion = len(record.token_times)
        usage = turn.usage(completion)
        await send(
            {
                "id": turn.id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": svc.model_name,
                "choices": [],
                "usage": usage,
            }
        )
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


async def generate(
    svc: Services, messages: list[dict[str, Any]], max_tokens: int, priority: Priority, client: str
) -> str:
    """One LLM turn through the device loop (or the class's remote lane), collected
    (summaries, and other server jobs: durable, so without a waiting limit)."""
    if (lane := lane_for(svc, priority)) is not None:
        return await remote_generate(svc, lane, messages, max_tokens, priority, client)
    assert svc.template is not None
    prompt = await asyncio.to_thread(svc.engine.tokenize, svc.template.render(messages))
    limit = capacity(svc, priority)
    if len(prompt) + max_tokens > limit:
        raise ValueError(
            f"{len(prompt)} prompt tokens and {max_tokens} reply tokens do not fit the "
            f"{limit} tokens a {priority.label} request may hold"
        )
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
    request_id = f"gen-{uuid.uuid4().hex}"
    params = SamplingParams(max_tokens=max_tokens, temperature=0.2, seed=0)
    item = Request(
        request_id,
        Kind.LLM,
        priority,
        client,
        0.0,
        prompt_tokens=len(prompt),
        max_tokens=max_tokens,
        max_wait_s=NO_WAIT_LIMIT,
    )

    sink = LoopSink(loop, queue.put_nowait)
    admission = svc.device.submit(item, lambda: svc.engine.add(request_id, prompt, params), sink)
    if not admission.accepted:
        raise RuntimeError(f"refused: {admission.reason}")
    parts: list[str] = []
    finished = False
    try:
        while not finished:
            event = await queue.get()
            parts.append(event.text)
            finished = event.finish_reason is not None
    finally:
        if not finished:
            svc.device.cancel(request_id)
    if event.finish_reason in ("cancelled",) or str(event.finish_reason).startswith("error"):
        raise RuntimeError(f"generation {event.finish_reason}")
    return "".join(parts).strip()
