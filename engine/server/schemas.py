"""OpenAI request bodies, checked field by field into dataclasses. Anything we cannot honour is a 400 naming it.

Accepted: every field OpenAI's chat and legacy completions APIs define that changes the output and that the engine
implements (temperature, top_p, seed (-1 = random, as in llama.cpp), stop, max_tokens / max_completion_tokens,
presence and frequency penalties, logit_bias, logprobs / top_logprobs, tools, tool_choice "auto" | "none",
parallel_tool_calls, stream, stream_options), the llama.cpp / vLLM extensions top_k, min_p, repetition_penalty
(alias repeat_penalty), chat_template_kwargs and cache_prompt, and fields without effect on the output (model, user,
metadata, store).
Refused with a 400 naming the field: n > 1, best_of > 1, suffix, response_format other than text, tool_choice
"required" or a named function (they need constrained decoding), echo with logprobs, and any field we do not know.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.sampling import InvalidSamplingParam, SamplingParams

MAX_TOP_LOGPROBS = 20
INERT_FIELDS = frozenset({"model", "user", "metadata", "store", "service_tier"})  # no effect on the output


class RequestError(Exception):
    """A request we refuse; becomes an OpenAI error body with this status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 error_type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        self.message, self.param, self.status, self.error_type, self.code = message, param, status, error_type, code
        self.headers = headers
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape."""
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code if self.code is not None else self.status}}


@dataclass(slots=True)
class GenerationOptions:
    """What to generate and when to stop; shared by both endpoints."""

    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: until a stop token or the end of the context window
    stop: list[str] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # None: off; k: the chosen token's logprob and the k likeliest alternatives
    cache_prompt: bool = True


@dataclass(slots=True)
class ChatRequest:
    """A checked /v1/chat/completions request."""

    messages: list[dict[str, Any]]
    options: GenerationOptions
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool = True
    stream: bool = False
    include_usage: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    model: str | None = None


@dataclass(slots=True)
class CompletionRequest:
    """A checked /v1/completions request; prompt is text or token ids."""

    prompt: str | list[int]
    options: GenerationOptions
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    model: str | None = None


# ---- typed field readers: each names the field in its error ----------------------------------------------------

def _number(body: dict[str, Any], name: str, default: float, low: float = -math.inf, high: float = math.inf) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a number, got {value!r}", name)
    if not low <= value <= high:
        raise RequestError(f"{name} must be between {low:g} and {high:g}, got {value!r}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int | None, low: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}", name)
    if low is not None and value < low:
        raise RequestError(f"{name} must be >= {low}, got {value}", name)
    return value


def _boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be true or false, got {value!r}", name)
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
        raise RequestError("stop must be a non-empty string or a list of up to 16 non-empty strings", "stop")
    return stops


def _logit_bias(body: dict[str, Any], vocab_size: int) -> dict[int, float]:
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError("logit_bias must be an object mapping token ids to biases", "logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise RequestError(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < vocab_size:
            raise RequestError(f"logit_bias token {token} is outside the vocabulary (0..{vocab_size - 1})",
                               "logit_bias")
        out[token] = _number({"logit_bias": bias}, "logit_bias", 0.0, -100.0, 100.0)
    return out


def _stream_options(body: dict[str, Any], is_stream: bool) -> bool:
    value = body.get("stream_options")
    if value is None:
        return False
    if not is_stream:
        raise RequestError("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(value, dict) or set(value) - {"include_usage"}:
        raise RequestError("stream_options supports only include_usage", "stream_options")
    return _boolean(value, "include_usage", False)


def _seed(body: dict[str, Any]) -> int | None:
    """The seed; -1 is llama.cpp's "random seed", the same as none."""
    seed = _integer(body, "seed", None, low=-1)
    return None if seed == -1 else seed


def _sampling(body: dict[str, Any]) -> SamplingParams:
    top_k = _integer(body, "top_k", 0, low=-1)
    if "repeat_penalty" in body and "repetition_penalty" in body:
        raise RequestError("give repetition_penalty or its alias repeat_penalty, not both", "repeat_penalty")
    penalty_name = "repeat_penalty" if "repeat_penalty" in body else "repetition_penalty"
    try:
        return SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0),
            top_k=max(top_k or 0, 0),  # -1 means off (vLLM), as 0 does (llama.cpp)
            top_p=_number(body, "top_p", 1.0),
            min_p=_number(body, "min_p", 0.0),
            seed=_seed(body),
            presence_penalty=_number(body, "presence_penalty", 0.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0),
            repetition_penalty=_number(body, penalty_name, 1.0),
        )
    except InvalidSamplingParam as exc:
        raise RequestError(str(exc), exc.param) from None


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """400 for fields that would change the output in ways the engine does not implement."""
    if _integer(body, "n", 1, low=1) != 1:
        raise RequestError("n > 1 is not supported: this server generates one choice per request", "n")
    if _integer(body, "best_of", 1, low=1) != 1:
        raise RequestError("best_of > 1 is not supported", "best_of")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise RequestError("response_format other than {\"type\": \"text\"} is not supported (no constrained "
                           "decoding)", "response_format")


def _common(body: dict[str, Any], vocab_size: int, max_tokens_default: int | None) -> GenerationOptions:
    _refuse_unsupported(body)
    max_tokens = _integer(body, "max_tokens", max_tokens_default, low=1)
    max_tokens = _integer(body, "max_completion_tokens", max_tokens, low=1)
    return GenerationOptions(params=_sampling(body), max_tokens=max_tokens, stop=_stop(body),
                             logit_bias=_logit_bias(body, vocab_size),
                             cache_prompt=_boolean(body, "cache_prompt", True))


def _check_known(body: Any, known: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - known - INERT_FIELDS)
    if unknown:
        raise RequestError(f"unrecognized request argument supplied: {unknown[0]}", unknown[0])
    return body


SAMPLING_FIELDS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "repeat_penalty", "stop", "max_tokens", "max_completion_tokens", "n", "best_of", "logit_bias", "logprobs",
    "stream", "stream_options", "response_format", "cache_prompt",
})
CHAT_FIELDS = SAMPLING_FIELDS | {"messages", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs",
                                 "chat_template_kwargs"}
COMPLETION_FIELDS = SAMPLING_FIELDS | {"prompt", "echo", "suffix"}

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object", where)
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}", f"{where}.role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise RequestError(f"{where}.content must be a string, a list of parts or null", f"{where}.content")
        # "developer" is OpenAI's newer name for the system role; templates know only "system"
        out.append({**message, "role": "system" if role == "developer" else role})
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", f"tools[{i}]")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"tools[{i}].function.name must be a non-empty string", f"tools[{i}].function.name")
        if not isinstance(function.get("parameters", {}), dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               f"tools[{i}].function.parameters")
    return tools or None


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools the model is offered after tool_choice: all of them ("auto") or none ("none")."""
    choice = body.get("tool_choice")
    if choice is None or choice == "auto":
        return tools
    if choice == "none":
        return None
    raise RequestError(f"tool_choice {choice!r} is not supported: only \"auto\" and \"none\" (forcing a call needs "
                       "constrained decoding)", "tool_choice")


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    wanted = _boolean(body, "logprobs", False)
    top = _integer(body, "top_logprobs", None, low=0)
    if top is not None and not wanted:
        raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
    if top is not None and top > MAX_TOP_LOGPROBS:
        raise RequestError(f"top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {top}", "top_logprobs")
    return (top or 0) if wanted else None


def parse_chat_request(body: Any, vocab_size: int) -> ChatRequest:
    """A checked chat request, or RequestError naming the first field at fault."""
    body = _check_known(body, CHAT_FIELDS)
    options = _common(body, vocab_size, None)
    options.logprobs = _chat_logprobs(body)
    stream = _boolean(body, "stream", False)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    model = body.get("model")
    return ChatRequest(
        messages=_messages(body), options=options, tools=_tool_choice(body, _tools(body)),
        parallel_tool_calls=_boolean(body, "parallel_tool_calls", True), stream=stream,
        include_usage=_stream_options(body, stream), template_kwargs=kwargs,
        model=model if isinstance(model, str) else None,
    )


def _prompt(body: dict[str, Any], vocab_size: int) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(f"prompt token {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", "prompt")
        return list(prompt)
    raise RequestError("prompt must be a string, a list of token ids, or a list holding one of those (batches of "
                       "several prompts are not supported)", "prompt")


def parse_completion_request(body: Any, vocab_size: int) -> CompletionRequest:
    """A checked legacy completions request, or RequestError naming the first field at fault."""
    body = _check_known(body, COMPLETION_FIELDS)
    if body.get("suffix"):
        raise RequestError("suffix (fill-in-the-middle) is not supported", "suffix")
    options = _common(body, vocab_size, 16)  # OpenAI's default for this endpoint
    logprobs = _integer(body, "logprobs", None, low=0)
    if logprobs is not None and logprobs > MAX_TOP_LOGPROBS:
        raise RequestError(f"logprobs must be at most {MAX_TOP_LOGPROBS}, got {logprobs}", "logprobs")
    options.logprobs = logprobs
    echo = _boolean(body, "echo", False)
    if echo and logprobs is not None:
        raise RequestError("echo together with logprobs is not supported (no logprobs for prompt tokens)", "echo")
    stream = _boolean(body, "stream", False)
    model = body.get("model")
    return CompletionRequest(prompt=_prompt(body, vocab_size), options=options, echo=echo, stream=stream,
                             include_usage=_stream_options(body, stream),
                             model=model if isinstance(model, str) else None)


def parse_tokenize_request(body: Any) -> tuple[str, bool, bool, bool]:
    """(content, add_special, parse_special, with_pieces) of a llama.cpp-style /tokenize request."""
    body = _check_known(body, frozenset({"content", "add_special", "parse_special", "with_pieces"}))
    content = body.get("content")
    if not isinstance(content, str):
        raise RequestError("content must be a string", "content")
    return (content, _boolean(body, "add_special", False), _boolean(body, "parse_special", True),
            _boolean(body, "with_pieces", False))


def parse_detokenize_request(body: Any, vocab_size: int) -> list[int]:
    """The token ids of a /detokenize request."""
    body = _check_known(body, frozenset({"tokens"}))
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise RequestError("tokens must be a list of token ids", "tokens")
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"token {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", "tokens")
    return tokens

