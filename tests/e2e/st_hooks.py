"""schemathesis hooks (loaded through SCHEMATHESIS_HOOKS). Before the
schema is used, its request bodies are pinned to realistic data: `model`
names a model the server really serves, so generated cases get past the
model lookup and into validation and generation in every phase; sizes that
would only make a case slow (`max_tokens`, `n`) get a small maximum. The
fuzzer still sends values outside these bounds in its negative phases."""

import os

import schemathesis

CHAT = os.environ.get("SYNOR_FUZZ_CHAT_MODEL", "")
# Where to record answers that leak internals (backtraces, the server's
# own paths); the test reads it back.
LEAKS = os.environ.get("SYNOR_FUZZ_LEAKS", "")
SECRETS = [s for s in os.environ.get("SYNOR_FUZZ_SECRETS", "").split(os.pathsep) if s]
LEAK_MARKS = ["stack backtrace", "panicked at", "RUST_BACKTRACE", "/rustc/", ".cargo/registry", *SECRETS]
EMBED = os.environ.get("SYNOR_FUZZ_EMBED_MODEL", "")
MAXIMA = {"max_tokens": 8, "max_completion_tokens": 8, "n": 2, "top_logprobs": 3}
REQUESTS = {"ChatCompletionRequest": CHAT, "CompletionRequest": CHAT, "EmbeddingRequest": EMBED}


@schemathesis.hook
def before_load_schema(context, raw_schema):
    schemas = raw_schema.get("components", {}).get("schemas", {})
    for name, model in REQUESTS.items():
        props = schemas.get(name, {}).get("properties", {})
        if model and "model" in props:
            props["model"] = {"type": "string", "enum": [model]}
        if name == "EmbeddingRequest" and "dimensions" in props:
            props["dimensions"] = {"type": "integer", "enum": [384]}  # MiniLM's size
        for field, maximum in MAXIMA.items():
            if field in props:
                props[field]["maximum"] = maximum


@schemathesis.hook
def map_body(context, body):
    """Repairs, in generated bodies, what no schema can say: a prompt is not
    empty, embeddings have the model's own dimensions, top_logprobs
    needs logprobs, a message needs content, response_format needs a type;
    and bounds the length of the answer.
    (Only the fuzzing phase maps bodies; the coverage phase still sends the
    unrepaired, invalid variants.)"""
    if not isinstance(body, dict):
        return body
    if body.get("prompt") == "":
        body["prompt"] = "Hello"
    if "input" in body and body.get("dimensions") not in (None, 384):
        body.pop("dimensions")  # MiniLM has exactly 384
    if not isinstance(body.get("messages"), list):
        return body
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 8  # the default (the whole context) is slow
    if body.get("logprobs") is not True:
        body.pop("top_logprobs", None)
    for m in body["messages"]:
        if isinstance(m, dict) and not m.get("content"):
            m["content"] = "Hello"
            m.pop("tool_calls", None)
    if isinstance(body.get("response_format"), dict) and "type" not in body["response_format"]:
        body.pop("response_format")
    return body


@schemathesis.hook
def after_call(context, case, response):
    """Records every answer that shows internals: a backtrace, a panic, a
    source path or the server's own directories (the models directory)."""
    if not LEAKS:
        return
    text = getattr(response, "text", None)
    if text is None:
        text = bytes(getattr(response, "content", b"") or b"").decode("utf-8", "replace")
    with open(LEAKS, "a") as f:
        f.write("CALL\n")
        for mark in LEAK_MARKS:
            if mark in text:
                f.write(f"LEAK {case.method} {case.path}: {mark!r} in {text[:300]!r}\n")
