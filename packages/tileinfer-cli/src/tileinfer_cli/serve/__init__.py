"""``tileinfer serve``: an OpenAI-compatible HTTP server on the batched engine (the ``serve`` extra:
Starlette, uvicorn, pydantic, prometheus-client).

One concept per module:

    command.py    the subcommand's options and its run(): load, build the engine, serve
    loading.py    the served model: its tokenizer, template and defaults; its weights (a folder's,
                  or random ones of its shape: dummy)
    engine_build.py  the engine: in a process of its own (EngineProcess) or on a thread
    strict.py     the requests' base model: unknown fields and values of another JSON type refused
    schemas.py    pydantic models of the requests
    responses.py  pydantic models of the answers, chunks and model cards
    responses_request.py  a /v1/responses request (OpenAI's Responses API) and the chat
                  request it amounts to
    responses_format.py   its answer: the response object, or its stream of events
    responses_store.py    the responses kept in memory (previous_response_id, GET, DELETE)
    embeddings.py /v1/embeddings: its request, its plan and its answer
    ollama_request.py  ollama's /api/chat, /api/generate and /api/embed requests, and the
                  OpenAI-shaped requests they amount to
    ollama_format.py   their answers: one object, or newline-delimited JSON
    defaults.py   the sampling defaults (generation_config.json's, else OpenAI's)
    template.py   the chat template, and a request's messages and tools as its input
    effort.py     reasoning_effort as the template's enable_thinking
    tools.py      a request's tools and tool_choice
    tool_parsers.py  tool calls in a model's answer, per format (llama3, qwen3, mistral)
    tool_output.py   an answer's tool calls: ids, the whole message, the stream's deltas
    tool_grammar.py  the grammar that holds an answer to a tool call (tool_choice "required"
                     or a named function)
    structured.py response_format, structured_outputs and guided_*, compiled
    validation.py a request body -> its pydantic model, or one 400 naming the parameter
    prepare.py    a validated request -> prompt ids and engine arguments (checks, 400s)
    tokenizing.py /tokenize and /detokenize
    bridge.py     the engine's step loop handing each step's outputs to the asyncio loop
    jobs.py       one HTTP request's choices: detokenizing, stop strings, events to await
    text.py       a choice's incremental text (no split UTF-8 characters, stop strings)
    chunks.py     SSE chunks and final responses as JSON
    logprobs.py   token log-probabilities in the chat and completions shapes
    routes.py     the endpoints
    app.py        the Starlette app: routes, errors, the API key and body-size guard, CORS,
                  lifespan
    errors.py     OpenAI-shaped errors
    metrics.py    the Prometheus metrics

Nothing here is imported by ``tileinfer --help``: main.py imports ``command`` only, which imports
the rest when the command runs.
"""
