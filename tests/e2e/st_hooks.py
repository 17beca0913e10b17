"""schemathesis hooks (loaded through SCHEMATHESIS_HOOKS). Before the
schema is used, its request bodies are pinned to realistic data: `model`
names a model the server really serves, so generated cases get past the
model lookup and into validation and generation in every phase; sizes that
would only make a case slow (`max_tokens`, `n`) get a small maximum. The
fuzzer still sends values outside these bounds in its negative phases."""

import os

import schemathesis

CHAT = os.environ.get("SYNOR_FUZZ_CHAT_MODEL", "")
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
        for field, maximum in MAXIMA.items():
            if field in props:
                props[field]["maximum"] = maximum
